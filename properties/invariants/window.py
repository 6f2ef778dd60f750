"""Sliding windows: a key outside a query's window does not reach that query's output.

A target with a window of W keys (:mod:`mha.scoring`: query i sees keys i - W < j <= i under a
causal mask, |i - j| < W without one) is checked here besides ``oracle_agreement``, which
applies the window exactly: changing the key and value at one position j leaves every output
row whose window excludes j as it was. A window one key too wide fails both; this one says
which row saw a key it should not have.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from mha_verify.mha.masks import causal_offset
from mha_verify.properties.engine.applicable import comparable_rows, examples_for
from mha_verify.properties.engine.measure import Measure, close, relation_allowed
from mha_verify.properties.engine.registry import invariant
from mha_verify.properties.protocol import Conventions, Instance
from mha_verify.properties.strategies.examples import AttnExample

#: the longest sequence the strategies draw (``strategies.sizes``' max_len)
_MAX_LEN = 300


def _windowed(conv: Conventions) -> st.SearchStrategy[AttnExample] | str:
    if conv.window is None:
        return "no sliding window declared or read: every key may reach every query"
    if conv.window + 1 > _MAX_LEN:
        return f"a window of {conv.window} keys is wider than the longest sequence drawn ({_MAX_LEN})"
    return examples_for(conv, min_len=conv.window + 1)


def outside(lq: int, lk: int, window: int, causal: bool | str) -> torch.Tensor:
    """bool (Lq, Lk): key j lies outside query i's window (or, causal, in its future; query i at key
    position i + Lk - Lq when ``causal`` is "bottom_right")."""
    i, j = torch.arange(lq)[:, None], torch.arange(lk)[None, :]
    if not causal:
        return ~((i - j).abs() < window)
    at = i + causal_offset(lq, lk, causal)  # (Lq, 1): each query's own key position
    return ~((j <= at) & (j > at - window))


@invariant("window_locality", strategy=_windowed)
def window_locality(bound: Instance, ex: AttnExample) -> Measure:
    """Changing the key and value at position j leaves the rows whose window excludes j unchanged.

    For a position j drawn from the example's seed among those outside some query's window:
    out(k', v')[:, i] = out(k, v)[:, i] for every query i that must not see key j, within twice
    the derived tolerance. A self-attention target changes x at j (its query j too, which is
    inside its own window).
    """
    conv = bound.conventions
    assert conv.window is not None
    lq, lk = ex.sizes.lq, ex.sizes.lk
    far = outside(lq, lk, conv.window, conv.causal)  # (Lq, Lk)
    candidates = [j for j in range(lk) if bool(far[:, j].any())]
    j = candidates[int(torch.randint(0, len(candidates), (1,), generator=torch.Generator().manual_seed(ex.seed)))]
    gen = torch.Generator().manual_seed(ex.seed + 11)

    def changed(x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        noise = torch.randn(y[:, j].shape, generator=gen, dtype=torch.float64) * 3.0
        y[:, j] = noise.to(y.dtype) * x.detach().abs().amax().clamp(min=1.0)
        return y

    out = bound(ex.q, ex.k, ex.v, ex.mask)
    if conv.cross_attention:
        k2 = changed(ex.k)
        v2 = k2 if ex.v is ex.k else changed(ex.v)  # keys = values, one argument: changed together
        out2 = bound(ex.q, k2, v2, ex.mask)
    else:
        x = changed(ex.q)
        out2 = bound(x, x, x, ex.mask)
    rows = far[:, j].expand(ex.sizes.batch, lq)  # (B, Lq)
    if conv.fully_masked != "zeros":  # NaN or uniform rows are fully_masked_rows' to judge
        rows = rows & comparable_rows(ex, conv.causal) & torch.isfinite(out.detach()).all(-1)
    return close(out2, out, relation_allowed(bound, ex),
                 f"rows outside key {j}'s window (window {conv.window}) after changing key {j} vs before", rows=rows)
