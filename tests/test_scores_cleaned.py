"""A ``nan_to_num`` of the raw scores before an additive -inf mask is added guards nothing: a fully masked
row is NaN, the layer's convention, not a failure (tests/fixtures/scores_cleaned_layers.py, written as
torchscale's MultiheadAttention is); its twin merging the heads wrongly still fails."""

from __future__ import annotations

import pytest

from mha_verify.properties.engine.profiles import PROFILES
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.targets.eager import load_target

FIXTURE = "tests/fixtures/scores_cleaned_layers.py:"


def _verdict(name: str, check: str) -> str:
    return run_property(all_properties()[check], load_target(FIXTURE + name), settings=PROFILES["quick"],
                        seed=0).verdict


@pytest.mark.deep
def test_the_clean_up_before_the_mask_is_read_as_no_guard() -> None:
    conv = load_target(FIXTURE + "ScoresCleaned").build(8, 2).conventions
    assert conv.fully_masked == "nan", conv.notes
    assert _verdict("ScoresCleaned", "fully_masked_rows") == "declared"
    for check in ("oracle_agreement", "masked_kv_invariance", "batch_independence", "query_permutation"):
        assert _verdict("ScoresCleaned", check) == "pass", check


@pytest.mark.deep
def test_its_twin_merging_the_heads_wrongly_still_fails() -> None:
    assert load_target(FIXTURE + "ScoresCleanedUnmerged").build(8, 2).conventions.fully_masked == "nan"
    assert _verdict("ScoresCleanedUnmerged", "oracle_agreement") == "fail"
