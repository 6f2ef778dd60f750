"""A relative-position bias a layer gathers from its own table (tests/fixtures/window_table_layers.py,
written as MONAI's Swin ``WindowAttention`` is): built with a window the constructor requires, held to
the oracle with the layer's table as its index says, drawn with lengths the index covers; its twins
fail; a window no table accounts for is refused by name; a mask added through reshapes is read as
additive."""

from __future__ import annotations

import pytest

from mha_verify.properties.adapters.mask_reading import read_mask
from mha_verify.properties.engine.profiles import PROFILES
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.protocol import TargetError
from mha_verify.properties.targets.eager import load_target

FIXTURE = "tests/fixtures/window_table_layers.py:"
CHECKS = ("oracle_agreement", "head_split", "grad_agreement", "bool_equals_additive", "masked_kv_invariance",
          "batch_independence")


def _verdicts(name: str, checks: tuple[str, ...]) -> dict[str, str]:
    target = load_target(FIXTURE + name)
    return {c: run_property(all_properties()[c], target, settings=PROFILES["quick"], seed=0).verdict for c in checks}


@pytest.mark.deep
@pytest.mark.parametrize("layer", ["WindowTable", "WindowTableHeadsFirst"])
def test_a_gathered_table_is_the_layers_position_bias_and_the_layer_passes(layer: str) -> None:
    target = load_target(FIXTURE + layer)
    assert target.built_as == f"{layer}(dim=8, num_heads=2, window_size=(4, 4))"
    conv = target.build(8, 2).conventions
    assert conv.beyond is None and conv.position_bias is not None  # the oracle, not the laws alone
    assert conv.max_length == 16  # a (4, 4) window: 16 positions have an entry
    assert conv.mask == frozenset({"bool", "float"}) and conv.fully_masked == "nan"  # added: read as additive
    assert set(_verdicts(layer, CHECKS).values()) == {"pass"}
    # the permutation laws do not hold under a position bias: n/a, never a FAIL
    assert _verdicts(layer, ("query_permutation",)) == {"query_permutation": "n/a"}


@pytest.mark.deep
def test_a_bias_with_queries_and_keys_swapped_fails_the_oracle() -> None:
    assert _verdicts("WindowTableTransposed", ("oracle_agreement", "head_split")) == {
        "oracle_agreement": "fail", "head_split": "fail"}


@pytest.mark.parametrize(("layer", "step"), [
    ("WindowTableWholeIndex", "besides, it takes a relative-position table (relative_position_bias_table (49, 2))"),
    ("BucketLocal", "no table or window the harness reads accounts for, a step beyond"),
])
def test_a_window_no_table_accounts_for_is_refused_by_name(layer: str, step: str) -> None:
    with pytest.raises(TargetError) as info:
        load_target(FIXTURE + layer)
    message = str(info.value)
    assert "its window of positions (window_size)" in message and step in message
    assert message.endswith("so it cannot be verified yet")


@pytest.mark.parametrize(("line", "kind"), [
    ("attn = attn.view(b, w, h, n, n) + mask.unsqueeze(1).unsqueeze(0)", "additive"),
    ("scores = scores + mask.to(scores.dtype)", "additive"),
    ("scores = scores + mask.sum(-1)", None),  # a reduction of the mask is not the mask added
])
def test_a_mask_added_through_reshapes_is_read_as_additive(line: str, kind: str | None) -> None:
    assert read_mask((("its forward", line),), "mask").kind == kind
