"""Masks in the shapes a layer takes: a layer whose only mask is key padding (``key_padding_mask``, or a
declared ``mask_forms: ["B11L"]``) is given masks of that shape by every property, and the properties
whose law needs a mask per query are n/a for it, never a FAIL (tests/fixtures/key_padding_layers.py)."""

from __future__ import annotations

import pytest

from mha_verify.properties.engine import profiles
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.targets.eager import load_target

FIXTURE = "tests/fixtures/key_padding_layers.py:"
SETTINGS = profiles.PROFILES[profiles.profile_name()]
PROPS = all_properties()


def test_a_key_padding_argument_is_read_as_the_mask() -> None:
    conv = load_target(FIXTURE + "KeyPadded").build(16, 2).conventions
    assert conv.mask == frozenset({"bool"}) and conv.mask_forms == frozenset({"B11L"})
    assert any("key padding (B, Lk)" in n and "True = masked out" in n for n in conv.notes), conv.notes


@pytest.mark.deep
@pytest.mark.parametrize("layer", ["KeyPadded", "PaddingShaped"])
@pytest.mark.parametrize("name", ["query_permutation", "key_permutation", "batch_independence",
                                  "masked_kv_invariance", "fully_masked_rows"])
def test_the_correct_layer_passes_with_masks_it_takes(layer: str, name: str) -> None:
    result = run_property(PROPS[name], load_target(FIXTURE + layer), settings=SETTINGS)
    assert result.verdict == "pass" and result.examples > 0, result


@pytest.mark.parametrize("layer", ["KeyPadded", "PaddingShaped"])
@pytest.mark.parametrize("name", ["no_future_leak", "prefix_consistency"])
def test_no_mask_it_takes_can_make_it_causal(layer: str, name: str) -> None:
    result = run_property(PROPS[name], load_target(FIXTURE + layer), settings=SETTINGS)
    assert result.verdict == "n/a" and "none has a query axis" in str(result.reason), result


@pytest.mark.deep
@pytest.mark.parametrize("layer", ["KeyPaddedFirstItem", "PaddingShapedFirstItem"])
def test_the_twin_with_one_items_padding_fails(layer: str) -> None:
    result = run_property(PROPS["batch_independence"], load_target(FIXTURE + layer), settings=SETTINGS)
    assert result.verdict == "fail", result
