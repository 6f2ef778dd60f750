"""A stable softmax written out (speechbrain's BEATs layer: scores shifted by their row's max over every key,
masked ones too, before the mask; tests/fixtures/shifted_scores_layers.py): a masked key reaches the output
and its gradient through that shift's rounding alone, which the mask checks say as a precision policy with
the line quoted, not as a FAIL; a twin whose masked keys keep a weight still fails them."""

from __future__ import annotations

import pytest

from mha_verify.properties.engine.profiles import PROFILES
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.targets.eager import load_target

FIXTURE = "tests/fixtures/shifted_scores_layers.py:"
CHECKS = ("masked_kv_invariance", "masked_grad_zero", "oracle_agreement")


def _results(name: str) -> dict[str, tuple[str, str | None]]:
    target = load_target(FIXTURE + name)
    out = {}
    for check in CHECKS:
        result = run_property(all_properties()[check], target, settings=PROFILES["quick"], seed=0)
        out[check] = (result.verdict, result.kind)
    return out


def test_the_shift_is_read_and_its_rounding_is_a_precision_policy_not_a_fail() -> None:
    conv = load_target(FIXTURE + "ShiftedScores").build(8, 2).conventions
    assert conv.shifted_scores == "attn_weights - attn_weights.max(dim=-1, keepdim=True)"
    results = _results("ShiftedScores")
    assert all(verdict in ("pass", "finding") for verdict, _ in results.values()), results
    assert all(kind in (None, "precision_policy") for _, kind in results.values()), results
    assert results["oracle_agreement"] == ("pass", None)


@pytest.mark.deep
def test_masked_keys_that_keep_a_weight_still_fail_the_mask_checks() -> None:
    results = _results("ShiftedScoresFiniteFill")
    assert results["masked_kv_invariance"][0] == "fail" and results["masked_grad_zero"][0] == "fail", results


def test_a_layer_taking_a_position_bias_it_may_compute_is_still_probed_for_its_layout() -> None:
    # BEATs' forward takes position_bias=None and (T, B, C): read as batch-first before, 11 checks failed
    conv = load_target(FIXTURE + "SequenceFirstShifted").build(8, 2).conventions
    assert conv.layout == "seq_first"
    result = run_property(all_properties()["oracle_agreement"], load_target(FIXTURE + "SequenceFirstShifted"),
                          settings=PROFILES["quick"], seed=0)
    assert result.verdict == "pass", result
