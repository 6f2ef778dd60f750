"""Sequence-first layers (fairseq's (T, B, C)): the layout is read by a probe at load, declared where the
probe cannot read it, and the adapter transposes (tests/fixtures/seq_first_layers.py)."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch

from mha_verify.properties.adapters.layout_probe import read_layout
from mha_verify.properties.engine import profiles
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.targets.eager import load_target
from tests.fixtures.seq_first_layers import SeqFirst

FIXTURE = "tests/fixtures/seq_first_layers.py:"
SETTINGS = profiles.PROFILES["quick"]
PROPS = all_properties()


class DeclaredBatchFirst(SeqFirst):
    """A wrong declaration wins over the probe: the layer is then called as declared."""

    mha_verify_conventions: ClassVar[dict[str, object]] = {"layout": "batch_first"}


def test_the_probe_reads_each_layout() -> None:
    seq = load_target(FIXTURE + "SeqFirst").build(16, 2).conventions
    assert seq.layout == "seq_first" and any("read by a probe" in n for n in seq.notes)
    assert "sequence first (L, B, D)" in seq.describe()
    batch = load_target("tests/fixtures/key_padding_layers.py:KeyPadded").build(16, 2).conventions
    assert batch.layout == "batch_first"
    assert load_target().build(16, 2).conventions.layout == "batch_first"  # the reference


def test_a_forward_the_probe_cannot_call_is_read_as_batch_first() -> None:
    def fails(x: torch.Tensor) -> torch.Tensor:
        raise TypeError("needs more than x")

    assert read_layout(torch.nn.Linear(4, 4), fails, 4, torch.float32) == ("batch_first", "")


@pytest.mark.parametrize("name", ["oracle_agreement", "batch_independence", "query_permutation", "key_permutation",
                                  "masked_kv_invariance", "grad_agreement"])
def test_a_sequence_first_layer_passes_called_in_its_layout(name: str) -> None:
    result = run_property(PROPS[name], load_target(FIXTURE + "SeqFirst"), settings=SETTINGS)
    assert result.verdict == "pass" and result.examples > 0, result


@pytest.mark.deep
def test_its_twin_still_fails() -> None:
    result = run_property(PROPS["oracle_agreement"], load_target(FIXTURE + "SeqFirstUnscaled"), settings=SETTINGS)
    assert result.verdict == "fail", result


@pytest.mark.deep
def test_a_declared_layout_wins() -> None:
    bound = load_target("tests.test_seq_first:DeclaredBatchFirst").build(16, 2)
    assert bound.conventions.layout == "batch_first"
    result = run_property(PROPS["batch_independence"], load_target("tests.test_seq_first:DeclaredBatchFirst"),
                          settings=SETTINGS)
    assert result.verdict == "fail", result
