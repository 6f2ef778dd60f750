"""Behaviour: argument checks, normalized weights, determinism, large inputs, dropout."""

from __future__ import annotations

import linecache
import math
import os

import torch
from hypothesis import strategies as st

from mha_verify.properties.engine.applicable import examples_for, fully_masked, weights_beyond
from mha_verify.properties.engine.measure import (
    UNCHECKED,
    Measure,
    Violation,
    close,
    no_dropout_here,
    oracle,
    relation_allowed,
)
from mha_verify.properties.engine.registry import invariant
from mha_verify.properties.engine.sdpa_calls import UPSTREAM, SdpaCalls, passed_through
from mha_verify.properties.protocol import SELF_ONLY, Conventions, Instance, NotApplicable
from mha_verify.properties.strategies.examples import AttnExample, make_example


def _cross(conv: Conventions) -> st.SearchStrategy[AttnExample] | str:
    if not conv.cross_attention:
        return f"{SELF_ONLY}: forward(x) cannot receive keys and values of different lengths"
    if conv.kv_shared:
        return "keys and values arrive as one argument: they cannot have different lengths"
    return examples_for(conv, kinds=("none",))


@invariant("lk_equals_lv", strategy=_cross)
def lk_equals_lv(bound: Instance, ex: AttnExample) -> Measure:
    """A call with Lk != Lv raises, and never returns a tensor.

    out(q, k (B, Lk, D), v (B, Lk + d, D)) must raise; ValueError/TypeError naming both
    lengths passes, and so does torch's own check refusing them (a RuntimeError from the ``matmul``
    the layer calls, torch MHA's assert: the lengths never reach a result, seed 000 documents that
    error, and no maintainer would repeat torch's check); an exception the layer raises itself in
    another form (an AssertionError, its own RuntimeError) passes with a warning (a raw error).
    """
    lk = ex.sizes.lk
    lv = lk + 1 if lk == 1 or ex.seed % 2 == 0 else lk - 1
    v = torch.cat([ex.v, ex.v], dim=1)[:, :lv]
    sdpa = SdpaCalls()
    try:
        with sdpa:
            out = bound(ex.q, ex.k, v, None)
    except (ValueError, TypeError) as exc:
        if str(lk) in str(exc) and str(lv) in str(exc):
            return Measure()
        return Measure(remark=f"{type(exc).__name__} does not name the lengths: Lk={lk}, Lv={lv} gave {exc}")
    except NotApplicable:
        raise
    except Exception as exc:
        if not _raised_by_layer(exc):
            return Measure()  # refused by torch's own check (an op's shape check, torch MHA's assert)
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        return Measure(remark=f"raised {type(exc).__name__}, not ValueError/TypeError: {first}")
    call = passed_through(sdpa.calls, lk, lv)
    if call is not None:  # torch's SDPA accepted the lengths the layer was given: the defect is torch's
        return Measure(finding=("inherited", (
            f"Lk={lk}, Lv={lv} returned a tensor of shape {tuple(out.shape)} instead of raising, because the layer "
            f"passes them through to torch's SDPA and {call.describe()} returned (torch {torch.__version__}). "
            f"SDPA documents one length S for key and value and does not check it on CPU: {UPSTREAM}. "
            "The layer adds no check of its own")))
    if 1 in (lk, lv) and _refused_by_torch(bound, ex):
        return Measure(finding=("inherited", (
            f"Lk={lk}, Lv={lv} returned a tensor of shape {tuple(out.shape)} instead of raising: an axis of length 1 "
            "is broadcast against the other by the torch op the layer contracts weights and values with "
            "(torch.einsum and elementwise ops broadcast size-1 axes, as NumPy does), while Lk=2, Lv=3 is refused by "
            "that op's "
            "shape check. The layer adds no check of its own")))
    raise Violation(f"Lk={lk}, Lv={lv} returned a tensor of shape {tuple(out.shape)}, but should raise")


def _refused_by_torch(bound: Instance, ex: AttnExample) -> bool:
    """Whether the layer refuses Lk=2, Lv=3 through a torch op's shape check (not its own raise)."""
    k = ex.k[:, [0, 0]]
    v = torch.cat([ex.v, ex.v, ex.v], dim=1)[:, :3]
    try:
        bound(ex.q, k, v, None)
    except NotApplicable:
        raise
    except Exception as exc:
        return not _raised_by_layer(exc)
    return False


def _raised_by_layer(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by a ``raise`` or ``assert`` statement of Python code outside torch,
    rather than by one of torch's ops (a C++ shape check leaves the frame of the line calling it,
    which is no raise; torch's Python functions leave a frame of torch's)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return True
    filename = tb.tb_frame.f_code.co_filename
    if f"{os.sep}torch{os.sep}" in filename:
        return False
    line = linecache.getline(filename, tb.tb_lineno).strip()
    return line.startswith(("raise", "assert"))


def _weights(conv: Conventions) -> st.SearchStrategy[AttnExample] | str:
    if not conv.weights:
        return "the target does not return attention weights"
    return weights_beyond(conv) or examples_for(conv)


@invariant("rows_sum_to_one", strategy=_weights)
def rows_sum_to_one(bound: Instance, ex: AttnExample) -> Measure:
    """Each query row's weights are a distribution over its unmasked keys.

    sum_j weights[b, h, i, j] = 1 for rows with a kept key, 0 for fully masked rows (the
    contract), within 4 * Lk * eps of the dtype; every weight lies in [0, 1].
    """
    _, weights = bound.with_weights(ex.q, ex.k, ex.v, ex.mask)
    w = weights.detach().double()
    if bool((w < 0).any()) or bool((w > 1 + 1e-6).any()):
        raise Violation(f"weights outside [0, 1]: min {float(w.min()):.3g}, max {float(w.max()):.3g}")
    expected = (~fully_masked(ex, bound.conventions.causal)).double()  # (B, H, Lq)
    allowed = 4 * ex.sizes.lk * torch.finfo(ex.q.dtype).eps
    return close(w.sum(dim=-1), expected, allowed, "row sums of the weights (1 where a key is kept, 0 otherwise)")


def _bitwise(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    if not bool(same.all()):
        diff = float((a - b).abs().nan_to_num(math.inf).max())
        raise Violation(f"{what} differs by {diff:.3g}; should be bitwise equal", diff, 0.0)


@invariant("determinism")
def determinism(bound: Instance, ex: AttnExample) -> Measure:
    """In eval mode the output is a function of the inputs alone: no state between calls.

    On one instance: out(x), then out(y) for other inputs y of the same shapes, then out(x)
    again. out(x) twice must be bitwise equal, and out(y) bitwise equal to out(y) on a fresh
    instance with the same weights (call order does not matter).
    """
    other = make_example(ex.sizes, ex.mask_spec, tuple(s * 3.0 for s in ex.scales), ex.seed + 1, ex.q.dtype)
    if not bound.conventions.cross_attention:
        other = other._replace(k=other.q, v=other.q)
    elif ex.v is ex.k:  # keys = values, one argument
        other = other._replace(v=other.k)
    first = bound(ex.q, ex.k, ex.v, ex.mask).detach().clone()
    second = bound(other.q, other.k, other.v, other.mask).detach().clone()
    again = bound(ex.q, ex.k, ex.v, ex.mask).detach()
    _bitwise(again, first, "a second call with the same inputs (after a call with other inputs)")
    fresh = bound.fresh()(other.q, other.k, other.v, other.mask).detach()
    _bitwise(second, fresh, "a call after another call, against the same call on a fresh instance,")
    return Measure()


def _large(conv: Conventions) -> st.SearchStrategy[AttnExample] | str:
    if conv.dtype == torch.float16:
        # 1e3 overflows any float16 evaluation (the projections' scores reach ~1e6); at 100 the
        # pre-scaled scores (q / sqrt(Hd)) k stay near 3e3 while unscaled ones reach the limit
        return examples_for(conv, scales=st.just(100.0))
    return examples_for(conv, scales=st.sampled_from((100.0, 1e3)))


@invariant("finite_large_inputs", strategy=_large, reach="lengths")
def finite_large_inputs(bound: Instance, ex: AttnExample) -> Measure:
    """Finite inputs of large magnitude (1e2 to 1e3; float16: 1e2) give finite outputs.

    Scores then reach ~1e5 and more, where exp() overflows float32 unless the row maximum is
    subtracted before the softmax; in float16, inputs of magnitude 100 give unscaled scores q.k
    near its limit (65504) at head width 128, which a layer must scale before the product. In
    float16 and bfloat16, an example on which the pre-scaled same-precision formula itself is not
    finite is not checked.
    """
    if ex.q.dtype in (torch.float16, torch.bfloat16) and (
            bound.conventions.beyond or not bool(torch.isfinite(oracle(bound, ex)[2]).all())):
        # past what a pre-scaled evaluation in this dtype survives: no layer is held to it (and where
        # the oracle does not model the layer, nothing says what its evaluation should survive)
        return UNCHECKED
    out = bound(ex.q, ex.k, ex.v, ex.mask).detach()
    if not bool(torch.isfinite(out).all()):
        where = tuple(int(i) for i in torch.nonzero(~torch.isfinite(out))[0][:2])
        raise Violation(f"output not finite at (b, i)={where} for inputs of magnitude {max(ex.scales):g}")
    return Measure()


@invariant("dropout_off_in_eval", needs_dropout=True)
def dropout_off_in_eval(bound: Instance, ex: AttnExample) -> Measure:
    """Dropout is off in eval mode, and p = 0 in training mode equals eval mode.

    With every dropout probability at 0.5: out_eval = out_eval(p=0); with p = 0:
    out_train = out_eval.
    """
    if not bound.set_dropout(0.0):
        no_dropout_here(bound, ex)
        raise Violation("the target declares dropout, but the adapter found no dropout probability to set")
    try:
        reference = bound(ex.q, ex.k, ex.v, ex.mask).detach()
        allowed = relation_allowed(bound, ex)
        bound.set_dropout(0.5)
        measure = close(bound(ex.q, ex.k, ex.v, ex.mask), reference, allowed, "eval output with dropout 0.5 vs 0")
        bound.set_dropout(0.0)
        bound.set_training(True)
        close(bound(ex.q, ex.k, ex.v, ex.mask), reference, allowed, "training output with dropout 0 vs eval")
    finally:
        bound.set_training(False)
    return measure

