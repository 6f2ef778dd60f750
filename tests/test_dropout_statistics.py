"""Dropout statistics: the law of the masks a layer draws in training mode, read back through its own
projections, on the layers of tests/fixtures/dropout_twins.py and their one-bug twins, torch's and our
own modules, and layers of timm's and GPT-2's kind that drop at two sites."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
import torch

from mha_verify.properties.engine.binomial import binomial_tail, binomial_two_sided, hoeffding_radius
from mha_verify.properties.engine.measure import Violation
from mha_verify.properties.invariants.dropout import P, _readable, dropout_statistics
from mha_verify.properties.strategies.examples import make_example
from mha_verify.properties.strategies.masks import MaskSpec
from mha_verify.properties.strategies.size_cases import Sizes
from mha_verify.properties.targets.eager import load_target

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = "tests/fixtures/dropout_twins.py:"
NO_MASK = MaskSpec("none", "BHLL", "bool", 0)


def _example(d: int, h: int, seed: int = 0):  # type: ignore[no-untyped-def]
    return _readable(make_example(Sizes(1, 8, 8, d, h), NO_MASK, (1.0,), seed))


def _exact_tail(k: int, n: int, prob: Fraction, upper: bool) -> float:
    span = range(k, n + 1) if upper else range(k + 1)
    return float(sum(math.comb(n, i) * prob ** i * (1 - prob) ** (n - i) for i in span))


@pytest.mark.parametrize(("k", "n"), [(0, 1), (3, 10), (7, 10), (40, 60), (0, 200), (200, 200)])
def test_binomial_tails_agree_with_exact_rational_sums(k: int, n: int) -> None:
    prob = Fraction(7, 10)
    for upper in (True, False):
        assert binomial_tail(k, n, 0.7, upper=upper) == pytest.approx(_exact_tail(k, n, prob, upper), rel=1e-9)
    both = 2 * min(_exact_tail(k, n, prob, True), _exact_tail(k, n, prob, False))
    assert binomial_two_sided(k, n, 0.7) == pytest.approx(min(1.0, both), rel=1e-9)


def test_tail_bounds_reach_far_tails_and_name_bad_arguments() -> None:
    # 10,000 trials all kept at 0.7: 0.7 ** 10000 = 1e-1549 underflows a float; its log does not
    assert binomial_tail(10000, 10000, 0.7, upper=True) == 0.0
    assert 0 < binomial_tail(7300, 10000, 0.7, upper=True) < 1e-10
    assert hoeffding_radius(2000, 1.0, 1e-7) == pytest.approx(math.sqrt(math.log(2e7) / 4000))
    with pytest.raises(ValueError, match="k=11, n=10"):
        binomial_tail(11, 10, 0.5, upper=True)
    with pytest.raises(ValueError, match=r"prob=1\.0"):
        binomial_two_sided(1, 10, 1.0)
    with pytest.raises(ValueError, match="alpha=0"):
        hoeffding_radius(10, 1.0, 0)


@pytest.mark.parametrize(("layer", "d", "h"), [
    ("Dropped", 64, 4), ("OutputDropped", 64, 4), ("BothDropped", 64, 4), ("Dropped", 16, 1),
])
def test_correct_layers_keep_their_law_on_many_seeds(layer: str, d: int, h: int) -> None:
    """20 seeds of a correct layer: a false alarm has probability at most 20 * 18 * 1e-7 = 3.6e-5 (two sites)."""
    bound = load_target(FIXTURE + layer).build(d, h)
    for seed in range(20):
        m = dropout_statistics(bound, _example(d, h, seed))
        assert m.checked and m.finding is None and 0 < m.allowed < 0.2 and m.error <= m.allowed, (seed, m)


@pytest.mark.parametrize(("layer", "message"), [
    ("SharedAcrossHeads", "not independent across heads: pairs of heads agree on 512 of 512"),
    ("BothSharedAcrossHeads", "attention weights is not independent across heads"),
    ("NoRescale", "surviving values are scaled by 1, where p=0.3 scales them by 1/(1-p) = 1.429"),
    ("KeepRateP", "keeps 1-p = 70%"),
    ("SharedAcrossBatch", "not independent across batch items"),
    ("SameMaskEveryCall", "not independent across calls"),
])
def test_each_twin_fails_naming_its_law(layer: str, message: str) -> None:
    bound = load_target(FIXTURE + layer).build(64, 4)
    with pytest.raises(Violation, match=re.escape(message)):
        dropout_statistics(bound, _example(64, 4))


def test_the_layer_is_left_in_eval_with_dropout_off_and_the_rng_untouched() -> None:
    bound = load_target(FIXTURE + "Dropped").build(32, 2)
    ex = _example(32, 2)
    before = bound(ex.q, ex.q, ex.q).detach()
    state = torch.random.get_rng_state()
    dropout_statistics(bound, ex)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert bound.module.attn_dropout == 0.0 and not bound.module.training
    torch.testing.assert_close(bound(ex.q, ex.q, ex.q), before, rtol=0, atol=0)


@pytest.mark.parametrize("spec", ["mha_verify.mha:MultiHeadAttention", "torch.nn:MultiheadAttention"])
def test_torch_and_the_reference_drop_weights_by_the_law(spec: str) -> None:
    bound = load_target(spec).build(64, 4)
    m = dropout_statistics(bound, _example(64, 4, seed=5))
    assert m.checked and m.error <= m.allowed


def test_a_dropout_that_does_not_act_is_a_finding_not_a_pass() -> None:
    bound = load_target(FIXTURE + "Dropped").build(32, 2)
    bound.module.keep = lambda shape: torch.ones(shape)  # type: ignore[method-assign]
    m = dropout_statistics(bound, _example(32, 2))
    assert m.finding is not None and m.finding[0] == "ignored" and f"p={P}" in m.finding[1]


@pytest.mark.integration
@pytest.mark.parametrize(("layer", "code"), [("BothDropped", 0), ("SharedAcrossHeads", 1)])
def test_the_gate_passes_the_law_and_fails_a_shared_mask(layer: str, code: int) -> None:
    done = subprocess.run([sys.executable, "-m", "mha_verify.cli", "check", "--no-export", "--profile", "ci",
                           "--target", FIXTURE + layer, "--only", "dropout_statistics"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == code, done.stdout + done.stderr
    assert ("1 passed, 0 failed" if code == 0 else "not independent across heads") in done.stdout
