"""A layer wrapping one torch.nn.MultiheadAttention and handing it its masks (speechbrain's writing,
tests/fixtures/wrapped_mha_layers.py) is verified with the inner layer's weights under torch's mask
convention, through the wrapper; its twin that hands values as keys fails; a wrapper adding its input back
is not read as the wrapped layer."""

from __future__ import annotations

import pytest

from mha_verify.properties.engine.profiles import PROFILES
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.protocol import TargetError
from mha_verify.properties.targets.eager import load_target

FIXTURE = "tests/fixtures/wrapped_mha_layers.py:"


def _verdicts(name: str, checks: tuple[str, ...]) -> dict[str, str]:
    target = load_target(FIXTURE + name)
    return {c: run_property(all_properties()[c], target, settings=PROFILES["quick"], seed=0).verdict for c in checks}


@pytest.mark.deep
def test_a_wrapper_handing_its_masks_to_torch_mha_is_verified_through_it() -> None:
    target = load_target(FIXTURE + "SpeechWrapper")
    assert target.built_as == "SpeechWrapper(nhead=2, d_model=8)"
    conv = target.build(8, 2).conventions
    assert "adapter wrapped_torch_mha" in "; ".join(conv.notes) and conv.cross_attention
    assert conv.layout == "batch_first" and conv.fully_masked == "nan"
    checks = ("oracle_agreement", "head_split", "bool_equals_additive", "masked_kv_invariance", "key_permutation",
              "dropout_statistics")
    assert set(_verdicts("SpeechWrapper", checks).values()) == {"pass"}


@pytest.mark.deep
def test_a_wrapper_handing_values_as_keys_fails() -> None:
    assert _verdicts("SpeechWrapperKeysForValues", ("oracle_agreement",)) == {"oracle_agreement": "fail"}


def test_a_wrapper_adding_its_input_back_is_not_read_as_the_wrapped_layer() -> None:
    with pytest.raises(TargetError, match="no adapter recognizes SpeechWrapperResidual"):
        load_target(FIXTURE + "SpeechWrapperResidual")
