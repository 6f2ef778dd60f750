"""Package metadata: one version, and a py.typed marker in every package we install."""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import mha_verify

PACKAGES = ("mha", "properties", "export", "mha_verify")
ROOT = Path(__file__).resolve().parent.parent


def test_the_installed_version_is_mha_verify_version() -> None:
    assert importlib.metadata.version("mha-verify") == mha_verify.__version__


@pytest.mark.parametrize("package", PACKAGES)
def test_installed_package_is_typed(package: str) -> None:
    assert importlib.resources.files(package).joinpath("py.typed").is_file(), f"{package} ships no py.typed"


@pytest.mark.slow
def test_the_wheel_ships_py_typed_and_the_version(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (wheel,) = tmp_path.glob("mha_verify-*.whl")
    assert wheel.name.startswith(f"mha_verify-{mha_verify.__version__}-"), wheel.name
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [p for p in PACKAGES if f"{p}/py.typed" not in names]
    assert not missing, f"py.typed missing from the wheel for {missing}"
