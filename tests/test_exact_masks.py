"""A layer that accepts its mask in one exact shape gets it in that shape, read from the size it
compares against: (B, 1, Lq, Lk) or the heads folded into the batch, (B * H, Lq, Lk); a layer
that unfolds the heads in the wrong order fails."""

from __future__ import annotations

import pytest

from mha_verify.properties.engine import profiles
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.targets.eager import load_target
from tests.conftest import assert_verdict

FIXTURE = "tests/fixtures/exact_masks.py:"


@pytest.mark.deep
@pytest.mark.parametrize(("layer", "shape", "verdict"), [
    ("ExactB1LL", "shaped (B, 1, Lq, Lk) exactly", "pass"),
    ("ExactHeadsInBatch", "shaped (B * H, Lq, Lk)", "pass"),
    ("HeadsInBatchHeadMajor", "shaped (B * H, Lq, Lk)", "fail"),
])
def test_a_mask_of_one_exact_shape_is_passed_in_it(layer: str, shape: str, verdict: str) -> None:
    target = load_target(FIXTURE + layer)
    assert shape in target.build(8, 2).conventions.describe()
    result = run_property(all_properties()["oracle_agreement"], target, settings=profiles.PROFILES["quick"], seed=0)
    assert_verdict(result, verdict, 10)
    if verdict == "fail":
        assert not (result.reason or "").startswith("the target raised"), result.reason
