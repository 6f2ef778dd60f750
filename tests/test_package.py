"""Package metadata: one version, a py.typed marker, and every package under the mha_verify namespace."""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import mha_verify
from tests.source_modules import ROOT, source_modules, unlisted_packages


def test_the_installed_version_is_mha_verify_version() -> None:
    assert importlib.metadata.version("mha-verify") == mha_verify.__version__


def test_installed_package_is_typed() -> None:
    assert importlib.resources.files("mha_verify").joinpath("py.typed").is_file(), "mha_verify ships no py.typed"


def test_every_folder_of_python_files_is_a_listed_package() -> None:
    """pyproject lists packages by hand: a new subpackage left off the list would be left out of the
    wheel, and its importers would fail only where the package is installed."""
    assert not unlisted_packages(), unlisted_packages()


def _wheel_modules(wheel: Path) -> list[str]:
    names = zipfile.ZipFile(wheel).namelist()
    return [n.removesuffix(".py").replace("/", ".").removesuffix(".__init__") for n in names if n.endswith(".py")]


def _build_sdist(out: Path) -> Path:
    """The sdist of the repository, built as pip builds one."""
    proc = subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                           "print(b.build_sdist(sys.argv[1]))", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (sdist,) = out.glob("mha_verify-*.tar.gz")
    return sdist


def _unit_count(folder: Path) -> int:
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "unit",
                           "-p", "no:cacheprovider"], cwd=folder, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    match = re.search(r"^(\d+)/\d+ tests collected", proc.stdout, re.M)
    assert match, proc.stdout[-2000:]
    return int(match.group(1))


#: tracked files the sdist leaves out: the repository's own plumbing, which no test reads
NOT_SHIPPED = {".ci/run", ".gitignore"}


def _tracked() -> list[str]:
    proc = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        pytest.skip(f"not a git checkout ({proc.stderr.strip()[:200]}): nothing to compare the sdist with")
    return [name for name in proc.stdout.split("\0") if name]


@pytest.mark.deep
def test_the_sdist_is_the_checkout_and_collects_its_unit_tier(tmp_path: Path) -> None:
    """An unpacked sdist is a project that tests itself: it holds every file of the checkout, byte for byte
    (the tests with their fixtures, the docs whose commands they check, the constraints and tox.ini they
    read, the benchmarks they name), less the repository's plumbing, and pytest collects the same unit
    tests there as here. The unit tier the checkout passes is then the one the sdist runs."""
    with tarfile.open(_build_sdist(tmp_path / "sdist")) as tar:
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(tmp_path / "unpacked", **safe)
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    tracked = _tracked()
    shipped = [n for n in tracked if n not in NOT_SHIPPED]
    missing = sorted(n for n in shipped if not (unpacked / n).is_file())
    assert not missing, f"tracked files missing from the sdist: {missing}"
    changed = sorted(n for n in shipped if (unpacked / n).read_bytes() != (ROOT / n).read_bytes())
    assert not changed, f"files that differ in the sdist: {changed}"
    assert set(NOT_SHIPPED) <= set(tracked), f"NOT_SHIPPED names files the checkout no longer has: {NOT_SHIPPED}"
    assert _unit_count(unpacked) == _unit_count(ROOT)


@pytest.mark.serial
@pytest.mark.deep
def test_the_wheel_and_the_sdist_hold_every_module_once(tmp_path: Path) -> None:
    """The sdist holds each source file once, as a plain file (no links); the wheel built from that
    sdist (as pip builds one) and the wheel built from the tree each hold every module once, under
    mha_verify only, with py.typed and the version."""
    expected = sorted(source_modules())
    sdist = _build_sdist(tmp_path / "sdist")
    with tarfile.open(sdist) as tar:
        members = tar.getmembers()
        links = [m.name for m in members if m.issym() or m.islnk()]
        assert not links, f"the sdist carries links: {links}"
        names = [m.name.split("/", 1)[1] for m in members if m.isfile()]
        assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
        missing = sorted(str(p.relative_to(ROOT)) for p in source_modules().values()
                         if str(p.relative_to(ROOT)) not in names)
        assert not missing, f"source files missing from the sdist: {missing}"
        # the "data" filter where this Python has it (3.11.4 on; Debian's 3.11.2 lacks it): the links
        # it would refuse are already asserted absent above
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(tmp_path / "unpacked", **safe)
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    for source, out in ((ROOT, tmp_path / "tree"), (unpacked, tmp_path / "from_sdist")):
        proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                               "-w", str(out), str(source)], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        (wheel,) = out.glob("mha_verify-*.whl")
        assert wheel.name.startswith(f"mha_verify-{mha_verify.__version__}-"), wheel.name
        modules = _wheel_modules(wheel)
        assert sorted(modules) == expected, (sorted(set(expected) - set(modules)), sorted(set(modules) - set(expected)))
        assert len(modules) == len(set(modules))
        assert "mha_verify/py.typed" in zipfile.ZipFile(wheel).namelist()


@pytest.mark.serial
@pytest.mark.deep
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
