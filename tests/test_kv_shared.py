"""Keys and values in one argument (``kv_shared``): drawn as k = v != q, with Lk != Lq, and every
cross-attention property runs on them; a scale stated in the layer's ``scaling`` attribute is the
one the oracle applies."""

from __future__ import annotations

import pytest

from mha_verify.properties.engine.profiles import PROFILES
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.targets.eager import load_target

FIXTURE = "tests/fixtures/kv_layers.py:"
QUICK = PROFILES["quick"]


def test_a_key_value_states_layer_is_cross_attention_with_keys_equal_to_values() -> None:
    conv = load_target(FIXTURE + "KeyValueStates").build(8, 2).conventions
    assert conv.cross_attention and conv.kv_shared
    assert "cross-attention, keys = values (one argument)" in conv.describe()


@pytest.mark.parametrize("prop", ["oracle_agreement", "key_permutation", "masked_kv_invariance", "grad_agreement",
                                  "gradcheck", "determinism", "no_future_leak", "masked_grad_zero"])
def test_cross_attention_properties_check_keys_equal_to_values(prop: str) -> None:
    result = run_property(all_properties()[prop], load_target(FIXTURE + "KeyValueStates"), settings=QUICK, seed=0)
    assert result.verdict == "pass" and result.examples >= 5, result


def test_lk_equals_lv_cannot_apply_to_one_argument() -> None:
    result = run_property(all_properties()["lk_equals_lv"], load_target(FIXTURE + "KeyValueStates"), settings=QUICK)
    assert result.verdict == "n/a" and "one argument" in (result.reason or "")


@pytest.mark.deep
def test_values_projected_from_the_queries_fail_where_self_attention_passes() -> None:
    result = run_property(all_properties()["oracle_agreement"], load_target(FIXTURE + "ValuesFromQueries"),
                          settings=QUICK, seed=0)
    assert result.verdict == "fail", result
    assert "Lq=" in (result.counterexample or "")


@pytest.mark.deep
@pytest.mark.parametrize(("layer", "verdict"), [("StatesScaleOne", "pass"), ("StatesScaleOneInt", "pass"),
                                               ("StatesScaleOneAppliesRootHd", "fail")])
def test_a_scale_stated_in_the_layers_scaling_attribute_is_applied_by_the_oracle(layer: str, verdict: str) -> None:
    target = load_target(FIXTURE + layer)
    assert target.build(16, 4).conventions.scale == 1.0
    result = run_property(all_properties()["oracle_agreement"], target, settings=QUICK, seed=0)
    assert result.verdict == verdict, result


def test_a_cross_attention_only_layer_gets_its_keys_through_its_argument_even_for_q_equal_k() -> None:
    target = load_target(FIXTURE + "CrossOnly")  # the call at load is q = k = v: through encoder_hidden_states
    result = run_property(all_properties()["oracle_agreement"], target, settings=QUICK, seed=0)
    assert result.verdict == "pass" and result.examples >= 5, result


@pytest.mark.parametrize("name", ["oracle_agreement", "masked_kv_invariance"])
def test_a_layer_masking_its_context_by_encoder_attention_mask_gets_the_mask_there(name: str) -> None:
    result = run_property(all_properties()[name], load_target("tests/fixtures/kv_layers.py:EncoderMasked"),
                          settings=PROFILES["quick"], seed=0)
    assert result.verdict == "pass" and result.examples >= 5, result


def test_queries_scaled_in_the_forward_and_a_non_rotary_position_type_are_read() -> None:
    target = load_target(FIXTURE + "PrescaledQueries")
    conv = target.build(16, 4).conventions
    assert conv.scale is None and conv.rotary is None
    assert "no rotary: its position_embedding_type is 'absolute'" in conv.describe()
    result = run_property(all_properties()["oracle_agreement"], target, settings=QUICK, seed=0)
    assert result.verdict == "pass" and result.examples >= 5, result
