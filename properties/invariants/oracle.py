"""Invariants against the reference formulas: oracle agreement, heads in isolation, gradcheck."""

from __future__ import annotations

import dataclasses
import math

import torch
from hypothesis import strategies as st

from mha_verify.mha.reference import (
    MHAParams,
    concat_heads,
    one_head,
    output_projection,
    rounding_bound,
    same_precision,
)
from mha_verify.mha.tolerance import compare, tolerance_for
from mha_verify.properties.engine.applicable import comparable_rows, examples_for
from mha_verify.properties.engine.call_path import target_side, weights_if_any
from mha_verify.properties.engine.measure import UNCHECKED, Measure, Violation, ensure, oracle, worst
from mha_verify.properties.engine.registry import invariant
from mha_verify.properties.protocol import Conventions, Instance, NotApplicable
from mha_verify.properties.strategies.examples import AttnExample
from mha_verify.properties.strategies.size_cases import sizes


@invariant("oracle_agreement", reach="full", needs_oracle=True)
def oracle_agreement(bound: Instance, ex: AttnExample) -> Measure:
    """The target agrees with the float64 formula evaluated with the target's own weights.

    out = Concat_h(softmax(Q_h K_h^T s + M) V_h) W_o^T + b_o with Q_h = (q W_q^T + b_q)_h
    etc. and s = 1/sqrt(Hd) or the declared scale, in float64 (with the target's causality,
    grouped key/value heads and declared fully-masked convention). Allowed error:
    multiple * |same-precision formula - float64| + floor (mha.tolerance), beyond each
    element's first-order bound of rounding the scores in the dtype
    (``mha.reference.rounding_bound``: near-tied scores, negligible elsewhere). Where
    the target returns weights, they are held to the same rule.
    """
    ref, ref_w, same = oracle(bound, ex)
    out = bound(ex.q, ex.k, ex.v, ex.mask)
    if out.shape != ref.shape:
        raise Violation(f"output shape {tuple(out.shape)}, but should be {tuple(ref.shape)}")
    conv = bound.conventions
    moved, moved_w = rounding_bound(ex.q, ex.k, ex.v, bound.params(), bound.n_head, ex.mask, dtype=ex.q.dtype,
                                    causal=conv.causal, scoring=conv.scoring)
    measure = ensure(compare(out, ref, same, ex.q.dtype, moved), "output vs float64 oracle")
    got = weights_if_any(bound, ex.q, ex.k, ex.v, ex.mask)
    if got is not None:
        weights = got[1]
        if weights.shape != ref_w.shape:
            raise Violation(f"weights shape {tuple(weights.shape)}, but should be (B, H, Lq, Lk)={tuple(ref_w.shape)}")
        same_w = same_precision(ex.q, ex.k, ex.v, bound.params(), bound.n_head, ex.mask, dtype=ex.q.dtype,
                                oracle=ref, causal=conv.causal, fully_masked=conv.fully_masked, scoring=conv.scoring)[1]
        ensure(compare(weights, ref_w, same_w, ex.q.dtype, moved_w), "attention weights vs float64 oracle")
    return measure


def _editable(conv: Conventions) -> st.SearchStrategy[AttnExample] | str:
    if conv.sizes is not None:
        return "the target's weights are fixed in its graph: its output projection cannot be restricted to one head"
    if conv.scoring.coupled_heads:
        return "q or k is normalized over all heads at once: no head is computed alone"
    return examples_for(conv)


def _heads_to_check(n_head: int, seed: int) -> list[int]:
    """First, last and up to two more heads (all of them when H <= 4)."""
    if n_head <= 4:
        return list(range(n_head))
    middle = torch.randperm(n_head - 2, generator=torch.Generator().manual_seed(seed))[:2] + 1
    return sorted({0, n_head - 1, *(int(i) for i in middle)})


@invariant("head_split", strategy=_editable, reach="full", needs_oracle=True)
def head_split(bound: Instance, ex: AttnExample) -> Measure:
    """Each head of the target computes head_i = Attention(q W_i^Q, k W_i^K, v W_i^V) with its own slices.

    With W_o restricted to head i's columns (the others zeroed), the target's output is
    head_i W_o[:, i*Hd:(i+1)*Hd]^T + b_o, where head_i is computed alone from the slices W_i
    of the packed weights (the paper's per-head formulation; for grouped-query attention, key
    head i // g). Checked for the first, the last and two more heads of every example, so
    reversed, shuffled, chunked or cross-mixed heads fail with the head they broke, where
    ``oracle_agreement`` only sees that the whole output is wrong. Allowed error as there: the
    derived tolerance beyond each element's bound of rounding the scores.
    """
    conv = bound.conventions
    hd = ex.sizes.head_dim
    ref, _, same = oracle(bound, ex)
    full = compare(same, ref, same, ex.q.dtype)
    whole = tolerance_for(ex.q.dtype).allowed(full.ref_error, full.scale)
    measures = []
    isolated = bound.fresh()  # one copy; its w_o is restricted to one head at a time
    # every head then the restricted W_o, as the target computes it: the heads do not depend on W_o
    concat_same, _ = concat_heads(ex.q, ex.k, ex.v, isolated.params(), bound.n_head, ex.mask, dtype=ex.q.dtype,
                                  causal=conv.causal, fully_masked=conv.fully_masked, scoring=conv.scoring)
    w_o = isolated.params().w_o
    original = None if w_o is None else w_o.detach().clone()
    for i in _heads_to_check(bound.n_head, ex.seed):
        cols = slice(i * hd, (i + 1) * hd)
        if w_o is not None and original is not None:
            with torch.no_grad():
                w_o.zero_()
                w_o[:, cols] = original[:, cols]
            edited = isolated.params().w_o
            assert edited is not None
            if bool(edited[:, :cols.start].any()) or bool(edited[:, cols.stop:].any()):
                raise NotApplicable("the adapter's w_o is a copy of the layer's weight: head isolation cannot edit it")
        p = isolated.params()
        head = one_head(ex.q, ex.k, ex.v, p, bound.n_head, i, ex.mask, causal=conv.causal,
                        fully_masked=conv.fully_masked, scoring=conv.scoring)  # (B, Lq, Hd) float64
        same = one_head(ex.q, ex.k, ex.v, p, bound.n_head, i, ex.mask, dtype=ex.q.dtype, causal=conv.causal,
                        fully_masked=conv.fully_masked, scoring=conv.scoring)
        expected = _project(head, p, cols)
        # calibrated by the larger same-precision error of the two ways a layer computes this:
        # head i alone, or every head then the restricted W_o (as the target does)
        packed_same = output_projection(concat_same, p.to(ex.q.dtype))
        expected_same = max((_project(same, p, cols), packed_same),
                            key=lambda t: float((t.double() - expected).abs().max()))
        out = isolated(ex.q, ex.k, ex.v, ex.mask)
        # beyond each element's bound of rounding the scores, as oracle_agreement: through the
        # restricted W_o it is head i's (at scores of 1e4, near-ties move by ~1e-3 in float32)
        moved, _ = rounding_bound(ex.q, ex.k, ex.v, p, bound.n_head, ex.mask, dtype=ex.q.dtype, causal=conv.causal,
                                  scoring=conv.scoring)
        comparison = compare(out, expected, expected_same, ex.q.dtype, moved)
        # a head's output carries the rounding of the scores of the whole layer (the softmax
        # amplifies it with the magnitude of the scores): never allow less than the whole output's
        comparison = dataclasses.replace(comparison, allowed=max(comparison.allowed, whole))
        if math.isfinite(comparison.allowed) and not comparison.ok:
            raise Violation(f"head {i} of {bound.n_head} (output projection restricted to its columns) vs head {i} "
                            f"computed alone with its slices W_i: {comparison}"
                            f"{_best_match(out, ex, p, bound.n_head, i, conv)}", comparison.error, comparison.allowed)
        measures.append(ensure(comparison, f"head {i}"))
    return worst(*measures)


def _project(head: torch.Tensor, p: MHAParams, cols: slice) -> torch.Tensor:
    """head (B, Lq, Hd) -> (B, Lq, D): through W_o's columns ``cols`` plus b_o (no projection: placed at cols)."""
    if p.w_o is None:
        out = torch.zeros(*head.shape[:-1], p.w_q.shape[0], dtype=head.dtype)
        out[..., cols] = head
        return out if p.b_o is None else out + p.b_o.detach().to(head.dtype)
    w = p.w_o.detach().to(head.dtype)[:, cols]
    out = head @ w.transpose(0, 1)
    return out if p.b_o is None else out + p.b_o.detach().to(head.dtype)


def _best_match(out: torch.Tensor, ex: AttnExample, p: MHAParams, n_head: int, i: int, conv: Conventions) -> str:
    """'; it matches head j best' when another head's formula explains the output better."""
    cols = slice(i * ex.sizes.head_dim, (i + 1) * ex.sizes.head_dim)
    # the likely culprits only (this runs on every shrink step): reversed, neighbours, first, last
    candidates = sorted({i, n_head - 1 - i, max(i - 1, 0), min(i + 1, n_head - 1), 0, n_head - 1})
    errors = {}
    for j in candidates:
        head = one_head(ex.q, ex.k, ex.v, p, n_head, j, ex.mask, causal=conv.causal, fully_masked=conv.fully_masked,
                        scoring=conv.scoring)
        errors[j] = float((out.detach().double() - _project(head, p, cols)).abs().max())
    j = min(errors, key=lambda n: errors[n])
    return f"; it matches head {j} computed alone best (error {errors[j]:.3g})" if j != i else ""


def _small(conv: Conventions) -> st.SearchStrategy[AttnExample] | str:
    return examples_for(conv, shapes=sizes(max_batch=2, max_len=3, max_heads=2, max_head_dim=4),
                        dtype=torch.float64, scales=st.just(1.0), large_negatives=False)


@invariant("gradcheck", strategy=_small, dtype=torch.float64, needs_grads=True)
def gradcheck(bound: Instance, ex: AttnExample) -> Measure:
    """Analytical gradients w.r.t. q, k and v match finite differences (float64, small sizes).

    torch.autograd.gradcheck (fast mode: random projections of the Jacobian) with eps=1e-6,
    atol=1e-5, rtol=1e-3 on every output row, fully masked rows included; only a target
    that declares a convention other than zeros there (NaN, uniform) has those rows left
    out. The target is built in float64.
    """
    conv = bound.conventions
    cross = conv.cross_attention
    rows = comparable_rows(ex, conv.causal) if conv.fully_masked != "zeros" else torch.ones(
        ex.sizes.batch, ex.sizes.lq, dtype=torch.bool)
    if not bool(rows.any()):
        return UNCHECKED
    q = ex.q.clone().requires_grad_(True)
    inputs: tuple[torch.Tensor, ...]
    if cross and ex.v is ex.k:  # keys = values, one argument: one input
        inputs = (q, ex.k.clone().requires_grad_(True))

        def fn(*t: torch.Tensor) -> torch.Tensor:
            return bound(t[0], t[1], t[1], ex.mask)[rows]
    elif cross:
        k, v = ex.k.clone().requires_grad_(True), ex.v.clone().requires_grad_(True)
        inputs = (q, k, v)

        def fn(*t: torch.Tensor) -> torch.Tensor:
            return bound(t[0], t[1], t[2], ex.mask)[rows]
    else:
        inputs = (q,)

        def fn(*t: torch.Tensor) -> torch.Tensor:
            return bound(t[0], t[0], t[0], ex.mask)[rows]

    try:
        with target_side():  # torch's gradcheck of the target's forward and backward
            ok = torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-3, fast_mode=True)
    except NotApplicable:
        raise
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise Violation(f"gradcheck failed: {first}") from None
    if not ok:
        raise Violation("gradcheck returned False")
    return Measure()
