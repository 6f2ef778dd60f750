"""Causal alignment as a convention: top-left (SDPA's ``is_causal``, query i sees keys j <= i) or
bottom-right (torch's ``causal_lower_right``, keys j <= i + Lk - Lq: a KV-cache decode step).

The keep-mask is held against torch's own ``CausalBias``; the oracle against SDPA under that bias;
and the gate against layers of each alignment and their one-bug twins (tests/fixtures/causal_align.py),
which only examples with Lq != Lk tell apart."""

from __future__ import annotations

import subprocess
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

from mha_verify.mha.masks import causal_alignment, causal_keep
from mha_verify.mha.reference import attention
from mha_verify.mha.scoring import Scoring
from mha_verify.properties.invariants.window import outside
from mha_verify.properties.protocol import Conventions
from mha_verify.properties.targets.eager import PROBE_SIZES, load_target
from tests.cli_run import run_cli

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = "tests/fixtures/causal_align.py:"
LENGTHS = [(1, 1), (1, 5), (2, 5), (3, 3), (5, 2), (4, 1), (7, 16)]


def _bias(make: object, lq: int, lk: int) -> torch.Tensor:
    with warnings.catch_warnings():  # lower-right with Lq > Lk warns of NaNs (its rows see no key)
        warnings.simplefilter("ignore", UserWarning)
        return make(lq, lk)._materialize()  # type: ignore[operator, no-any-return]


@pytest.mark.parametrize(("lq", "lk"), LENGTHS, ids=[f"Lq{a}-Lk{b}" for a, b in LENGTHS])
def test_causal_keep_is_torchs_causal_bias(lq: int, lk: int) -> None:
    assert torch.equal(causal_keep(lq, lk), _bias(causal_upper_left, lq, lk))
    assert torch.equal(causal_keep(lq, lk, align="top_left"), _bias(causal_upper_left, lq, lk))
    assert torch.equal(causal_keep(lq, lk, align=True), _bias(causal_upper_left, lq, lk))
    assert torch.equal(causal_keep(lq, lk, align="bottom_right"), _bias(causal_lower_right, lq, lk))


def test_a_decode_step_sees_the_whole_cache_bottom_right_only() -> None:
    assert causal_keep(1, 3, align="bottom_right").tolist() == [[True, True, True]]
    assert causal_keep(1, 3).tolist() == [[True, False, False]]
    assert not causal_keep(3, 1, align="bottom_right")[:2].any()  # Lq > Lk: the first Lq - Lk rows see no key


def test_the_causal_convention_takes_an_alignment() -> None:
    assert causal_alignment(True) == "top_left" and causal_alignment(False) is None
    assert Conventions().causal is False
    assert Conventions(causal=True).causal == "top_left"
    for value, expected in ((True, "top_left"), (False, False), ("top_left", "top_left"),
                            ("bottom_right", "bottom_right")):
        assert Conventions().declare({"causal": value}).causal == expected
    for bad in ("lower_right", "true", 1, None):
        with pytest.raises(ValueError, match="causal"):
            Conventions().declare({"causal": bad})
    with pytest.raises(ValueError, match="got causal='upper'"):
        Conventions(causal="upper")


@pytest.mark.parametrize(("lq", "lk"), [(1, 5), (2, 5), (5, 2), (4, 4)], ids=["decode", "prefill", "Lq>Lk", "same"])
def test_the_oracle_is_sdpa_under_torchs_lower_right_bias(lq: int, lk: int) -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 4, generator=gen, dtype=torch.float64) for n in (lq, lk, lk))
    got, weights = attention(q, k, v, causal="bottom_right")
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=_bias(causal_lower_right, lq, lk))
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)  # SDPA: zeros on rows with no key
    assert torch.equal(weights.sum(-1) > 0, _bias(causal_lower_right, lq, lk).any(-1).expand(2, 3, lq))


def test_a_causal_window_ends_at_each_querys_own_key() -> None:
    lq, lk, w = 3, 7, 2
    inside = Scoring(window=w).keep(lq, lk, "bottom_right")
    assert inside is not None
    assert torch.equal(~inside, outside(lq, lk, w, "bottom_right"))
    assert inside.tolist()[-1] == [False] * 5 + [True, True]  # the last query: the last w keys
    assert torch.equal(outside(lq, lk, w, True), outside(lq, lk, w, "top_left"))


@pytest.mark.parametrize(("layer", "causal", "how"), [
    ("BottomRight", "bottom_right", "causal_lower_right"),
    ("BottomRightUndeclared", "bottom_right", "causal_lower_right"),  # read from its forward alone
    ("DecodeStepIsCausal", "bottom_right", "is_causal=True"),  # declared; its source says top-left
    ("TopLeft", "top_left", "is_causal=True"),
    ("TopLeftLowerRight", "top_left", "causal_lower_right"),
])
def test_the_alignment_is_declared_or_read_and_examples_have_keys_of_their_own(layer: str, causal: str,
                                                                                how: str) -> None:
    conv = load_target(FIXTURE + layer).build(*PROBE_SIZES).conventions
    assert conv.causal == causal
    assert any(how in note for note in conv.notes), conv.notes
    assert conv.cross_attention  # Lq != Lk drawn: where the two alignments differ


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("check", "--no-export", "--profile", "ci", "--max-examples", "25", *args)


@pytest.mark.deep
@pytest.mark.parametrize("layer", ["BottomRight", "BottomRightUndeclared", "TopLeft"])
def test_a_correct_layer_of_either_alignment_passes_the_gate(layer: str) -> None:
    run = cli("--target", FIXTURE + layer)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "0 failed" in run.stdout


@pytest.mark.deep
@pytest.mark.parametrize(("layer", "caught", "example"), [
    ("DecodeStepIsCausal", "oracle_agreement", "B=1 Lq=1 Lk=2"),  # the decode bug: one query, the first key only
    ("TopLeftLowerRight", "oracle_agreement", "B=1 Lq=3 Lk=2"),
    ("TopLeftLowerRight", "prefix_consistency", "B=1 Lq=3 Lk=2"),
])
def test_a_twin_of_the_other_alignment_fails(layer: str, caught: str, example: str) -> None:
    run = cli("--target", FIXTURE + layer, "--only", caught)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
    assert f"FAILED properties/{caught}" in run.stdout
    assert f"example: {example} " in run.stdout, run.stdout[-3000:]
