"""Gradients against the float64 oracle's autograd, at the sizes the strategies draw.

flash-attention's test suite compares dq, dk and dv with a reference at every sequence length
it tests; the backward pass of a custom kernel is where its bugs live (a forward exact at every
size with a backward wrong past the first key block passes every forward property). Here the
target's gradients of ``sum(out * g)`` for a random cotangent g are held to the derived rule:
4 x the error of the same backward evaluated plainly in the target's dtype, plus the floors.
"""

from __future__ import annotations

import math

import torch

from mha_verify.mha.reference import MHAParams, kv_heads, multi_head, multi_head_graph
from mha_verify.mha.scoring import Norm
from mha_verify.mha.tolerance import Comparison, compare, tolerance_for
from mha_verify.properties.engine.call_path import target_side
from mha_verify.properties.engine.measure import UNCHECKED, Measure, Violation, ensure, worst
from mha_verify.properties.engine.registry import invariant
from mha_verify.properties.protocol import Instance
from mha_verify.properties.strategies.examples import AttnExample

_WEIGHTS = ("w_q", "b_q", "w_k", "b_k", "w_v", "b_v", "w_o", "b_o")


def _inputs(ex: AttnExample, dtype: torch.dtype) -> tuple[list[str], list[torch.Tensor]]:
    """Leaves for q, k and v in ``dtype``: one leaf "x" for a self-attention example (q is k is
    v), "q" and "kv" where keys and values are one argument (k is v), else "q", "k", "v".

    ``clone`` keeps the strides of dense views (a transposed layout stays transposed)."""
    def leaf(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(dtype).clone().requires_grad_(True)

    if ex.k is ex.q and ex.v is ex.q:
        return ["x"], [leaf(ex.q)]
    if ex.v is ex.k:
        return ["q", "kv"], [leaf(ex.q), leaf(ex.k)]
    return ["q", "k", "v"], [leaf(t) for t in (ex.q, ex.k, ex.v)]


def _call(leaves: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if len(leaves) == 1:
        return leaves[0], leaves[0], leaves[0]
    if len(leaves) == 2:
        return leaves[0], leaves[1], leaves[1]
    return leaves[0], leaves[1], leaves[2]


def _exposed(params: MHAParams) -> list[str]:
    """The weights the target exposes as its own leaves (nn.Linear's weight and bias); a slice of a
    fused projection or a copy is not one, and its gradient cannot be read."""
    return [name for name in _WEIGHTS if isinstance(t := getattr(params, name), torch.Tensor)
            and t.is_leaf and t.requires_grad]


def _grads(out: torch.Tensor, wrt: list[torch.Tensor], g: torch.Tensor) -> list[torch.Tensor]:
    """d sum(out * g) / d wrt; autograd's None (not used) is a gradient of zeros."""
    with target_side():  # the target's backward (and the oracle's, which does not raise)
        got = torch.autograd.grad(out, wrt, g.to(out.dtype), allow_unused=True)
    return [torch.zeros_like(t) if d is None else d for t, d in zip(wrt, got, strict=True)]


def _reference(ex: AttnExample, bound: Instance, dtype: torch.dtype, g: torch.Tensor,
               via_lse: bool = False, nudged: bool = False, kernel: bool = False) -> list[torch.Tensor]:
    """The plain formula's gradients in ``dtype`` w.r.t. the inputs, then every weight (in _WEIGHTS order,
    present ones only); ``via_lse`` recomputes the weights from a logsumexp of the scores rounded
    once more, as flash-style backward passes do; ``nudged`` moves the inputs by one rounding error
    of ``dtype`` first (fixed seed); ``kernel`` takes the heads from torch's fused SDPA."""
    _, leaves = _inputs(ex, dtype)
    if nudged:  # another draw of the rounding: inputs moved by one rounding error (as ``same_precision``)
        eps, gen = torch.finfo(dtype).eps, torch.Generator().manual_seed(0)
        with torch.no_grad():
            for leaf in leaves:
                leaf.mul_((1 + eps * (2 * torch.rand(leaf.shape, generator=gen) - 1)).to(dtype))
    params = MHAParams._make(None if t is None else t.detach().to(dtype).clone().requires_grad_(True)
                             for t in bound.params())
    conv = bound.conventions
    mask = ex.mask if ex.mask is None or ex.mask.dtype == torch.bool else ex.mask.to(dtype)
    out = multi_head_graph(*_call(leaves), params, bound.n_head, mask, causal=conv.causal,
                           fully_masked=conv.fully_masked, scoring=conv.scoring, via_lse=via_lse,
                           kernel=kernel)
    weights = [t for t in params if t is not None]
    return _grads(out, leaves + weights, g)


@invariant("grad_agreement", reach="lengths", needs_grads=True, needs_oracle=True)
def grad_agreement(bound: Instance, ex: AttnExample) -> Measure:
    """The target's gradients agree with the float64 oracle's autograd gradients.

    With g ~ N(0, 1) (B, Lq, D) and loss = sum(out * g): dq, dk and dv (dx for a
    self-attention-only target, d(kv) where keys and values are one argument), and the
    gradients of w_q, b_q, ..., b_o where the target exposes them as its own leaf parameters,
    each within 4 x |the plain formula's backward in
    the target's dtype - float64| + floor (mha.tolerance), on modest sizes and past every length
    and batch block boundary (Lq, Lk up to 257; heads up to 8 of width 16), with masks,
    causality and grouped key/value heads. The plain
    backward is evaluated four ways: as given; with the weights recomputed from a per-row
    logsumexp of scores rounded once more (what flash-style kernels' backward passes do: at
    scores of 1e4 that alone moves every weight by ~1e-3); on inputs moved by one rounding
    error, a second draw of the rounding, as the forward's same-precision reference takes; and
    with the heads from torch's fused SDPA kernel (rows with a key only), a correct blocked
    implementation: in a saturated softmax under rotary embeddings (item scale 1000) the
    kernel's own d b_v error was 0.134, HF Qwen2's 0.086, and the other three draws' at most
    0.020. The worst finite one calibrates. A gradient
    whose float64 value is not finite is not compared.
    """
    dtype = ex.q.dtype
    names, leaves = _inputs(ex, dtype)
    params = bound.params()
    exposed = _exposed(params)
    g = torch.randn(ex.q.shape, generator=torch.Generator().manual_seed(ex.seed), dtype=torch.float64)
    out = bound(*_call(leaves), ex.mask)
    if not out.requires_grad:
        raise Violation("the output does not require grad: no gradient flows from it to q, k, v or the weights")
    actual = _grads(out, leaves + [getattr(params, n) for n in exposed], g)
    oracle = _reference(ex, bound, torch.float64, g)
    same = [_reference(ex, bound, dtype, g), _reference(ex, bound, dtype, g, via_lse=True),
            _reference(ex, bound, dtype, g, nudged=True), _reference(ex, bound, dtype, g, kernel=True)]
    present = [n for n in _WEIGHTS if getattr(params, n) is not None]
    # positions of the compared gradients in the reference lists: the inputs, then the exposed weights
    index = list(range(len(names))) + [len(names) + present.index(n) for n in exposed]
    terms = _term_magnitudes(ex, bound, g, len(names))
    measures = []
    for name, got, i in zip(names + exposed, actual, index, strict=True):
        if not bool(torch.isfinite(oracle[i]).all()):
            continue  # the float64 gradient itself is not finite: nothing to hold the target to
        # a draw that is not finite where the float64 gradient is calibrates nothing (its error is inf)
        draws = [s[i] for s in same if bool(torch.isfinite(s[i]).all())] or [same[0][i]]
        ref_same = max(draws, key=lambda t: _error(t, oracle[i]))
        c = compare(got, oracle[i], ref_same, dtype)
        # the floor is relative to the gradient's terms, not their cancelled sum (see _term_magnitudes)
        scale = max(c.scale, float(terms[i].max()) if terms[i].numel() else 0.0)
        c = Comparison(c.error, tolerance_for(dtype).allowed(c.ref_error, scale), c.ref_error, scale)
        measures.append(ensure(c, f"d loss / d {name} vs float64 autograd"))
    return worst(*measures) if measures else UNCHECKED


def _term_magnitudes(ex: AttnExample, bound: Instance, g: torch.Tensor, n_inputs: int) -> list[torch.Tensor]:
    """For each gradient (the inputs, then every present weight, as :func:`_reference`), the sum of
    the absolute values of the terms its float64 value sums, in float64: the scale of the rounding
    error any evaluation makes (a running-error bound's), where the value itself may cancel to ~0.

    With a saturated softmax dq cancels to ~1e-6 of its terms: dS = P * (dP - rowsum(dO * O))
    subtracts nearly equal numbers, and two correct float32 backward passes differ by 100 % of dq.
    Holding dq to its own magnitude failed torch's SDPA; its terms' magnitude does not.
    """
    conv = bound.conventions
    p = MHAParams._make(None if t is None else t.detach().double().abs() for t in bound.params())
    raw = [t.detach().double() for t in (ex.q, ex.k, ex.v)]
    q, k, v = (conv.scoring.pre(t, w) for t, w in zip(raw, "qkv", strict=True))  # as the projections see them
    n_head, n_kv = bound.n_head, kv_heads(bound.params(), bound.n_head)
    d = q.shape[-1]
    hd = d // n_head
    mask = ex.mask if ex.mask is None or ex.mask.dtype == torch.bool else ex.mask.double()
    _, weights = multi_head(ex.q, ex.k, ex.v, bound.params(), n_head, mask, causal=conv.causal,
                            fully_masked=conv.fully_masked, scoring=conv.scoring)  # P (B, H, Lq, Lk)
    weights = weights.nan_to_num(0.0)

    def heads(x: torch.Tensor, n: int) -> torch.Tensor:  # (B, L, n*Hd) -> (B, n, L, Hd)
        return x.reshape(*x.shape[:-1], n, hd).transpose(1, 2)

    def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        return x @ w.T + (0 if b is None else b)

    sq = [(q, p.w_q, p.b_q), (k, p.w_k, p.b_k), (v, p.w_v, p.b_v)]
    qh, kh, vh = (heads(linear(x.abs(), w, b), n) for (x, w, b), n in zip(sq, (n_head, n_kv, n_kv), strict=True))
    scoring = conv.scoring
    kh, vh = scoring.repeat_kv(kh, n_head), scoring.repeat_kv(vh, n_head)  # (B, H, Lk, Hd)
    oh = weights @ vh  # (B, H, Lq, Hd), |O| <= P |V|
    d_concat = g.abs() if p.w_o is None else g.abs() @ p.w_o  # (B, Lq, D)
    d_oh = heads(d_concat, n_head)
    d_s = weights * (d_oh @ vh.transpose(-2, -1) + (d_oh * oh).sum(-1, keepdim=True))  # (B, H, Lq, Lk)
    scale = 1.0 / math.sqrt(hd) if conv.scale is None else conv.scale
    d_qh, d_kh, d_vh = scale * d_s @ kh, scale * d_s.transpose(-2, -1) @ qh, weights.transpose(-2, -1) @ d_oh

    def merge(t: torch.Tensor, n: int) -> torch.Tensor:  # (B, H, L, Hd) -> (B, L, n*Hd), summing a group
        t = scoring.fold_kv(t, n)
        return t.transpose(1, 2).reshape(t.shape[0], t.shape[2], n * hd)

    d_proj = [merge(d_qh, n_head), merge(d_kh, n_kv), merge(d_vh, n_kv)]  # (B, L, out) each
    d_inputs = [dp @ w for dp, (_, w, _) in zip(d_proj, sq, strict=True)]  # (B, L, D) each
    # back through a norm before the projections: |J| <= 3 |w| / sigma per position (LayerNorm's)
    norms = (conv.scoring.input_norm, conv.scoring.context_norm, conv.scoring.context_norm)
    d_inputs = [d if norm is None else d * _norm_gain(norm, x) for d, norm, x in zip(d_inputs, norms, raw, strict=True)]
    if n_inputs == 1:  # x is q, k and v
        inputs = [d_inputs[0] + d_inputs[1] + d_inputs[2]]
    elif n_inputs == 2:  # q, and kv as keys and values
        inputs = [d_inputs[0], d_inputs[1] + d_inputs[2]]
    else:
        inputs = d_inputs
    concat = oh.transpose(1, 2).reshape(q.shape[0], q.shape[1], d)  # |Concat| bound (B, Lq, D)
    per_weight = {}
    for (x, _, _), dp, name in zip(sq, d_proj, ("q", "k", "v"), strict=True):
        per_weight[f"w_{name}"] = torch.einsum("blo,bli->oi", dp, x.abs())
        per_weight[f"b_{name}"] = dp.sum(dim=(0, 1))
    per_weight["w_o"] = torch.einsum("blo,bli->oi", g.abs(), concat)
    per_weight["b_o"] = g.abs().sum(dim=(0, 1))
    return inputs + [per_weight[n] for n in _WEIGHTS if getattr(p, n) is not None]


def _norm_gain(norm: Norm, x: torch.Tensor) -> torch.Tensor:
    """A bound on a norm's Jacobian at x (B, L, D), per position (B, L, 1): 3 max|w| / sigma."""
    w_max = 1.0 if norm.weight is None else float(norm.weight.detach().double().abs().max()) + norm.offset
    return 3 * w_max / (x.var(dim=-1, unbiased=False, keepdim=True) + norm.eps_for(torch.float32)).sqrt()


def _error(t: torch.Tensor, oracle: torch.Tensor) -> float:
    diff = (t.double() - oracle).abs().nan_to_num(math.inf)
    return float(diff.max()) if diff.numel() else 0.0
