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


@pytest.mark.deep
def test_a_cross_attention_layer_normalizing_its_queries_alone_is_verified() -> None:
    conv = load_target(FIXTURE + "CrossQueryNormed").build(8, 2).conventions
    assert conv.input_norm is not None and conv.context_norm is None and conv.cross_attention
    assert any("its context projected as given" in n for n in conv.notes), conv.notes
    assert set(_verdicts("CrossQueryNormed").values()) == {"pass"}
    assert _verdicts("CrossQueryNormedContextToo", ("oracle_agreement",)) == {"oracle_agreement": "fail"}


@pytest.mark.deep
def test_a_context_with_a_norm_of_its_own_is_normalized_by_it() -> None:
    conv = load_target(FIXTURE + "CrossContextNormed").build(8, 2).conventions
    assert conv.input_norm is not None and conv.context_norm is not None
    assert conv.input_norm is not conv.context_norm
    assert any("normalized first by norm, norm_context" in n for n in conv.notes), conv.notes
    assert set(_verdicts("CrossContextNormed").values()) == {"pass"}
    assert _verdicts("CrossContextNormedKeysFromQueries", ("oracle_agreement",)) == {"oracle_agreement": "fail"}


@pytest.mark.deep
def test_a_qk_norm_gain_without_a_softmax_scale_is_read_as_scale_one() -> None:
    conv = load_target(FIXTURE + "QkGainNoScale").build(8, 2).conventions
    assert conv.scale == 1.0
    assert conv.input_norm is not None and conv.input_norm.kind == "rms" and conv.input_norm.eps == 0.0
    assert conv.q_norm is not None and conv.k_norm is not None
    assert any("its QK-norm's learned gain sets the temperature" in n for n in conv.notes), conv.notes
    assert set(_verdicts("QkGainNoScale").values()) == {"pass"}
    assert _verdicts("QkGainNoScaleSwappedGains", ("oracle_agreement",)) == {"oracle_agreement": "fail"}


@pytest.mark.deep
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


@pytest.mark.deep
def test_a_join_under_a_flag_off_by_default_is_not_taken() -> None:
    """cross-vit: ``if kv_include_self: context = torch.cat((x, context))``, the flag False by default:
    verified as the cross-attention the default call computes."""
    conv = load_target(FIXTURE + "CrossSelfJoinFlagged").build(8, 2).conventions
    assert conv.cross_attention and conv.context_norm is None
    assert set(_verdicts("CrossSelfJoinFlagged").values()) == {"pass"}
    assert _verdicts("CrossSelfJoinFlaggedScaledTwice", ("oracle_agreement",)) == {"oracle_agreement": "fail"}


@pytest.mark.deep
@pytest.mark.parametrize(("name", "twin", "said"), [
    ("JoinedContext", "JoinedContextFirstKeyDropped", "context is concatenated to x as keys and values"),
    ("ContextNormNotBuilt", "ContextNormNotBuiltNormedTwice", "its context norm (norm_context) is None as built"),
])
def test_a_context_the_layer_cannot_take_as_keys_is_verified_as_self_attention(name: str, twin: str, said: str) -> None:
    conv = load_target(FIXTURE + name).build(8, 2).conventions
    assert not conv.cross_attention and conv.input_norm is conv.context_norm is not None
    assert any(said in n for n in conv.notes), conv.notes
    assert set(_verdicts(name).values()) == {"pass"}
    assert _verdicts(twin, ("oracle_agreement",)) == {"oracle_agreement": "fail"}


def test_torchs_rms_norm_without_an_epsilon_uses_the_input_dtypes() -> None:
    """nn.RMSNorm(eps=None) adds finfo(dtype).eps: 1.2e-7 in float32, 2.2e-16 in float64, 7.8e-3 in
    bfloat16; read as such (it once refused the layer), and told from a stated 1e-6 by the probe."""
    import torch

    from mha_verify.properties.adapters.qk_norm import read_norm

    unstated = read_norm(torch.nn.RMSNorm(8), "norm", 1, 8)
    assert unstated.eps is None and unstated.eps_for(torch.bfloat16) == torch.finfo(torch.bfloat16).eps
    assert "the input dtype's epsilon" in unstated.describe()
    assert read_norm(torch.nn.RMSNorm(8, eps=1e-6), "norm", 1, 8).eps == 1e-6
    x = torch.randn(2, 3, 8, dtype=torch.float64) * 1e-4
    for dtype in (torch.float32, torch.float64):
        want = torch.nn.RMSNorm(8, dtype=dtype)(x.to(dtype))
        assert torch.allclose(unstated.apply(x.to(dtype)), want, rtol=1e-5 if dtype == torch.float32 else 1e-12)
