"""A library that imports torchvision at module level for what its attention layers never use (vit-pytorch's
LeViT-JEPA transforms, open_clip's utilities) is imported with torchvision standing in, said on stderr: its
layers are verified; a layer that does call torchvision fails there, naming the stand-in; and the stand-ins
leave sys.modules once the import is done."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from mha_verify.properties.engine.profiles import PROFILES
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.protocol import TargetError
from mha_verify.properties.stand_ins import StandIn
from mha_verify.properties.targets.eager import load_target

LAYERS = '''
from torchvision.ops.misc import FrozenBatchNorm2d  # imported at module level, never used by the layer
from torchvision import transforms as T
import torchvision
from mha_verify.mha import MultiHeadAttention


class FIDInception(torchvision.models.inception.InceptionA):
    """A class of the module subclasses a torchvision class (pytorch-fid's, which denoising-diffusion-pytorch
    imports): the module still imports; building it raises, naming the stand-in."""


class Attention(MultiHeadAttention):
    """The reference layer, in a module that imports torchvision."""


class Preprocessing(MultiHeadAttention):
    """Calls torchvision in its forward: it fails there."""

    def forward(self, q, k, v, mask=None, need_weights=False):
        T.Normalize(0.5, 0.5)
        return super().forward(q, k, v, mask, need_weights)
'''


@pytest.fixture()
def visionlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    package = tmp_path / "visionlib_standin"
    package.mkdir()
    (package / "__init__.py").write_text("from torchvision import transforms\n")
    (package / "layers.py").write_text(textwrap.dedent(LAYERS))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "torchvision", None)  # as if its wheel did not load (None: import fails)
    yield
    for name in [n for n in sys.modules if n.startswith("visionlib_standin")]:
        del sys.modules[name]


@pytest.mark.usefixtures("visionlib")
def test_a_layer_in_a_module_importing_torchvision_is_verified_with_stand_ins(
        capsys: pytest.CaptureFixture[str]) -> None:
    target = load_target("visionlib_standin.layers:Attention")
    assert "it was imported with torchvision, torchaudio as stand-ins that raise when called" in capsys.readouterr().err
    result = run_property(all_properties()["oracle_agreement"], target, settings=PROFILES["quick"], seed=0)
    assert result.verdict == "pass" and result.examples > 0
    layers = sys.modules["visionlib_standin.layers"]
    assert isinstance(layers.FrozenBatchNorm2d, StandIn)
    assert not isinstance(sys.modules.get("torchvision"), StandIn)  # the stand-ins left sys.modules


@pytest.mark.usefixtures("visionlib")
def test_a_layer_that_calls_torchvision_fails_there_naming_the_stand_in() -> None:
    with pytest.raises(TargetError, match=r"raised RuntimeError: torchvision\.transforms\.Normalize is a stand-in"):
        load_target("visionlib_standin.layers:Preprocessing")


@pytest.mark.usefixtures("visionlib")
def test_a_class_subclassing_a_stand_in_imports_and_raises_when_built() -> None:
    load_target("visionlib_standin.layers:Attention")  # the module's subclass of a stand-in does not stop the import
    layers = sys.modules["visionlib_standin.layers"]
    with pytest.raises(RuntimeError, match=r"torchvision\.models\.inception\.InceptionA is a stand-in"):
        layers.FIDInception()
