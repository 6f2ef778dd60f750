"""A layer built for self-attention that refuses the context its forward declares optional
(tests/fixtures/optional_context_layers.py) is verified as self-attention, said in its conventions, where
it used to raise on every call; its one-bug twin fails; the same layer built for cross-attention keeps
taking the context."""

from __future__ import annotations

import pytest

from mha_verify.properties.engine.profiles import PROFILES
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.targets.eager import load_target

FIXTURE = "tests/fixtures/optional_context_layers.py:"


def _verdict(name: str, check: str) -> str:
    return run_property(all_properties()[check], load_target(FIXTURE + name), settings=PROFILES["quick"],
                        seed=0).verdict


@pytest.mark.deep
def test_a_context_the_layer_refuses_as_built_is_not_given_and_said() -> None:
    conventions = load_target(FIXTURE + "LookLike").build(8, 2).conventions
    assert not conventions.cross_attention
    notes = "; ".join(conventions.notes)
    assert ("forward(x, context=x) raised AssertionError where forward(x) runs: built for self-attention, "
            "verified as self-attention (context not given)") in notes
    # its own norm (an affine-free LayerNorm child times 1 + gamma) is applied by the oracle
    assert "its input normalized first by norm (LayerNorm over D, x (1 + w), eps 1e-05), applied by the oracle" \
        in notes
    for check in ("oracle_agreement", "head_split", "batch_independence"):
        assert _verdict("LookLike", check) == "pass", check
    assert _verdict("LookLikeKeysFromValues", "oracle_agreement") == "fail"


def test_the_same_layer_built_for_cross_attention_takes_its_context() -> None:
    conventions = load_target(FIXTURE + "LookLikeCross").build(8, 2).conventions
    assert conventions.cross_attention and conventions.kv_shared
    assert "raised AssertionError" not in "; ".join(conventions.notes)
    assert _verdict("LookLikeCross", "oracle_agreement") == "pass"
