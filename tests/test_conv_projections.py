"""Primer-EZ's writing (tests/fixtures/conv_projection_layers.py): a convolution over positions after each
projection is a step of its own, verified by the laws alone. The laws about a masked key's k and v are
n/a naming it; the causal laws hold a layer whose convolution a probe finds reaches no later position,
are n/a for one that does (naming what the probe saw), and fail a layer that says it is causal and
whose convolution reads the next positions."""

from __future__ import annotations

import pytest

from mha_verify.properties.engine.profiles import PROFILES
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.targets.eager import load_target

FIXTURE = "tests/fixtures/conv_projection_layers.py:"
CHECKS = ("no_future_leak", "prefix_consistency", "masked_kv_invariance", "masked_grad_zero", "batch_independence",
          "oracle_agreement")
STEP = ("a convolution over positions after its projections (query: DepthwiseConvolution, "
        "key: DepthwiseConvolution, value: DepthwiseConvolution)")


def _results(name: str) -> dict[str, tuple[str, str]]:
    target = load_target(FIXTURE + name)
    out = {}
    for check in CHECKS:
        result = run_property(all_properties()[check], target, settings=PROFILES["quick"], seed=0)
        out[check] = (result.verdict, result.reason or "")
    return out


@pytest.mark.deep
def test_a_causal_convolution_after_the_projections_is_held_by_the_laws_the_causal_ones_included() -> None:
    conv = load_target(FIXTURE + "CausalConvAttention").build(8, 2).conventions
    assert conv.beyond == STEP and conv.mixes_positions == STEP and conv.mixes_future is None
    assert conv.beyond_positional and conv.mask  # its mask is still read
    got = _results("CausalConvAttention")
    assert {c: got[c][0] for c in ("no_future_leak", "prefix_consistency", "batch_independence")} == \
        {"no_future_leak": "pass", "prefix_consistency": "pass", "batch_independence": "pass"}
    for check in ("masked_kv_invariance", "masked_grad_zero"):
        verdict, reason = got[check]
        assert verdict == "n/a" and "carries each position into its neighbours' queries, keys and values" in reason
    assert got["oracle_agreement"][0] == "n/a"


def test_a_convolution_reaching_later_positions_makes_the_causal_laws_na_naming_the_probe() -> None:
    conv = load_target(FIXTURE + "SameConvAttention").build(8, 2).conventions
    assert conv.mixes_future is not None and "moved its output at entry 0" in conv.mixes_future
    got = _results("SameConvAttention")
    for check in ("no_future_leak", "prefix_consistency"):
        verdict, reason = got[check]
        assert verdict == "n/a" and "reaches a position from a later one" in reason \
            and "a causal mask does not make the layer causal" in reason
    assert got["batch_independence"][0] == "pass"


@pytest.mark.deep
def test_a_layer_that_says_it_is_causal_and_reads_the_next_positions_fails() -> None:
    got = _results("CausalLayerFutureConv")
    assert got["no_future_leak"][0] == "fail" and got["prefix_consistency"][0] == "fail"
    assert got["batch_independence"][0] == "pass"
