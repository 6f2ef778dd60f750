"""A sequence-first layer as labml writes it, with zero user code (``tests/fixtures/batch_last_layers.py``):
q, k, v projected by wrappers around one Linear, a mask (Lq, Lk, B) with the batch last read from its
own shape checks, a length-1 axis that torch.einsum broadcasts said as inherited, not failed."""

from __future__ import annotations

import pytest
import torch

from mha_verify.properties.adapters.by_shape import read_projections
from mha_verify.properties.adapters.signature import MaskFormat
from mha_verify.properties.engine.profiles import PROFILES
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.targets.eager import load_target

FIXTURE = "tests/fixtures/batch_last_layers.py:"


def _verdict(name: str, check: str) -> tuple[str, str | None]:
    result = run_property(all_properties()[check], load_target(FIXTURE + name), settings=PROFILES["quick"], seed=0)
    return result.verdict, result.kind


def test_projection_wrappers_and_a_batch_last_mask_are_read() -> None:
    bound = load_target(FIXTURE + "BatchLastMask").build(8, 2)
    reading = read_projections(bound.module)
    assert reading is not None and reading.layout == "q_k_v"
    assert [where for where, _ in reading.layers] == ["query", "key", "value", "output"]
    conv = bound.conventions
    assert conv.layout == "seq_first" and conv.mask == frozenset({"bool"})
    assert conv.mask_forms and not any(f.startswith("BH") for f in conv.mask_forms)  # no head axis
    assert any("shaped (Lq, Lk, B), batch last" in n for n in conv.notes), conv.notes


def test_the_batch_last_layout_converts_our_mask() -> None:
    keep = torch.rand(2, 1, 3, 5) > 0.5  # (B, 1, Lq, Lk)
    out = MaskFormat(kind="keep", layout="LLB").convert(keep, B=2, Lq=3, Lk=5, dtype=torch.float32)
    assert out is not None and out.shape == (3, 5, 2)
    assert torch.equal(out[:, :, 1], keep[1, 0])


@pytest.mark.deep
def test_the_layer_passes_and_its_twin_reading_the_mask_transposed_fails() -> None:
    for check in ("oracle_agreement", "masked_kv_invariance", "batch_independence"):
        assert _verdict("BatchLastMask", check) == ("pass", None), check
    assert _verdict("BatchLastMaskTransposed", "oracle_agreement")[0] == "fail"


def test_a_length_one_axis_broadcast_by_einsum_is_inherited_and_a_truncation_still_fails() -> None:
    assert _verdict("BatchLastMask", "lk_equals_lv") == ("finding", "inherited")
    result = run_property(all_properties()["lk_equals_lv"], load_target("tests/mutants.py:TruncatesLongerValues"),
                          settings=PROFILES["quick"], seed=0)
    assert result.verdict == "fail", result


def test_a_rotary_child_the_oracle_does_not_read_is_named_and_held_by_the_laws() -> None:
    """labml's rotary subclasses rotate through parameter-free children: judged as plain attention they
    failed every property; the children are named, and the layer is held by the laws alone."""
    conv = load_target(FIXTURE + "BatchLastRotary").build(8, 2).conventions
    assert conv.beyond == ("a rotary or positional embedding of its own (query_rotary_pe: RotaryPositions, "
                           "key_rotary_pe: RotaryPositions)") and conv.beyond_positional, conv.beyond
    result = run_property(all_properties()["oracle_agreement"], load_target(FIXTURE + "BatchLastRotary"),
                          settings=PROFILES["quick"], seed=0)
    assert (result.verdict, result.kind) == ("n/a", "beyond"), result
    result = run_property(all_properties()["masked_kv_invariance"], load_target(FIXTURE + "BatchLastRotary"),
                          settings=PROFILES["quick"], seed=0)
    assert result.verdict == "pass" and result.examples >= 5, result
