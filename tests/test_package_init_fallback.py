"""A target ``pkg.mod:Class`` whose package ``__init__`` fails to import (vit-pytorch's imports torchvision)
is imported with its parents' ``__init__`` skipped; where the module fails by itself, the package's error is
reported, with how to get torchvision's CPU build (``properties.loading``)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mha_verify.properties.loading import load_attr
from mha_verify.properties.protocol import TargetError


@pytest.fixture
def library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A package ``brokenlib`` whose __init__ imports torchvision (absent), with a layer module that
    imports a sibling relatively, and one that imports torchvision itself."""
    pkg = tmp_path / "brokenlib"
    (pkg / "layers").mkdir(parents=True)
    (pkg / "__init__.py").write_text("import torchvision_absent_here as torchvision  # noqa\n")
    (pkg / "layers" / "__init__.py").write_text("from brokenlib.layers.attn import Attention  # noqa\n")
    (pkg / "layers" / "common.py").write_text("WIDTH = 8\n")
    (pkg / "layers" / "attn.py").write_text("from .common import WIDTH\n\nclass Attention:\n    width = WIDTH\n")
    (pkg / "layers" / "vision.py").write_text("import torchvision_absent_here  # noqa\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield pkg
    for name in [n for n in sys.modules if n == "brokenlib" or n.startswith("brokenlib.")]:
        del sys.modules[name]


def test_a_layer_under_a_package_that_fails_to_import_is_loaded_with_its_siblings(
        library: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cls = load_attr("brokenlib.layers.attn:Attention")
    assert cls.width == 8  # type: ignore[attr-defined]  # its relative import of a sibling resolved
    err = capsys.readouterr().err
    assert "importing 'brokenlib.layers.attn' failed" in err and "__init__ skipped" in err


def test_a_module_that_fails_by_itself_reports_the_packages_error(library: Path) -> None:
    with pytest.raises(TargetError, match=r"cannot import 'brokenlib\.layers\.vision': ModuleNotFoundError"):
        load_attr("brokenlib.layers.vision:Anything")


def test_a_torchvision_failure_says_how_to_get_its_cpu_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "needs_tv.py").write_text("raise ModuleNotFoundError(\"No module named 'torchvision'\")\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(TargetError, match=r"torchvision for torch 2\.13 is a CUDA build .* --index-url "
                                              r"https://download\.pytorch\.org/whl/cpu"):
            load_attr("needs_tv:Layer")
    finally:
        sys.modules.pop("needs_tv", None)
