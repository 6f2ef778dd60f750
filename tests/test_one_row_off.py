"""A non-finite allowance never passes, and no property has a blind spot for a small error: for
every property, a layer 1 % off on one row under the property's own trigger fails it with a
finite allowance (tests/fixtures/one_row_off.py)."""

from __future__ import annotations

import math

import pytest

from mha_verify.properties.engine import profiles
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.targets.eager import load_target

pytestmark = pytest.mark.deep  # one property run per property (tox -e deep)

FIXTURE = "tests/fixtures/one_row_off.py:"

# property -> the layer of the fixture that is 1 % off where the property looks
AUDIT = {
    "oracle_agreement": "Always",
    "head_split": "Always",
    "grad_agreement": "Always",
    "query_permutation": "Always",
    "key_permutation": "FirstKeyFirst",
    "batch_independence": "WhenBatched",
    "inference_mode_agreement": "UnderInferenceMode",
    "train_mode_agreement": "InTrainingMode",
    "dropout_off_in_eval": "WithDropoutSet",
    "bool_equals_additive": "WithFloatMask",
    "mask_broadcast": "WithBatchedMask",
    "layout_independence": "OnViews",
    "determinism": "EverySecondCall",
    "no_future_leak": "LastValueLeaks",
    "prefix_consistency": "LastValueLeaks",
    "masked_kv_invariance": "MaskedValuesLeak",
    "masked_grad_zero": "MaskedValuesGetGradient",
    "fully_masked_rows": "FullyMaskedRowsOff",
    "rows_sum_to_one": "WeightsRowOff",
    "mask_zeroes_weights": "MaskedWeightsOff",
    "gradcheck": "GradientRowOff",
    "window_locality": "WindowLeaks",
    "dropout_statistics": "InTrainingWithDropout",
    "decode_consistency": "tests/fixtures/cached_layers.py:OneRowOffWhenCached",
    "eager_vs_sdpa": "OnItsEagerPath",
}
# the properties whose verdict is not a comparison within an allowance
NO_ALLOWANCE = {
    "lk_equals_lv": "whether a call with Lk != Lv raises",
    "finite_large_inputs": "whether the output is finite",
}


@pytest.mark.serial
def test_every_property_is_audited() -> None:
    assert set(AUDIT) | set(NO_ALLOWANCE) == set(all_properties())


@pytest.mark.serial
@pytest.mark.parametrize("prop", list(AUDIT))
def test_a_layer_one_percent_off_on_one_row_fails(prop: str) -> None:
    layer = AUDIT[prop] if ":" in AUDIT[prop] else FIXTURE + AUDIT[prop]
    result = run_property(all_properties()[prop], load_target(layer),
                          settings=profiles.PROFILES["ci"])
    assert result.verdict == "fail", result
    assert result.allowed is not None and math.isfinite(result.allowed), result
    assert result.reason and not result.reason.startswith("the target raised"), result.reason
