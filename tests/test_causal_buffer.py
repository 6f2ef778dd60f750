"""A layer sliced to its own causal buffer takes no sequence longer than the buffer: its size is read as
the layer's maximum length and every example is drawn within it (the held-out corpus's nanoGPT-style
layer failed batch_independence at L = 257, past its buffer of 128); its twin whose buffer hides the
diagonal still fails."""

from __future__ import annotations

import pytest

from mha_verify.properties.engine.profiles import PROFILES
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.protocol import Conventions
from mha_verify.properties.targets.eager import load_target

FIXTURE = "tests/fixtures/causal_buffer_layers.py:"


def _verdict(name: str, check: str) -> str:
    return run_property(all_properties()[check], load_target(FIXTURE + name), settings=PROFILES["ci"],
                        seed=0).verdict


@pytest.mark.deep
def test_the_buffer_size_is_the_longest_length_drawn() -> None:
    conv = load_target(FIXTURE + "SlicedBuffer").build(8, 2).conventions
    assert conv.max_length == 24 and conv.causal == "top_left"
    assert any("lengths up to 24: its causal buffer 'bias' (1, 1, 24, 24)" in n for n in conv.notes), conv.notes
    for check in ("batch_independence", "oracle_agreement", "no_future_leak", "prefix_consistency"):
        assert _verdict("SlicedBuffer", check) == "pass", check


@pytest.mark.deep
def test_its_twin_hiding_the_diagonal_still_fails() -> None:
    assert _verdict("SlicedBufferNoDiagonal", "oracle_agreement") == "fail"


def test_the_longest_length_is_declarable_and_checked() -> None:
    assert Conventions().declare({"max_length": 12}).max_length == 12
    with pytest.raises(ValueError, match="max_length=0"):
        Conventions().declare({"max_length": 0})
