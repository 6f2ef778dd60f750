"""Tail bounds for counts of independent Bernoulli trials: the false-alarm rate of a statistical check is
stated, and its threshold follows from it (never a margin picked by hand).

Exact binomial tails are summed in log space, so counts of tens of thousands of trials neither
underflow nor lose the far tail a small false-alarm rate lives in.
"""

from __future__ import annotations

import math


def _check(k: int, n: int, prob: float) -> None:
    if not (isinstance(n, int) and n >= 1 and isinstance(k, int) and 0 <= k <= n):
        raise ValueError(f"need integers 0 <= k <= n and n >= 1, got k={k!r}, n={n!r}")
    if not 0.0 < prob < 1.0:
        raise ValueError(f"prob must be in (0, 1), got prob={prob!r}")


def _log_pmf(i: int, n: int, prob: float) -> float:
    return (math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
            + i * math.log(prob) + (n - i) * math.log1p(-prob))


def _log_sum(terms: list[float]) -> float:
    top = max(terms)
    return top + math.log(sum(math.exp(t - top) for t in terms))


def binomial_tail(k: int, n: int, prob: float, *, upper: bool) -> float:
    """P(X >= k) (``upper``) or P(X <= k) for X ~ Binomial(n, prob)."""
    _check(k, n, prob)
    span = range(k, n + 1) if upper else range(k + 1)
    return min(1.0, math.exp(_log_sum([_log_pmf(i, n, prob) for i in span])))


def binomial_two_sided(k: int, n: int, prob: float) -> float:
    """The two-sided p-value of ``k`` successes in ``n`` trials of probability ``prob``: twice the
    smaller tail, P(X <= k) or P(X >= k), capped at 1 (the central tail method)."""
    return min(1.0, 2.0 * min(binomial_tail(k, n, prob, upper=False), binomial_tail(k, n, prob, upper=True)))


def hoeffding_radius(n: int, width: float, alpha: float) -> float:
    """r such that the mean of ``n`` independent values in an interval of ``width`` strays from its
    expectation by more than r with probability at most ``alpha`` (Hoeffding, two-sided)."""
    if not (isinstance(n, int) and n >= 1) or not width > 0 or not 0.0 < alpha < 1.0:
        raise ValueError(f"need n >= 1, width > 0 and 0 < alpha < 1, got n={n!r}, width={width!r}, alpha={alpha!r}")
    return width * math.sqrt(math.log(2.0 / alpha) / (2.0 * n))


__all__ = ["binomial_tail", "binomial_two_sided", "hoeffding_radius"]
