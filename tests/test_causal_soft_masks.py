"""A causal layer masking with finfo.min (ImageGPT's eager attention) gives a fully masked row
uniform weights over the keys causality leaves: declared "uniform_visible", it passes; its twin, whose
fully masked rows spread over the future keys too, fails."""

from __future__ import annotations

import pytest

from mha_verify.properties.engine import profiles
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.targets.eager import load_target

FIXTURE = "tests/fixtures/causal_soft_masks.py:"


@pytest.mark.deep
@pytest.mark.parametrize(("layer", "verdict"), [("CausalFinfoMin", "declared"), ("CausalFinfoMinReplaced", "fail")])
def test_fully_masked_rows_of_a_causal_layer_masking_with_finfo_min(layer: str, verdict: str) -> None:
    result = run_property(all_properties()["fully_masked_rows"], load_target(FIXTURE + layer),
                          settings=profiles.PROFILES["quick"])
    assert result.verdict == verdict, result
    if verdict == "fail":
        assert "uniform" in (result.reason or ""), result


def test_the_causal_layer_masking_with_finfo_min_agrees_with_the_oracle() -> None:
    result = run_property(all_properties()["oracle_agreement"], load_target(FIXTURE + "CausalFinfoMin"),
                          settings=profiles.PROFILES["quick"])
    assert result.verdict == "pass", result
