"""Rotary position embeddings: the oracle applies them (``mha.rotary``), so a layer's own rotary is
verified, not replaced by a rotation by 0; one-bug twins (layout, position, base) fail."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings

from mha_verify.mha.rotary import Rotary
from mha_verify.properties.engine.applicable import examples_for
from mha_verify.properties.engine.profiles import PROFILES
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.protocol import Conventions
from mha_verify.properties.strategies.examples import AttnExample
from mha_verify.properties.targets.eager import load_target
from tests.conftest import assert_verdict

FIXTURE = "tests/fixtures/rotary_layers.py:"
QUICK = PROFILES["quick"]


def test_the_rotation_is_the_papers_on_each_pair_and_keeps_norms() -> None:
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    for interleaved in (False, True):
        y = Rotary(base=100.0, interleaved=interleaved).apply(x)
        assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1))
        assert torch.equal(y[:, 0], x[:, 0])  # position 0 is not rotated
    # position 1, first pair of halves (columns 0 and 4) rotated by 1 radian
    y = Rotary(base=100.0).apply(x)
    a, b = x[:, 1, 0], x[:, 1, 4]
    assert torch.allclose(y[:, 1, 0], a * math.cos(1) - b * math.sin(1))
    assert torch.allclose(y[:, 1, 4], b * math.cos(1) + a * math.sin(1))
    # partial: the last columns pass through
    part = Rotary(fraction=0.5).apply(x)
    assert torch.equal(part[..., 4:], x[..., 4:]) and not torch.equal(part[..., :4], x[..., :4])


@pytest.mark.parametrize(("fraction", "multiple"), [(1.0, 2), (0.5, 4), (0.25, 8)])
def test_head_widths_a_rotary_accepts(fraction: float, multiple: int) -> None:
    assert Rotary(fraction=fraction).head_dim_multiple() == multiple


@settings(max_examples=40, deadline=None)
@given(examples_for(Conventions(rotary=Rotary(fraction=0.25)), layouts=False))
def test_examples_for_a_rotary_layer_draw_head_widths_it_can_rotate(ex: AttnExample) -> None:
    assert ex.sizes.head_dim % 8 == 0


@given(examples_for(Conventions(head_dim_multiple=2).declare({"head_dim_multiple": 6}), layouts=False))
def test_examples_draw_the_head_widths_a_layer_takes(ex: AttnExample) -> None:
    assert ex.sizes.head_dim % 6 == 0


def test_rotary_is_read_from_the_layers_config_and_declarable() -> None:
    conv = load_target(FIXTURE + "RotaryAttention").build(16, 2).conventions
    assert conv.rotary == Rotary(10000.0)
    assert "rotary base 10000, halves (its config; the layout from its rotate_half on a probe)" in conv.describe()
    assert Conventions().declare({"rotary": {"base": 500, "interleaved": True}}).rotary == Rotary(500.0, True)
    assert Conventions().declare({"rotary": {"reverse": True}}).rotary == Rotary(reverse=True)
    with pytest.raises(ValueError, match="unknown rotary keys"):
        Conventions().declare({"rotary": {"theta": 500}})
    with pytest.raises(ValueError, match="interleaved and reverse True or False"):
        Conventions().declare({"rotary": {"reverse": 1}})


@pytest.mark.deep
@pytest.mark.parametrize(("layer", "verdict"), [
    ("RotaryAttention", "pass"), ("InterleavedPairs", "fail"), ("KeysOnePositionOff", "fail"), ("WrongBase", "fail"),
])
def test_a_layers_own_rotary_is_verified(layer: str, verdict: str) -> None:
    result = run_property(all_properties()["oracle_agreement"], load_target(FIXTURE + layer), settings=QUICK, seed=0)
    assert_verdict(result, verdict, 5)


@pytest.mark.deep
@pytest.mark.parametrize(("layer", "verdict"), [("InterleavedRotary", "pass"),
                                               ("InterleavedAnglesHalvesPairs", "fail")])
def test_a_rotate_half_of_neighbouring_columns_is_read_as_interleaved(layer: str, verdict: str) -> None:
    target = load_target("tests/fixtures/rotary_interleaved.py:" + layer)
    assert target.build(16, 2).conventions.rotary == Rotary(10000.0, interleaved=True)
    result = run_property(all_properties()["oracle_agreement"], target, settings=QUICK, seed=0)
    assert_verdict(result, verdict, 5)


def test_permutations_cannot_apply_under_rotary() -> None:
    result = run_property(all_properties()["query_permutation"], load_target(FIXTURE + "RotaryBidirectional"),
                          settings=QUICK)
    assert result.verdict == "n/a" and "rotary embeddings make the scores depend on positions" in str(result.reason)


@pytest.mark.parametrize("interleaved", [False, True])
def test_a_reverse_rotary_undoes_the_forward_one(interleaved: bool) -> None:
    x = torch.randn(2, 3, 7, 8, dtype=torch.float64)
    turned = Rotary(interleaved=interleaved).apply(x)
    assert not torch.allclose(turned, x)
    torch.testing.assert_close(Rotary(interleaved=interleaved, reverse=True).apply(turned), x)


@pytest.mark.deep
@pytest.mark.parametrize(("layer", "rotary", "verdict"), [
    ("rotary_reversed.py:ReversedRotary", Rotary(reverse=True), "pass"),
    ("rotary_reversed.py:ReversedQueriesForwardKeys", Rotary(reverse=True), "fail"),
    ("rotary_complex.py:ComplexPairsRotary", Rotary(interleaved=True), "pass"),
    ("rotary_complex.py:ComplexPairsTransposedKeys", Rotary(interleaved=True), "fail"),
    ("rotary_batchless.py:BatchlessRotary", Rotary(base=100.0), "pass"),  # cos, sin (L, r): DINOv3's
    ("rotary_batchless.py:BatchlessKeysReversed", Rotary(base=100.0), "fail"),
    ("rotary_unsqueeze.py:UnsqueezeZeroRotary", Rotary(), "pass"),  # Pixtral's apply(..., unsqueeze_dim=0)
    ("rotary_unsqueeze.py:UnsqueezeZeroKeysReversed", Rotary(), "fail"),
])
def test_a_layers_rotary_layout_and_direction_are_read_by_running_its_functions(layer: str, rotary: Rotary,
                                                                                verdict: str) -> None:
    target = load_target("tests/fixtures/" + layer)
    assert target.build(16, 2).conventions.rotary == rotary
    result = run_property(all_properties()["oracle_agreement"], target, settings=QUICK, seed=0)
    assert_verdict(result, verdict, 5)


def test_a_rotary_no_formula_matches_runs_as_it_is_held_by_the_laws_and_said() -> None:
    """Its step is never switched off: a rotation by 0 in its place verified another layer than the one shipped."""
    target = load_target("tests/fixtures/rotary_unknown.py:DoubleSpeedRotary")
    conv = target.build(16, 2).conventions
    assert conv.rotary is not None and "rotation by 0" not in conv.describe()
    assert "laws only: it takes a rotary whose apply_rotary_pos_emb matches no rotary formula" in conv.describe()
    result = run_property(all_properties()["oracle_agreement"], target, settings=QUICK, seed=0)
    assert result.verdict == "n/a" and "laws only" in (result.reason or ""), result
    law = run_property(all_properties()["batch_independence"], target, settings=QUICK, seed=0)
    assert_verdict(law, "pass", 5)


@pytest.mark.deep
@pytest.mark.parametrize(("layer", "verdict"), [("FullAttentionLayer", "pass"),
                                               ("FullAttentionAtSlidingBase", "fail")])
def test_a_layer_types_own_rotary_is_read_from_its_config(layer: str, verdict: str) -> None:
    target = load_target("tests/fixtures/rotary_layer_types.py:" + layer)
    assert target.build(16, 2).conventions.rotary == Rotary(1e6)
    result = run_property(all_properties()["oracle_agreement"], target, settings=QUICK, seed=0)
    assert_verdict(result, verdict, 5)
