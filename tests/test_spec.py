"""What a layer should compute comes from its library's declaration (adapters/spec.py): the softmax scale
a transformers layer is held to, from its config and its family's documented scale, and the words of a
departure of its code from it. The layers themselves are in tests/ecosystem/test_spec.py."""

from __future__ import annotations

import types

import pytest
from torch import nn

from mha_verify.properties.adapters.spec import (
    HF_REVERSE_ROTARY,
    HF_SCALE_FAMILIES,
    DeclaredCausal,
    causal_departure,
    declared_causal,
    declared_dropout,
    declared_norm,
    declared_reverse,
    declared_scale,
    hf_family,
    rotary_departure,
    scale_departure,
)


def _layer(family: str | None, **config: object) -> nn.Module:
    """A module whose class lives where transformers keeps ``family``'s layers, built from ``config``."""
    module_name = "tests.test_spec" if family is None else f"transformers.models.{family}.modeling_{family}"
    cls = type("Attention", (nn.Module,), {"__module__": module_name})
    layer = cls()
    layer.config = types.SimpleNamespace(**config)
    return layer


def test_a_transformers_layer_is_scaled_by_one_over_root_head_dim_unless_its_config_says_otherwise() -> None:
    declared = declared_scale(_layer("llama", hidden_size=32, num_attention_heads=4), 8)
    assert declared is not None and declared.value == pytest.approx(8 ** -0.5)
    assert "1/sqrt(head_dim 8)" in declared.how
    gemma = declared_scale(_layer("gemma2", query_pre_attn_scalar=256), 8)
    assert gemma is not None and gemma.value == pytest.approx(1 / 16) and "query_pre_attn_scalar" in gemma.how
    granite = declared_scale(_layer("granite", attention_multiplier=0.015625), 8)
    assert granite is not None and granite.value == 0.015625 and "attention_multiplier" in granite.how
    gpt2 = declared_scale(_layer("gpt2", scale_attn_weights=False), 8)
    assert gpt2 is not None and gpt2.value == 1.0


@pytest.mark.parametrize(("family", "value"), [("t5", 1.0), ("gemma3n", 1.0), ("inkling", 1 / 8),
                                               ("zamba2", 4 ** -0.5)])
def test_a_family_that_documents_another_scale_is_held_to_it(family: str, value: float) -> None:
    declared = declared_scale(_layer(family), 8)
    assert declared is not None and declared.value == pytest.approx(value)
    assert HF_SCALE_FAMILIES[family][1].split(":")[0] in declared.how  # where the library says it


@pytest.mark.parametrize("config", [{"scale_attn_by_inverse_layer_idx": True},
                                    {"rope_parameters": {"rope_type": "yarn", "mscale": 0.707}}])
def test_a_scale_the_rules_do_not_compute_is_not_declared(config: dict[str, object]) -> None:
    assert declared_scale(_layer("deepseek_v3", **config), 8) is None


def test_outside_transformers_or_without_a_config_nothing_is_declared() -> None:
    assert hf_family(_layer(None)) is None
    assert declared_scale(_layer(None, hidden_size=32), 8) is None
    bare = _layer("llama")
    del bare.config
    assert declared_scale(bare, 8) is None


def test_a_departure_names_what_the_code_does_and_what_the_spec_says() -> None:
    declared = declared_scale(_layer("llama"), 4)
    assert declared is not None
    assert scale_departure(None, "", declared, 4) is None  # the code states nothing: 1/sqrt(4), the spec
    assert scale_departure(0.5, "softmax scale 0.5 from its scaling attribute", declared, 4) is None
    words = scale_departure(0.25, "softmax scale 0.25 from its scaling attribute", declared, 4)
    assert words == ("its code scales scores by 0.25 (softmax scale 0.25 from its scaling attribute) where its "
                     "spec says 1/sqrt(head_dim 4) = 0.5, transformers' scaled dot-product attention (no config "
                     "field sets another)")


def test_a_transformers_rotary_turns_forward_unless_its_family_documents_otherwise() -> None:
    assert declared_reverse(_layer("llama")) == (False, "transformers' rotary turns forward "
                                                        "(`rotate_half(x) = cat(-x2, x1)`)")
    nanochat = declared_reverse(_layer("nanochat"))
    assert nanochat is not None and nanochat[0] is True and "nanochat/modeling_nanochat.py" in nanochat[1]
    assert set(HF_REVERSE_ROTARY) == {"nanochat"}
    assert declared_reverse(_layer(None)) is None  # outside transformers: the code's reading is the convention
    said = rotary_departure(True, "its apply_rotary_pos_emb on a probe", (False, "forward"))
    assert said == "its code turns its rotary the other way (its apply_rotary_pos_emb on a probe) where its spec " \
                   "says forward"
    assert rotary_departure(False, "x", (False, "forward")) is None


@pytest.mark.parametrize(("config", "field"), [
    ({"attention_dropout": 0.0}, "attention_dropout"),
    ({"attention_probs_dropout_prob": 0.1}, "attention_probs_dropout_prob"),
    ({"attn_pdrop": 0.1, "hidden_dropout": 0.1}, "attn_pdrop"),
    ({"hidden_dropout": 0.1}, None),  # not the attention's
    ({"attention_dropout": True}, None),  # not a probability
    ({"attention_dropout": 1.5}, None),
])
def test_the_attention_dropout_a_config_declares(config: dict[str, object], field: str | None) -> None:
    said = declared_dropout(_layer("llama", **config))
    assert (said is None) == (field is None), said
    assert field is None or said == f"its config's {field} (SimpleNamespace)"
    assert declared_dropout(_layer(None, **config)) is None


def test_setting_dropout_sets_the_attention_dropout_of_the_config_a_layer_holds() -> None:
    """As a user of its library sets it: a layer that reads its config's probability at every call (Data2Vec's
    vision SDPA layer) drops with it; an integer 0 is a probability too (AltCLIP's text config)."""
    from mha_verify.properties.adapters.layer_attrs import set_all_dropout

    layer = _layer("llama", attention_probs_dropout_prob=0, hidden_dropout=0.0)
    layer.attention_dropout = 0
    assert set_all_dropout(layer, 0.3)
    assert layer.config.attention_probs_dropout_prob == 0.3 and layer.attention_dropout == 0.3
    assert layer.config.hidden_dropout == 0.0  # not the attention's


def test_a_causal_departure_names_the_flag_and_the_declaration() -> None:
    declared = DeclaredCausal("causal: transformers lists 'gpt2' as a causal language model", unmasked=True)
    assert causal_departure(False, "causal from its is_causal=False attribute", declared) == (
        "its code is not causal (causal from its is_causal=False attribute) where its spec says causal: "
        "transformers lists 'gpt2' as a causal language model")
    assert causal_departure(True, "x", declared) is None
    assert causal_departure("bottom_right", "x", declared) is None
    assert declared_causal(_layer(None, model_type="gpt2")) is None  # outside transformers
    assert declared_causal(_layer("bert", model_type="bert")) is None  # a masked language model too (or no
    # transformers installed: nothing to read its lists from)


@pytest.mark.parametrize(("config", "declared"), [
    ({"rms_norm_eps": 1e-6}, ("rms", 1e-6)),
    ({"layer_norm_eps": 1e-5}, ("layer", 1e-5)),
    ({"rms_norm_eps": 1e-6, "layer_norm_eps": 1e-5}, None),  # both: the config does not say which is the QK-norm
    ({}, None),
])
def test_the_qk_norm_a_config_declares(config: dict[str, object], declared: tuple[str, float] | None) -> None:
    got = declared_norm(_layer("qwen3", **config))
    assert (None if got is None else got[:2]) == declared
    assert declared_norm(_layer(None, **config)) is None
