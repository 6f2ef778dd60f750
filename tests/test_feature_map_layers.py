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


def test_heads_merged_by_a_rearrange_in_to_out_are_read_as_the_standard_merge() -> None:
    assert set(_verdicts("VitOut", ("oracle_agreement", "head_split", "grad_agreement")).values()) == {"pass"}
    assert _verdicts("VitOutNoScale", ("oracle_agreement",)) == {"oracle_agreement": "fail"}


def test_a_merge_of_d_before_h_is_not_read_as_the_standard_one() -> None:
    with pytest.raises(TargetError, match="no adapter recognizes VitOutDHMerge"):
        load_target(FIXTURE + "VitOutDHMerge").build(8, 2)


def test_projections_by_convolution_are_refused_by_name() -> None:
    with pytest.raises(TargetError) as info:
        load_target(FIXTURE + "ConvProjected").build(8, 2)
    assert str(info.value) == (
        "ConvProjected takes a step beyond the attention the oracle models: q, k, v projected by convolutions over "
        "a feature map (to_q: Conv2d, to_k: Conv2d, to_v: Conv2d), attention over (B, C, H, W) positions rather "
        "than a sequence (B, L, D), so it cannot be verified yet")
