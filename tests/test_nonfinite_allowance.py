"""A non-finite allowance never passes: a target declaring NaN on fully masked rows is still held
to the derived tolerance on every row where the oracle is finite."""

from __future__ import annotations

import pytest

from mha_verify.properties.engine import profiles
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.targets.eager import load_target

FIXTURE = "tests/fixtures/nan_declaring.py:"


@pytest.mark.deep
@pytest.mark.parametrize(("layer", "prop"), [("OffUnderInferenceMode", "inference_mode_agreement"),
                                             ("OffInTrainingMode", "train_mode_agreement")])
def test_a_nan_declaring_layer_off_in_one_mode_fails(layer: str, prop: str) -> None:
    result = run_property(all_properties()[prop], load_target(FIXTURE + layer), settings=profiles.PROFILES["quick"])
    assert result.verdict == "fail", result
    assert result.allowed is not None and result.allowed == result.allowed, result  # a number, never NaN
    # the layer is exact on every call without a fully masked row: the counterexample has a mask
    assert result.counterexample and "no mask" not in result.counterexample, result


@pytest.mark.parametrize("prop", ["inference_mode_agreement", "train_mode_agreement"])
def test_torch_mha_is_held_to_a_finite_allowance(prop: str) -> None:
    result = run_property(all_properties()[prop], load_target("torch.nn:MultiheadAttention"),
                          settings=profiles.PROFILES["quick"])
    assert result.verdict in ("pass", "declared"), result
    ratios = result.details["error_ratios"]
    assert isinstance(ratios, list) and ratios and all(r != "nan" for r in ratios), ratios
