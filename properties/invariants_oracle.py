"""Invariants against the reference formulas: oracle agreement, head split, gradcheck."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from mha.reference import multi_head, per_head
from mha.tolerance import compare
from properties.adapters import Conventions, NotApplicable
from properties.checks import Measure, Violation, clean_rows, close, ensure, examples_for, oracle
from properties.registry import invariant
from properties.strategies import AttnExample, sizes
from properties.targets import Bound


@invariant("oracle_agreement")
def oracle_agreement(bound: Bound, ex: AttnExample) -> Measure:
    """The target agrees with the float64 formula evaluated with the target's own weights.

    out = Concat_h(softmax(Q_h K_h^T / sqrt(Hd) + M) V_h) W_o^T + b_o, with Q_h = (q W_q^T + b_q)_h
    etc., in float64. Allowed error: multiple * |same-precision formula - float64| + floor
    (mha.tolerance). Where the target returns weights, they are held to the same rule.
    """
    ref, ref_w, same = oracle(bound, ex)
    out = bound(ex.q, ex.k, ex.v, ex.mask)
    if out.shape != ref.shape:
        raise Violation(f"output shape {tuple(out.shape)}, but should be {tuple(ref.shape)}")
    measure = ensure(compare(out, ref, same, ex.q.dtype), "output vs float64 oracle")
    got = bound.with_weights_if_any(ex.q, ex.k, ex.v, ex.mask)
    if got is not None:
        weights = got[1]
        if weights.shape != ref_w.shape:
            raise Violation(f"weights shape {tuple(weights.shape)}, but should be (B, H, Lq, Lk)={tuple(ref_w.shape)}")
        same_w = multi_head(ex.q, ex.k, ex.v, bound.params(), bound.n_head, ex.mask, dtype=ex.q.dtype)[1]
        ensure(compare(weights, ref_w, same_w, ex.q.dtype), "attention weights vs float64 oracle")
    return measure


@invariant("head_split")
def head_split(bound: Bound, ex: AttnExample) -> Measure:
    """One D x D projection split into heads equals per-head projections with slices W_i.

    (x W^T)[..., i*Hd:(i+1)*Hd] = x W_i^T for every head i, so the packed formula equals
    Concat_i(Attention(q W_i^Q, k W_i^K, v W_i^V)) W_o (checked in float64 to 1e-9 relative),
    and the target equals that per-head formulation within the derived tolerance, calibrated
    by the larger same-precision error of the two formulations (the target may compute
    either way).
    """
    params = bound.params()
    packed, _ = multi_head(ex.q, ex.k, ex.v, params, bound.n_head, ex.mask)
    heads = per_head(ex.q, ex.k, ex.v, params, bound.n_head, ex.mask)
    close(heads, packed, 1e-9 * (1.0 + float(packed.abs().max())), "per-head formulation vs packed (float64)")
    same_heads = per_head(ex.q, ex.k, ex.v, params, bound.n_head, ex.mask, dtype=ex.q.dtype)
    same_packed, _ = multi_head(ex.q, ex.k, ex.v, params, bound.n_head, ex.mask, dtype=ex.q.dtype)
    worse = max((same_heads, same_packed), key=lambda t: float((t.double() - heads).abs().max()))
    out = bound(ex.q, ex.k, ex.v, ex.mask)
    return ensure(compare(out, heads, worse, ex.q.dtype), "target vs per-head formulation")


def _small(conv: Conventions) -> st.SearchStrategy[AttnExample] | str:
    return examples_for(conv, shapes=sizes(max_batch=2, max_len=3, max_heads=2, max_head_dim=4),
                        dtype=torch.float64, scales=st.just(1.0))


@invariant("gradcheck", strategy=_small, dtype=torch.float64)
def gradcheck(bound: Bound, ex: AttnExample) -> Measure:
    """Analytical gradients w.r.t. q, k and v match finite differences (float64, small sizes).

    torch.autograd.gradcheck (fast mode: random projections of the Jacobian) with eps=1e-6,
    atol=1e-5, rtol=1e-3 on the output rows that are not fully masked; the
    target is built in float64.
    """
    cross = bound.conventions.cross_attention
    # rows with a fully masked head are left out only where the target declares NaN there
    rows = clean_rows(ex) if bound.conventions.fully_masked != "zeros" else torch.ones(
        ex.sizes.batch, ex.sizes.lq, dtype=torch.bool)
    if not bool(rows.any()):
        return Measure()
    q = ex.q.clone().requires_grad_(True)
    if cross:
        k, v = ex.k.clone().requires_grad_(True), ex.v.clone().requires_grad_(True)
        inputs: tuple[torch.Tensor, ...] = (q, k, v)

        def fn(*t: torch.Tensor) -> torch.Tensor:
            return bound(t[0], t[1], t[2], ex.mask)[rows]
    else:
        inputs = (q,)

        def fn(*t: torch.Tensor) -> torch.Tensor:
            return bound(t[0], t[0], t[0], ex.mask)[rows]

    try:
        ok = torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-3, fast_mode=True)
    except NotApplicable:
        raise
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise Violation(f"gradcheck failed: {first}") from None
    if not ok:
        raise Violation("gradcheck returned False")
    return Measure()
