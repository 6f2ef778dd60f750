"""Dropout in training mode, read as a law: every attention weight is kept with probability 1 - p and
then scaled by 1 / (1 - p), or zeroed, independently of every other weight, head, batch item and call.

The multipliers are read back from the layer's outputs, not from its code: an output is
``w_o(weights @ values) + b_o``, and with the layer's own projections the heads' outputs are solved for
(through ``w_o``), then each row's weights (through the values, Lk <= Hd / 2 keys so the solve is well
posed). The training weights divided by the eval weights are the multipliers. A layer whose dropout acts
on its output instead (diffusers' ``to_out[1]``) is read elementwise, output by output.

The counting checks have a stated false-alarm rate, ALPHA each, so a correct layer fails one with
probability at most 9 * ALPHA per example (a keep rate, two tails for each of three independence
checks and the interval of the keep rate they use, a mean); their thresholds come from the binomial
distribution (exact tails) and Hoeffding's bound, never from a margin picked by hand.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from hypothesis import strategies as st

from mha_verify.mha.reference import concat_heads, value_heads
from mha_verify.properties.engine.applicable import examples_for
from mha_verify.properties.engine.binomial import binomial_tail, binomial_two_sided, hoeffding_radius
from mha_verify.properties.engine.measure import Measure, Violation, no_dropout_here, worst
from mha_verify.properties.engine.registry import invariant
from mha_verify.properties.protocol import Conventions, Instance, NotApplicable
from mha_verify.properties.strategies.examples import AttnExample, make_example
from mha_verify.properties.strategies.size_cases import Sizes, sizes

#: the dropout probability set: far enough from 1/2 that a keep rate of p instead of 1 - p is a
#: different law, and small enough that most weights survive to be compared
P = 0.3
#: the false-alarm rate of each counting check on a correct layer
ALPHA = 1e-7
#: multipliers read per example, at least (calls are repeated until they are reached, up to MAX_CALLS)
MIN_READ, MAX_CALLS = 1000, 64
#: batch items of every example: two disjoint pairs for the independence of batch items
BATCH = 4
#: the narrowest head drawn (a target built at fixed sizes keeps its own): rows of 4 keys read from 16
#: equations, or from the ~11 features dropout on the output leaves of them
MIN_HEAD_DIM = 16
#: a row solved for with both sites dropping is read where its system's condition number is at most this:
#: float32 outputs then give multipliers within 1e-4 of their value (8e-5 measured), a tenth of the band
MAX_CONDITION = 100.0
#: a weight is read where its eval value is at least this: below it, a solve's rounding could pass
#: for a multiplier's worth of difference
MIN_WEIGHT = 1e-2
#: a multiplier is 0 or 1 / (1 - p) within this fraction of 1 / (1 - p) (float32 and float64; half
#: dtypes: 64 of their ulps): ten times the largest deviation measured on correct layers in float32
#: (8e-5: one and two sites, torch's, timm's, GPT-2's), so a row 1 % off in training fails
BAND_FLOAT32 = 1e-3
#: a row whose heads' outputs are not weights @ values within this relative residual is not read
MAX_RESIDUAL = 1e-3


def _examples(conv: Conventions) -> st.SearchStrategy[AttnExample] | str:
    self_only = dataclasses.replace(conv, cross_attention=False, kv_shared=False)
    shapes = sizes(max_batch=1, max_len=8, max_head_dim=32, max_d_model=256, fixed=conv.sizes)
    if conv.sizes is None:  # heads at least MIN_HEAD_DIM wide: rows of weights are then read from four times their keys
        shapes = shapes.map(lambda s: s._replace(d_model=s.n_head * max(s.head_dim, MIN_HEAD_DIM)))
    drawn = examples_for(self_only, kinds=("none",), layouts=False, shapes=shapes)
    if isinstance(drawn, str):
        return drawn
    return drawn.map(_readable)


def _readable(ex: AttnExample) -> AttnExample:
    """The drawn example at the sizes the weights can be read back at: BATCH items of 4 <= L <= Hd / 4
    positions (a row of L weights solved from Hd equations, or from the features output dropout keeps of
    them), self-attention, no mask."""
    s = ex.sizes
    # at least 4 positions where heads allow: a shrunk example still reads enough weights per call
    length = max(1, min(max(s.lq, 4), s.head_dim // 4))
    ex = make_example(Sizes(BATCH, length, length, s.d_model, s.n_head), ex.mask_spec, (1.0,) * BATCH, ex.seed,
                      ex.q.dtype)
    return ex._replace(k=ex.q, v=ex.q)


def _heads_output(out: torch.Tensor, bound: Instance) -> torch.Tensor:
    """out (B, L, D) -> the concatenated heads' outputs (B, L, H * Hd) in float64, through w_o's solve."""
    params = bound.params()
    y = out.detach().double()
    if params.b_o is not None:
        y = y - params.b_o.detach().double()
    if params.w_o is None:
        return y
    w_o = params.w_o.detach().double()  # (D, H * Hd)
    flat = y.reshape(-1, y.shape[-1]).T  # (D, B * L)
    return torch.linalg.lstsq(w_o, flat).solution.T.reshape(*y.shape[:-1], w_o.shape[1])


def _row_weights(z: torch.Tensor, vh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Heads' outputs z (B, L, H * Hd) and values vh (B, H, Lk, Hd) -> (weights (B, H, L, Lk), relative
    residual of each row (B, H, L)): the least-squares solve of z_h,i = sum_j w_h,i,j v_h,j."""
    b, h, _, hd = vh.shape
    m = vh.transpose(-1, -2)  # (B, H, Hd, Lk)
    rhs = z.reshape(b, -1, h, hd).permute(0, 2, 3, 1)  # (B, H, Hd, L)
    sol = torch.linalg.lstsq(m, rhs).solution  # (B, H, Lk, L)
    residual = (m @ sol - rhs).norm(dim=-2) / rhs.norm(dim=-2).clamp_min(1e-300)
    return sol.transpose(-1, -2), residual


class _Law:
    """Multipliers read over the training calls: ``m`` (calls, B, H, L, Lk) of the attention weights, or
    (calls, B, L, D) of the output, and ``read`` where the eval value was large enough to read them;
    ``unit`` is what masks must be independent across besides batch items and calls (heads, or output
    features)."""

    def __init__(self, site: str, m: torch.Tensor, read: torch.Tensor, unit: str, band: float = BAND_FLOAT32) -> None:
        self.site, self.m, self.read, self.unit, self.band = site, m, read, unit, band

    def where(self, flat_index: int) -> str:
        idx = [int(i) for i in torch.unravel_index(torch.tensor(flat_index), self.m.shape)]
        names = ["call", "b", "h" if self.unit == "head" else "i", *(("i", "j") if self.unit == "head" else ("d",))]
        return ", ".join(f"{n}={i}" for n, i in zip(names, idx, strict=True))


def _read_laws(bound: Instance, x: torch.Tensor, eval_out: torch.Tensor, trained: list[torch.Tensor]) -> list[_Law]:
    """The multipliers of every site dropout acts at: the attention weights, the output, or both (timm's
    ``attn_drop`` and ``proj_drop``, GPT-2's ``attn_dropout`` and ``resid_dropout``); NotApplicable where
    the outputs are none of these."""
    conv = bound.conventions
    band = max(BAND_FLOAT32, 64 * torch.finfo(x.dtype).eps)
    vh = value_heads(x, bound.params(), bound.n_head, scoring=conv.scoring)  # (B, H, L, Hd)
    w_eval, res_eval = _row_weights(_heads_output(eval_out, bound), vh)
    if float(res_eval.max()) > MAX_RESIDUAL:
        raise NotApplicable(
            f"the eval output is not weights @ values through the layer's own projections (relative residual "
            f"{float(res_eval.max()):.3g}): its attention weights cannot be read back to see a dropout mask")
    calls = torch.stack(trained)  # (calls, B, L, D), solved at once
    # a weight is read where its multiplier is good to a quarter of the band: the eval solve against the float64
    # oracle's weights says how far rounding the outputs moves it through the layer's w_o and values (an
    # ill-conditioned w_o, drawn at random, moves a weight of 0.02 by 1e-3 of itself from float32 outputs)
    _, w_true = concat_heads(x, x, x, bound.params(), bound.n_head, causal=conv.causal, scoring=conv.scoring)
    precise = (w_eval - w_true).abs() * 8 <= band * w_eval.clamp_min(MIN_WEIGHT)  # 2 solves: band / 4
    read = ((w_eval >= MIN_WEIGHT) & precise).expand(len(trained), *w_eval.shape)
    w, res = _row_weights(_heads_output(calls, bound).flatten(0, 1), vh.repeat(len(trained), 1, 1, 1))
    if float(res.max()) <= MAX_RESIDUAL:
        m = w.unflatten(0, (len(trained), -1)) / w_eval.clamp_min(MIN_WEIGHT)  # (calls, B, H, L, Lk)
        return [_Law("attention weights", m, read, "head", band)]
    both = _both_sites(bound, vh, calls)
    if both is not None:
        weights, out_scale, solvable = both
        return [_Law("attention weights", weights / w_eval.clamp_min(MIN_WEIGHT), read & solvable[:, :, None, :, None],
                     "head", band),
                _Law("output", out_scale, solvable.unsqueeze(-1).expand_as(out_scale), "feature", band)]
    law = _output_law(eval_out, calls)
    law.band = band
    if _mask_of(law, 1.0 / (1.0 - P))[1] is None:
        raise NotApplicable(
            "in training mode the output is neither the eval weights masked (through the layer's own projections), "
            "nor the eval output masked elementwise, nor both: dropout acts elsewhere, where no mask can be read")
    return [law]


def _both_sites(bound: Instance, vh: torch.Tensor,
                calls: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Dropout on the weights and on the output at once: out = m_o * (w_o(weights @ values) + b_o), the
    dropped outputs exactly 0. Each output row is solved from its kept features alone for s * weights and
    the scale s of its kept features (b_o tells s apart: without it, None). Returns (weights (calls, B, H,
    L, Lk), output multipliers (calls, B, L, D): s where kept, 0 where dropped, and the rows (calls, B, L)
    whose solve is well conditioned), or None where they do not explain the outputs."""
    params = bound.params()
    if params.w_o is None or params.b_o is None or not bool(params.b_o.detach().abs().gt(0).any()):
        return None
    b, h, lk, hd = vh.shape
    w_o, b_o = params.w_o.detach().double(), params.b_o.detach().double()  # (D, H * Hd), (D,)
    per_key = torch.einsum("dhe,bhje->bdhj", w_o.view(-1, h, hd), vh).flatten(-2)  # (B, D, H * Lk)
    system = torch.cat([per_key, b_o.view(1, -1, 1).expand(b, -1, 1)], dim=-1)  # (B, D, H * Lk + 1)
    y = calls.double()  # (calls, B, L, D)
    kept = (y != 0).to(torch.float64).unsqueeze(-1)  # (calls, B, L, D, 1)
    a = system[None, :, None] * kept  # rows of dropped features weigh nothing in the solve
    rhs = y.unsqueeze(-1) * kept
    sol = torch.linalg.lstsq(a, rhs).solution  # (calls, B, L, H * Lk + 1, 1)
    residual = (a @ sol - rhs).norm(dim=(-2, -1)) / rhs.norm(dim=(-2, -1)).clamp_min(1e-300)
    if float(residual.max()) > MAX_RESIDUAL:
        return None
    scale = sol[..., -1, 0]  # (calls, B, L)
    weights = sol[..., :-1, 0].unflatten(-1, (h, lk)) / scale.clamp_min(1e-12)[..., None, None]
    sv = torch.linalg.svdvals(a)  # (calls, B, L, H * Lk + 1)
    solvable = sv[..., -1] * MAX_CONDITION >= sv[..., 0]  # rows whose kept features pin the solve down
    return weights.permute(0, 1, 3, 2, 4), kept.squeeze(-1) * scale.unsqueeze(-1), solvable


def _output_law(eval_out: torch.Tensor, calls: torch.Tensor) -> _Law:
    """Dropout on the output alone, without an output bias to solve with: training / eval output elementwise."""
    e = eval_out.detach().double()  # (B, L, D)
    read = (e.abs() >= 0.1 * e.pow(2).mean().sqrt()).expand(calls.shape[0], *e.shape)
    return _Law("output", calls.double() / torch.where(read[0], e, 1.0), read, "feature")


def _mask_of(law: _Law, scale: float) -> tuple[torch.Tensor, float | None]:
    """(kept (bool, m's shape), the value c every read multiplier that is not 0 takes, within the band of
    ``scale``; None where they take no single value: then the training output is not a mask of the eval one)."""
    m, read = law.m, law.read
    zero = m.abs() <= law.band * scale
    rest = m[read & ~zero]
    if rest.numel() == 0:
        return torch.zeros_like(read), scale
    c = float(rest.median())
    kept = (m - c).abs() <= law.band * max(c, 1e-12)
    return kept, (c if bool(((zero | kept) | ~read).all()) else None)


def _independence(law: _Law, kept: torch.Tensor, axis: int, what: str) -> None:
    """Masks of disjoint pairs along ``axis`` (0, 1), (2, 3), ... agree where both are read with probability
    r^2 + (1 - r)^2 if they are independent with keep rate r. r is not assumed (a wrong keep rate is the
    keep-rate check's to name): its Hoeffding interval at ALPHA bounds that probability, and the count of
    agreements is tested against both ends at ALPHA (a false alarm at most 2 * ALPHA per axis)."""
    pairs = kept.shape[axis] // 2
    if pairs == 0:
        return
    shape = (*kept.shape[:axis], pairs, 2, *kept.shape[axis + 1:])
    a = kept.narrow(axis, 0, 2 * pairs).reshape(shape)
    r = law.read.expand_as(kept).narrow(axis, 0, 2 * pairs).reshape(shape)
    both = r.select(axis + 1, 0) & r.select(axis + 1, 1)
    n = int(both.sum())
    if n == 0:
        return
    agree = int(((a.select(axis + 1, 0) == a.select(axis + 1, 1)) & both).sum())
    rate = float(kept[law.read.expand_as(kept)].double().mean())
    radius = hoeffding_radius(int(law.read.sum()), 1.0, ALPHA)
    lo, hi = max(0.0, rate - radius), min(1.0, rate + radius)
    q_hi = max(lo ** 2 + (1 - lo) ** 2, hi ** 2 + (1 - hi) ** 2)
    q_lo = min(max(0.5, lo), hi) ** 2 + (1 - min(max(0.5, lo), hi)) ** 2
    above = binomial_tail(agree, n, min(q_hi, 1 - 1e-12), upper=True)
    below = binomial_tail(agree, n, max(q_lo, 1e-12), upper=False)
    if min(above, below) < ALPHA:
        raise Violation(
            f"dropout of the {law.site} is not independent across {what}: pairs of {what} agree on "
            f"{agree} of {n} masks ({agree / n:.1%}), where independent masks with the keep rate seen "
            f"({rate:.1%}) agree on {q_lo:.1%} to {q_hi:.1%} (r^2 + (1-r)^2; binomial tail "
            f"{min(above, below):.2g} < {ALPHA:g})")


@invariant("dropout_statistics", strategy=_examples, needs_dropout=True, needs_oracle=True)
def dropout_statistics(bound: Instance, ex: AttnExample) -> Measure:
    """In training mode at dropout p = 0.3, weights are kept with probability 1 - p, scaled by 1 / (1 - p),
    independently across heads, batch items and calls, so the expected output is the eval output.

    The multipliers m (training weight / eval weight, read back through the layer's own projections; or
    training output / eval output for dropout on the output) are each 0 or 1 / (1 - p); the kept fraction
    is binomial(n, 1 - p); pairs of heads, of batch items and of calls agree as independent masks do; the
    mean multiplier is 1 within Hoeffding's radius. Each count has false-alarm rate 1e-7. A dropout that
    never acts fails where the layer's library declares it (a transformers config's ``attention_dropout``);
    elsewhere it is the finding *argument accepted and ignored*.
    """
    if not bound.set_dropout(P):
        no_dropout_here(bound, ex)
        raise Violation("the target declares dropout, but the adapter found no dropout probability to set")
    x = ex.q
    if 4 * x.shape[1] > ex.sizes.head_dim:
        raise NotApplicable(f"heads of width {ex.sizes.head_dim} at fixed sizes: a row of weights cannot be solved "
                            "for from its heads' output with fewer than four equations per key")
    scale = 1.0 / (1.0 - P)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(ex.seed)
            eval_out = bound(x, x, x, None).detach()
            bound.set_training(True)
            trained = [bound(x, x, x, None).detach()]
            first = _read_laws(bound, x, eval_out, trained)
            per_call = max(1, min(int(law.read[0].sum()) for law in first))
            calls = min(MAX_CALLS, max(2, math.ceil(MIN_READ / per_call)))
            trained += [bound(x, x, x, None).detach() for _ in range(calls - 1)]
            laws = _read_laws(bound, x, eval_out, trained)
    finally:
        bound.set_training(False)
        bound.set_dropout(0.0)
    active = [law for law in laws if not _inactive(law, scale)]
    if not active:
        n = sum(int(law.read.sum()) for law in laws)
        if bound.conventions.dropout_declared is not None:  # its library promises dropout in training
            raise Violation(f"in training mode at p={P}, none of {n} attention weights or outputs read was dropped: "
                            f"the layer never applies the attention dropout {bound.conventions.dropout_declared} "
                            "declares")
        return Measure(finding=("ignored", (
            f"with every dropout probability the layer holds at p={P}, in training mode none of {n} attention "
            "weights or outputs read was dropped: the layer's dropout does not act")))
    return worst(*(_judge(law, scale) for law in active))


def _inactive(law: _Law, scale: float) -> bool:
    """Nothing dropped and nothing scaled: no dropout at this site (another site may have it)."""
    kept, c = _mask_of(law, scale)
    return c is not None and bool(kept[law.read].all()) and abs(c - 1.0) <= law.band


def _judge(law: _Law, scale: float) -> Measure:
    """The law of one site's multipliers: a mask of 0 and 1 / (1 - p), independent across calls, batch
    items and heads (or features), keeping 1 - p, with mean 1."""
    read = law.read
    n = int(read.sum())
    if n == 0:
        raise NotApplicable("no attention weight or output large enough to read a multiplier from")
    kept, c = _mask_of(law, scale)
    m = law.m[read]
    if c is None:
        stray = torch.nonzero((~kept & (law.m.abs() > law.band * scale) & read).flatten())
        at = int(stray[0])
        raise Violation(
            f"in training mode the {law.site} are not the eval ones masked: multiplier "
            f"{float(law.m.flatten()[at]):.4g} at ({law.where(at)}), where dropout gives 0 or 1/(1-p) = "
            f"{scale:.4g} (p={P})")
    n_kept = int(kept[read].sum())
    if abs(c - scale) > law.band * scale:
        raise Violation(
            f"dropout of the {law.site}: surviving values are scaled by {c:.4g}, where p={P} scales them by "
            f"1/(1-p) = {scale:.4g} ({n_kept} of {n} kept)", abs(c - scale), law.band * scale)
    # calls first: a mask repeated at every call repeats its batch items' and heads' agreements too
    _independence(law, kept, 0, "calls")
    _independence(law, kept, 1, "batch items")
    _independence(law, kept, 2 if law.unit == "head" else 3, f"{law.unit}s")
    p_value = binomial_two_sided(n_kept, n, 1 - P)
    if p_value < ALPHA:
        raise Violation(
            f"dropout of the {law.site} keeps {n_kept} of {n} ({n_kept / n:.1%}), where p={P} keeps 1-p = "
            f"{1 - P:.0%} (binomial p-value {p_value:.2g} < {ALPHA:g})")
    mean, radius = float(m.mean()), hoeffding_radius(n, scale, ALPHA)
    if abs(mean - 1.0) > radius:
        raise Violation(
            f"dropout of the {law.site}: the mean multiplier over {n} is {mean:.4g}, so the expected training "
            f"output is not the eval output (1 within Hoeffding's {radius:.3g} at {ALPHA:g})", abs(mean - 1), radius)
    return Measure(abs(mean - 1.0), radius)
