"""Recognition of vit-pytorch's writing around the projections (tests/fixtures/feature_map_layers.py):
heads merged by an einops ``Rearrange`` in ``to_out`` read as the standard merge (the layer passes,
its twin without the scale fails); a ``(d h)`` merge not read as one; q, k, v projected by
convolutions over a feature map refused by name rather than left as "no adapter recognizes"."""

from __future__ import annotations

import pytest

from mha_verify.properties.engine.profiles import PROFILES
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.protocol import TargetError
from mha_verify.properties.targets.eager import load_target

pytest.importorskip("einops")
FIXTURE = "tests/fixtures/feature_map_layers.py:"


def _verdicts(name: str, checks: tuple[str, ...]) -> dict[str, str]:
    target = load_target(FIXTURE + name)
    return {c: run_property(all_properties()[c], target, settings=PROFILES["quick"], seed=0).verdict for c in checks}


@pytest.mark.deep
def test_heads_merged_by_a_rearrange_in_to_out_are_read_as_the_standard_merge() -> None:
    assert set(_verdicts("VitOut", ("oracle_agreement", "head_split", "grad_agreement")).values()) == {"pass"}
    assert _verdicts("VitOutNoScale", ("oracle_agreement",)) == {"oracle_agreement": "fail"}


def test_a_merge_of_d_before_h_is_not_read_as_the_standard_one() -> None:
    with pytest.raises(TargetError, match="no adapter recognizes VitOutDHMerge"):
        load_target(FIXTURE + "VitOutDHMerge").build(8, 2)


def test_projections_by_wide_convolutions_are_refused_by_name() -> None:
    with pytest.raises(TargetError) as info:
        load_target(FIXTURE + "ConvProjectedWide").build(8, 2)
    assert str(info.value) == (
        "ConvProjectedWide takes a step beyond the attention the oracle models: q, k, v projected by convolutions "
        "over a feature map (to_k: Conv2d, to_v: Conv2d), attention over (B, C, H, W) positions rather "
        "than a sequence (B, L, D), so it cannot be verified yet")


@pytest.mark.deep
@pytest.mark.parametrize(("layer", "twin"), [("ConvProjected", "ConvProjectedDHSplit"),
                                             ("NestLike", "NestLikeSoftmaxOverQueries")])
def test_a_channels_first_feature_map_through_1x1_convolutions_is_verified_and_its_twin_fails(
        layer: str, twin: str) -> None:
    conventions = load_target(FIXTURE + layer).build(8, 2).conventions
    assert conventions.layout == "BD1L"
    assert conventions.beyond is None  # held to the oracle, not to the laws alone
    assert "a sequence as one row of a channels-first feature map, read by a probe" in "; ".join(conventions.notes)
    checks = ("oracle_agreement", "head_split", "batch_independence", "query_permutation", "grad_agreement")
    assert set(_verdicts(layer, checks).values()) == {"pass"}
    assert _verdicts(twin, ("oracle_agreement",)) == {"oracle_agreement": "fail"}


def test_a_layer_norm_of_its_own_over_the_channels_is_applied_by_the_oracle() -> None:
    notes = "; ".join(load_target(FIXTURE + "NestLike").build(8, 2).conventions.notes)
    assert "its input normalized first by norm (LayerNorm over D, eps 1e-05), applied by the oracle" in notes


@pytest.mark.parametrize("d_model", [2, 3, 5])
def test_a_feature_map_is_read_where_d_equals_a_probe_axis(d_model: int) -> None:
    # at (2, 3, 5, D = 3) a channels-first layer would take the last axis's 3 for its channels
    assert load_target(FIXTURE + "ConvProjected").build(d_model, 1).conventions.layout == "BD1L"


def test_a_layer_that_raises_on_every_call_says_what_it_raised_on_a_feature_map() -> None:
    # the 3-D call's unpacking error says nothing; on a map, the layer's own multi-head bug shows
    with pytest.raises(TargetError) as info:
        load_target(FIXTURE + "MapBlockViewBug")
    message = str(info.value)
    assert "raised ValueError: not enough values to unpack" in message
    assert "as (2, D, 1, 3) it raised RuntimeError: view size is not compatible" in message


@pytest.mark.deep
@pytest.mark.parametrize("d_model", [2, 3, 5, 8])
def test_a_sequence_given_channels_first_is_read_and_verified_and_its_twin_fails(d_model: int) -> None:
    # at D = 3 the probe's (2, 3, D) would run channels first as a batch-first layer's: its axes avoid D
    conventions = load_target(FIXTURE + "SequenceChannelsFirst").build(d_model, 1).conventions
    assert conventions.layout == "BDL" and conventions.beyond is None
    if d_model == 8:
        checks = ("oracle_agreement", "head_split", "query_permutation", "grad_agreement", "batch_independence")
        assert set(_verdicts("SequenceChannelsFirst", checks).values()) == {"pass"}
        assert _verdicts("SequenceChannelsFirstOverQueries", ("oracle_agreement",)) == {"oracle_agreement": "fail"}
