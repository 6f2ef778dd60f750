"""Norms before and inside attention as vit-pytorch writes them, read with zero user code
(``tests/fixtures/pre_norm_layers.py``): the queries' pre-norm of a cross-attention layer with its
context raw or through a norm of its own, an RMSNorm with no epsilon attribute, a QK-norm gain of
shape (H, 1, Hd) standing in for the softmax scale, and two mask arguments each read as itself.
Every correct layer passes and its one-bug twin fails."""

from __future__ import annotations

import pytest

from mha_verify.properties.engine.profiles import PROFILES
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.targets.eager import load_target

FIXTURE = "tests/fixtures/pre_norm_layers.py:"
CHECKS = ("oracle_agreement", "head_split", "grad_agreement")


def _verdicts(name: str, checks: tuple[str, ...] = CHECKS) -> dict[str, str]:
    target = load_target(FIXTURE + name)
    return {c: run_property(all_properties()[c], target, settings=PROFILES["quick"], seed=0).verdict for c in checks}


def test_a_cross_attention_layer_normalizing_its_queries_alone_is_verified() -> None:
    conv = load_target(FIXTURE + "CrossQueryNormed").build(8, 2).conventions
    assert conv.input_norm is not None and conv.context_norm is None and conv.cross_attention
    assert any("its context projected as given" in n for n in conv.notes), conv.notes
    assert set(_verdicts("CrossQueryNormed").values()) == {"pass"}
    assert _verdicts("CrossQueryNormedContextToo", ("oracle_agreement",)) == {"oracle_agreement": "fail"}


def test_a_context_with_a_norm_of_its_own_is_normalized_by_it() -> None:
    conv = load_target(FIXTURE + "CrossContextNormed").build(8, 2).conventions
    assert conv.input_norm is not None and conv.context_norm is not None
    assert conv.input_norm is not conv.context_norm
    assert any("normalized first by norm, norm_context" in n for n in conv.notes), conv.notes
    assert set(_verdicts("CrossContextNormed").values()) == {"pass"}
    assert _verdicts("CrossContextNormedKeysFromQueries", ("oracle_agreement",)) == {"oracle_agreement": "fail"}


def test_a_qk_norm_gain_without_a_softmax_scale_is_read_as_scale_one() -> None:
    conv = load_target(FIXTURE + "QkGainNoScale").build(8, 2).conventions
    assert conv.scale == 1.0
    assert conv.input_norm is not None and conv.input_norm.kind == "rms" and conv.input_norm.eps == 0.0
    assert conv.q_norm is not None and conv.k_norm is not None
    assert any("its QK-norm's learned gain sets the temperature" in n for n in conv.notes), conv.notes
    assert set(_verdicts("QkGainNoScale").values()) == {"pass"}
    assert _verdicts("QkGainNoScaleSwappedGains", ("oracle_agreement",)) == {"oracle_agreement": "fail"}


def test_a_missing_scale_without_a_qk_norm_is_still_the_textbook_bug() -> None:
    conv = load_target(FIXTURE + "NoScaleNoNorm").build(8, 2).conventions
    assert conv.scale is None
    assert _verdicts("NoScaleNoNorm", ("oracle_agreement",)) == {"oracle_agreement": "fail"}


@pytest.mark.parametrize("check", ["oracle_agreement", "masked_kv_invariance"])
def test_a_second_mask_argument_does_not_decide_the_first_ones_layout(check: str) -> None:
    """``mask[:, None, None, :]`` is key padding; the ``attn_mask`` the harness drives keeps every
    form (before, the other mask's indexing was read as attn_mask's layout)."""
    conv = load_target(FIXTURE + "TwoMasks").build(8, 2).conventions
    assert "BHLL" in conv.mask_forms, conv.mask_forms
    assert _verdicts("TwoMasks", (check,)) == {check: "pass"}
