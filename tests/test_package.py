"""Package metadata: one version, a py.typed marker, and every package under the mha_verify namespace."""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import mha_verify

SUBPACKAGES = ("mha", "properties", "export")
ROOT = Path(__file__).resolve().parent.parent


def test_the_installed_version_is_mha_verify_version() -> None:
    assert importlib.metadata.version("mha-verify") == mha_verify.__version__


def test_installed_package_is_typed() -> None:
    assert importlib.resources.files("mha_verify").joinpath("py.typed").is_file(), "mha_verify ships no py.typed"


@pytest.mark.deep
@pytest.mark.slow
def test_the_wheel_ships_py_typed_and_the_version(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (wheel,) = tmp_path.glob("mha_verify-*.whl")
    assert wheel.name.startswith(f"mha_verify-{mha_verify.__version__}-"), wheel.name
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "mha_verify/py.typed" in names
    # the folders mha/, properties/, export/ install inside mha_verify, never at the top level
    tops = {n.split("/")[0] for n in names if not n.startswith("mha_verify-")}
    assert tops == {"mha_verify"}, tops
    for sub in SUBPACKAGES:
        assert f"mha_verify/{sub}/__init__.py" in names, f"mha_verify.{sub} missing from the wheel"


@pytest.mark.deep
@pytest.mark.slow
def test_a_user_project_with_its_own_properties_and_export_modules(tmp_path: Path) -> None:
    """A project whose own modules are named properties.py and export.py keeps them, and the plugin
    still runs the suite against its layer: our packages live under mha_verify only."""
    (tmp_path / "properties.py").write_text("WHO = 'user'\n")
    (tmp_path / "export.py").write_text("WHO = 'user export'\n")
    (tmp_path / "mha.py").write_text("WHO = 'user mha'\n")
    (tmp_path / "layer.py").write_text((ROOT / "tests" / "fixtures" / "seed_001.py").read_text())
    (tmp_path / "test_own.py").write_text(
        "import export\nimport mha\nimport properties\n\n\n"
        "def test_own_modules():\n"
        "    assert (properties.WHO, export.WHO, mha.WHO) == ('user', 'user export', 'user mha')\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--mha-target", "layer.py:MultiHeadAttention",
         "--mha-profile", "quick", "-k", "own_modules or batch_independence or oracle_agreement"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert "INTERNALERROR" not in out, out
    assert proc.returncode == 0, out
    assert "3 passed" in out, out
