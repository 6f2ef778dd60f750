"""Head counts, projections and gradients read from what a layer shows (tests/fixtures/source_read_layers.py):
each correct layer passes the oracle, each one-bug twin fails it; a kernel that refuses autograd makes the
gradient properties n/a of kind inherited while the forward is still verified; steps the oracle does not
model are refused by name at load."""

from __future__ import annotations

import pytest
import torch

from mha_verify.mha.masks import additive_mask
from mha_verify.properties.adapters.signature import lengths_of
from mha_verify.properties.engine.profiles import PROFILES
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.protocol import NotApplicable, TargetError
from mha_verify.properties.targets.eager import load_target

pytest.importorskip("einops")
FIXTURE = "tests/fixtures/source_read_layers.py:"


def _verdicts(name: str, checks: tuple[str, ...]) -> dict[str, str]:
    target = load_target(FIXTURE + name)
    return {c: run_property(all_properties()[c], target, settings=PROFILES["quick"], seed=0).verdict for c in checks}


@pytest.mark.deep
@pytest.mark.parametrize(("layer", "twin"), [("AttrHeads", "AttrHeadsNoTranspose"),
                                             ("ParamInProj", "ParamInProjSwapped"),
                                             ("SharedQK", "SharedQKSwapped")])
def test_a_layer_read_from_what_it_shows_passes_and_its_twin_fails(layer: str, twin: str) -> None:
    assert set(_verdicts(layer, ("oracle_agreement", "masked_kv_invariance", "head_split")).values()) <= {"pass", "n/a"}
    assert _verdicts(layer, ("oracle_agreement",)) == {"oracle_agreement": "pass"}
    assert _verdicts(twin, ("oracle_agreement",)) == {"oracle_agreement": "fail"}


@pytest.mark.deep
def test_a_bool_mask_turned_additive_in_two_lines_is_read_as_torch_mhas_and_its_twin_fails() -> None:
    checks = ("oracle_agreement", "bool_equals_additive", "masked_kv_invariance")
    assert _verdicts("ParamInProjTwoLines", checks) == dict.fromkeys(checks, "pass")
    assert _verdicts("ParamInProjTwoLinesKeepsWhereTrue", ("bool_equals_additive",)) == {"bool_equals_additive": "fail"}


def test_the_head_count_and_mask_are_said_where_they_were_read() -> None:
    notes = " ".join(load_target(FIXTURE + "AttrHeads").build(8, 2).conventions.notes)
    assert "head count from its split of the projections into heads (self.h)" in notes
    assert "shaped (B, Lq, Lk), a head axis put in by the layer (`mask = mask.unsqueeze(1)`" in notes
    notes = " ".join(load_target(FIXTURE + "ParamInProj").build(8, 2).conventions.notes)
    assert "(in_proj_weight, out_proj)" in notes and "torch MHA's convention" in notes
    # open_clip writes the conversion in two lines: read the same (it once read as SDPA's, True = keep)
    notes = " ".join(load_target(FIXTURE + "ParamInProjTwoLines").build(8, 2).conventions.notes)
    assert "torch MHA's convention (`new_attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype) " \
           "new_attn_mask.masked_fill_(attn_mask,` in its forward)" in notes
    notes = " ".join(load_target(FIXTURE + "SharedQK").build(8, 2).conventions.notes)
    assert "head count from its einops split" in notes


@pytest.mark.deep
def test_a_kernel_without_backward_leaves_the_forward_verified_and_gradients_inherited() -> None:
    target = load_target(FIXTURE + "NoBackward")
    assert target.grads_refused == "NotImplementedError: kernel_without_backward does not support backward on CPU"
    results = {c: run_property(all_properties()[c], target, settings=PROFILES["quick"], seed=0)
               for c in ("oracle_agreement", "gradcheck", "grad_agreement")}
    assert results["oracle_agreement"].verdict == "pass"
    for name in ("gradcheck", "grad_agreement"):
        assert results[name].verdict == "n/a"
        assert results[name].reason.startswith("inherited from a function the layer calls, which takes no gradients "
                                               "here: NotImplementedError: kernel_without_backward")
    assert _verdicts("NoBackwardNoTranspose", ("oracle_agreement",)) == {"oracle_agreement": "fail"}


@pytest.mark.parametrize(("layer", "said"), [
    ("ProjectionOnly", "ProjectionOnly computes no attention weights in its forward (a projection or a helper of an "
                       "attention layer): there is no attention to verify"),
])
def test_a_layer_with_no_attention_is_refused_by_name(layer: str, said: str) -> None:
    with pytest.raises(TargetError) as info:
        load_target(FIXTURE + layer)
    assert str(info.value).startswith(said)


@pytest.mark.deep
def test_key_padding_given_as_lengths_is_drawn_as_right_padding_and_said() -> None:
    conv = load_target(FIXTURE + "Lengths").build(8, 2).conventions
    assert conv.mask_lengths and conv.fully_masked == "nan"
    assert "key padding given as lengths (seq_lens (B,), by its name)" in " ".join(conv.notes)
    verdicts = _verdicts("Lengths", ("oracle_agreement", "masked_kv_invariance", "key_permutation"))
    assert verdicts == {"oracle_agreement": "pass", "masked_kv_invariance": "pass", "key_permutation": "n/a"}
    assert _verdicts("LengthsOneMore", ("oracle_agreement",)) == {"oracle_agreement": "fail"}


def test_lengths_are_read_from_right_padding_only() -> None:
    keep = torch.tensor([[True, True, False], [True, True, True]])[:, None, None, :]  # (B, 1, 1, Lk)
    assert lengths_of(keep, B=2, Lk=3).tolist() == [2, 3]
    assert lengths_of(additive_mask(keep, torch.float32), B=2, Lk=3).tolist() == [2, 3]
    with pytest.raises(NotApplicable, match="this mask is not right padding"):
        lengths_of(torch.tensor([[False, True, True]]), B=1, Lk=3)  # left padding
    with pytest.raises(NotApplicable, match="varies along its Lq axis"):
        lengths_of(torch.ones(2, 3, dtype=torch.bool).tril(), B=1, Lk=3)  # per query


@pytest.mark.deep
def test_a_lora_linear_left_uninitialized_is_read_and_drawn_alike_in_every_instance() -> None:
    target = load_target(FIXTURE + "LoraAttention")
    bound = target.build(8, 2, seed=3)
    assert bool(bound.params().w_q.abs().max() < 10)  # its torch.empty weight drawn at 1/sqrt(fan-in)
    assert torch.equal(bound.params().w_o, target.build(8, 2, seed=3).fresh().params().w_o)
    assert _verdicts("LoraAttention", ("oracle_agreement", "determinism")) == {
        "oracle_agreement": "pass", "determinism": "pass"}
    assert _verdicts("LoraAttentionHeadsMixed", ("oracle_agreement",)) == {"oracle_agreement": "fail"}


def test_an_output_projection_named_first_is_still_the_output() -> None:
    assert _verdicts("OutNamedFirst", ("oracle_agreement",)) == {"oracle_agreement": "pass"}


def test_dropout_checks_are_na_where_the_layer_builds_no_dropout_at_those_sizes() -> None:
    verdicts = _verdicts("DropoutWithHeads", ("dropout_off_in_eval",))
    assert verdicts == {"dropout_off_in_eval": "pass"}


def test_a_reading_adapters_subclass_declares_what_the_layer_does_not_show() -> None:
    target = load_target(FIXTURE + "CausalSharedQK", adapter=FIXTURE + "CausalByShape")
    assert target.build(8, 2).conventions.causal == "top_left"
    results = {c: run_property(all_properties()[c], target, settings=PROFILES["quick"], seed=0).verdict
               for c in ("oracle_agreement", "no_future_leak")}
    assert results == {"oracle_agreement": "pass", "no_future_leak": "pass"}


def test_an_error_of_the_layers_own_with_autograd_on_is_not_a_function_refusing_gradients() -> None:
    target = load_target(FIXTURE + "InPlaceInput")  # loads: the properties are left to find it
    assert target.grads_refused is None
    assert target.build(8, 2).conventions.grads
