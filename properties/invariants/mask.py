"""Mask invariants: masked keys get zero attention, no influence and no gradient."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial

import torch
from hypothesis import strategies as st

from mha_verify.mha.masks import additive_mask
from mha_verify.mha.tolerance import compare
from mha_verify.properties.engine.applicable import (
    examples_for,
    fully_masked,
    keep_of,
    mixed_positions,
    weights_beyond,
)
from mha_verify.properties.engine.call_path import target_side, weights_if_any
from mha_verify.properties.engine.measure import (
    UNCHECKED,
    Measure,
    Violation,
    close,
    ensure,
    oracle,
    relation_allowed,
    worst,
)
from mha_verify.properties.engine.registry import StrategyFn, invariant
from mha_verify.properties.protocol import NO_MASK, SELF_ONLY, Conventions, Instance
from mha_verify.properties.strategies.examples import AttnExample
from mha_verify.properties.strategies.masks import build_keep

_MASKED_KINDS = ("random", "padding", "causal", "fully_masked_rows", "fully_masked_item")


def _with_mask(kinds: tuple[str, ...] = _MASKED_KINDS) -> StrategyFn:
    def strategy(conv: Conventions) -> st.SearchStrategy[AttnExample] | str:
        return examples_for(conv, kinds=kinds, need_mask=True)

    return strategy


def _needs_weights(conv: Conventions) -> st.SearchStrategy[AttnExample] | str:
    if not conv.weights:
        return "the target does not return attention weights"
    return weights_beyond(conv) or _with_mask()(conv)


@invariant("mask_zeroes_weights", strategy=_needs_weights)
def mask_zeroes_weights(bound: Instance, ex: AttnExample) -> Measure:
    """Attention weights are exactly 0 wherever the mask removes a key.

    weights[b, h, i, j] == 0 for every (b, h, i, j) with mask[b, h, i, j] = False (or -inf).
    """
    _, weights = bound.with_weights(ex.q, ex.k, ex.v, ex.mask)
    masked = ~keep_of(ex, bound.conventions.causal)
    if not bool(masked.any()):
        return UNCHECKED
    leaked = weights.detach()[masked]
    if leaked.numel() and bool((leaked != 0).any()):
        worst = float(leaked.abs().max())
        where = tuple(int(i) for i in torch.nonzero((weights.detach() != 0) & masked)[0])
        raise Violation(f"weight {worst:.3g} at masked position (b, h, i, j)={where}, but should be exactly 0",
                        worst, 0.0)
    return Measure()


def _masked_keys(conv: Conventions) -> st.SearchStrategy[AttnExample] | str:
    return mixed_positions(conv) or _with_mask()(conv)


@invariant("masked_kv_invariance", strategy=_masked_keys, reach="full")
def masked_kv_invariance(bound: Instance, ex: AttnExample) -> Measure:
    """Replacing k and v at masked key positions does not change the output.

    For a set J of keys, out'[b, i] = out[b, i] for every query row (b, i) that masks all of
    J in every head, where out' uses k, v with rows J replaced by values 100x larger.
    """
    keep = keep_of(ex, bound.conventions.causal)  # (B, H, Lq, Lk)
    gen = torch.Generator().manual_seed(ex.seed + 7)
    replace = _replaceable(keep, gen)  # (B, Lk)
    if not bool(replace.any()):
        return UNCHECKED
    # rows that see none of the replaced keys in any head: (B, Lq)
    rows = ~(keep & replace[:, None, None, :]).any(dim=-1).any(dim=1)
    big = 100.0 * max(ex.scales)
    k2, v2 = ex.k.clone(), ex.v.clone()
    noise_k = torch.randn(ex.k.shape, generator=gen).to(ex.k.dtype) * big
    noise_v = torch.randn(ex.v.shape, generator=gen).to(ex.v.dtype) * big
    k2[replace], v2[replace] = noise_k[replace], noise_v[replace]
    if ex.v is ex.k:  # keys = values, one argument: replaced together
        v2 = k2
    if not bound.conventions.cross_attention:
        return _self_attention_masked_x(bound, ex, replace, rows, noise_k)
    out = bound(ex.q, ex.k, ex.v, ex.mask)
    out2 = bound(ex.q, k2, v2, ex.mask)
    try:
        return close(out2, out, relation_allowed(bound, ex), "output after replacing masked k/v rows", rows)
    except Violation as violation:
        return _through_the_shift(bound.conventions, violation, violation.error <= SHIFT_ROUNDING * violation.allowed,
                                  f"within {SHIFT_ROUNDING} times the allowance")


#: how far past its allowance a mask check may be, for a layer whose scores are shifted by a max over masked
#: keys too (:attr:`Conventions.shifted_scores`), and still be that shift's rounding: a masked key that is
#: not removed moves the output by its values, orders above
SHIFT_ROUNDING = 64


def _through_the_shift(conv: Conventions, violation: Violation, small: bool, within: str) -> Measure:
    """A mask check's ``violation`` as a precision policy where the layer shifts its scores by a max over
    masked keys too and the effect is ``small`` (``within``: the bound, in words); raised again otherwise."""
    if conv.shifted_scores is None or not small:
        raise violation
    return Measure(violation.error, violation.allowed, finding=("precision_policy", (
        f"{violation}; it is rounding: its scores are shifted by their row's max over every key, masked ones "
        f"too, before the mask (`{conv.shifted_scores}`), and softmax cancels the shift exactly, so a masked key "
        f"reaches it only through the shift's rounding ({within}): a numerical choice of the library, not a "
        "defect")))


def _replaceable(keep: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """bool (B, Lk): per item, the keys that one query row (chosen at random among the rows that
    mask some key in every head) masks in every head, so at least that row compares."""
    masked_all_heads = ~keep.any(dim=1)  # (B, Lq, Lk): masked for this query in every head
    replace = torch.zeros(keep.shape[0], keep.shape[-1], dtype=torch.bool)
    for b in range(keep.shape[0]):
        candidates = torch.nonzero(masked_all_heads[b].any(dim=-1)).flatten()  # rows with a masked key
        if candidates.numel():
            row = candidates[torch.randint(0, candidates.numel(), (1,), generator=gen)]
            replace[b] = masked_all_heads[b, int(row)]
    return replace


def _self_attention_masked_x(bound: Instance, ex: AttnExample, replace: torch.Tensor, rows: torch.Tensor,
                             noise: torch.Tensor) -> Measure:
    """Self-attention: x is query and key at once, so only rows that are not replaced compare."""
    x2 = ex.q.clone()
    x2[replace] = noise[replace]
    rows = rows & ~replace  # (B, L): a replaced position's own query changed too
    out = bound(ex.q, ex.q, ex.q, ex.mask)
    out2 = bound(x2, x2, x2, ex.mask)
    return close(out2, out, relation_allowed(bound, ex), "output after replacing masked positions of x", rows)


def _padding(conv: Conventions) -> st.SearchStrategy[AttnExample] | str:
    mixed = mixed_positions(conv)
    if mixed:
        return mixed
    if not conv.cross_attention:
        return f"{SELF_ONLY}: x is key and query at once, so a masked key's gradient is not 0"
    return examples_for(conv, kinds=("padding", "fully_masked_item"), need_mask=True)


@invariant("masked_grad_zero", strategy=_padding, needs_grads=True)
def masked_grad_zero(bound: Instance, ex: AttnExample) -> Measure:
    """The gradient reaching k and v at keys masked for every query is exactly 0.

    For a key j of item b with mask[b, h, i, j] = False for all h, i:
    d(sum(out * g)) / dk[b, j] = 0 and d(...) / dv[b, j] = 0 exactly, for random g.
    """
    keep = keep_of(ex, bound.conventions.causal)
    unseen = ~keep.any(dim=-2).any(dim=1)  # (B, Lk): key j masked for every head and query of item b
    if not bool(unseen.any()):
        return UNCHECKED
    k = ex.k.clone().requires_grad_(True)
    v = ex.v.clone().requires_grad_(True)
    q = ex.q.clone().requires_grad_(True)
    out = bound(q, k, v, ex.mask)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(ex.seed)).to(out.dtype)
    with target_side():  # the target's backward
        (out * g).sum().backward()
    found = Measure()
    for t in (k, v):
        name = "k" if t is k else "v"
        if t.grad is None:  # autograd's None: the output does not depend on it, a gradient of 0
            continue
        leaked = t.grad[unseen]
        if leaked.numel() and bool((leaked != 0).any()):
            worst = float(leaked.abs().max())
            violation = Violation(f"gradient {worst:.3g} reached {name} at a key masked for every query, "
                                  f"but should be exactly 0", worst, 0.0)
            # through the row max the scores are shifted by, only k's gradient can carry rounding: a few ulps of
            # the largest gradient the example gives (a key the mask does not remove also leaks into v's)
            scale = max(float(x.grad.abs().max()) for x in (q, k, v) if x.grad is not None)
            rounding = SHIFT_ROUNDING * torch.finfo(t.dtype).eps * scale
            found = _through_the_shift(bound.conventions, violation, name == "k" and worst <= rounding,
                                       f"within {SHIFT_ROUNDING} ulps of the example's largest gradient, "
                                       f"{scale:.3g}, and none reaches v")
    return found


def _fully_masked_examples(conv: Conventions) -> st.SearchStrategy[AttnExample] | str:
    if not conv.mask:
        return NO_MASK
    # bypass examples_for's filter for targets declaring NaN/uniform: these rows are the point here
    return examples_for(dataclasses.replace(conv, fully_masked="zeros"),
                        kinds=("fully_masked_rows", "fully_masked_item"), need_mask=True)


@invariant("fully_masked_rows", strategy=_fully_masked_examples, reach="full", needs_oracle=True)
def fully_masked_rows(bound: Instance, ex: AttnExample) -> Measure:
    """A query row whose keys are all masked gets zero weights: its output is w_o(0) = b_o.

    For rows (b, i) with mask[b, h, i, :] all False in every head h: out[b, i] = b_o (0
    without bias), never NaN; every other row stays finite. Checked on both of the target's
    paths where it has two (with and without weights); paths that disagree give a warning.
    A target that declares another convention is "declared" when it does exactly that: NaN
    on those rows, or "uniform" (weights 1/Lk over every key, as masking with finfo.min gives) or
    "uniform_visible" (over the keys the layer's own causal or window mask leaves), held against
    the float64 formula with that convention. Where its library leaves such rows unspecified
    (``rows_unspecified``), they must still be finite; another value is a finding of that kind.
    """
    conv = bound.conventions
    masked = fully_masked(ex, conv.causal)  # (B, H, Lq)
    all_masked, affected = masked.all(dim=1), masked.any(dim=1)  # (B, Lq) each
    if not bool(affected.any()):
        return UNCHECKED
    outs = {"output": bound(ex.q, ex.k, ex.v, ex.mask).detach()}
    got = weights_if_any(bound, ex.q, ex.k, ex.v, ex.mask)
    if got is not None:
        outs["output with weights"] = got[0].detach()
    b_o = bound.params().b_o
    d = ex.sizes.d_model
    expected = torch.zeros(d, dtype=ex.q.dtype) if b_o is None else b_o.detach().to(ex.q.dtype)
    seen: dict[str, str] = {}
    unspecified: list[str] = []  # values its library leaves unspecified that differ from its convention

    def held(check: Callable[[], object]) -> None:
        try:
            check()
        except Violation as exc:
            if conv.rows_unspecified is None:
                raise
            unspecified.append(str(exc))

    for path, out in outs.items():
        if bool(torch.isnan(out[affected]).all()) and bool(torch.isfinite(out[~affected]).all()):
            seen[path] = "NaN"
            continue
        if not bool(torch.isfinite(out).all()):
            bad = tuple(int(i) for i in torch.nonzero(~torch.isfinite(out))[0][:2])
            heads = "all" if bool(all_masked[bad]) else "some"
            raise Violation(f"{path} not finite at (b, i)={bad}; a row with {heads} heads fully masked "
                            "should be finite")
        if conv.fully_masked in ("uniform", "uniform_visible"):
            ref, _, same = oracle(bound, ex)
            held(partial(ensure, compare(out[affected], ref[affected], same[affected], ex.q.dtype),
                         f"{path} of fully masked rows vs the declared uniform weights (float64)"))
            seen[path] = conv.fully_masked
            continue
        scale = float(expected.abs().max()) if expected.numel() else 0.0
        held(partial(close, out[all_masked], expected.expand_as(out[all_masked]), 1e-6 * (1.0 + scale),
                     f"{path} of a fully masked row vs w_o(0) = b_o"))
        seen[path] = "b_o"
    declared = {"nan": "NaN", "uniform": "uniform", "uniform_visible": "uniform_visible"}.get(conv.fully_masked)
    undeclared = [p for p, v in seen.items() if v == "NaN" and declared != "NaN"]
    if undeclared:
        raise Violation(f"{', '.join(undeclared)} gives NaN on fully masked rows; should give "
                        f"{'w_o(0) = b_o' if declared is None else 'the declared ' + conv.fully_masked}")
    if unspecified:  # finite, as required; the values are the library's to choose
        return Measure(finding=("unspecified", f"fully masked rows are finite, and {unspecified[0]}. "
                                               f"{conv.rows_unspecified}"))
    remark = None
    if len(set(seen.values())) > 1:
        remark = "the paths disagree on fully masked rows: " + ", ".join(f"{p} gives {v}" for p, v in seen.items())
    return Measure(declared=declared is not None and declared in seen.values(), remark=remark)


def _both_conventions(conv: Conventions) -> st.SearchStrategy[AttnExample] | str:
    if not conv.mask:
        return NO_MASK
    if conv.mask != frozenset({"bool", "float"}):
        return (f"the target takes only {'/'.join(sorted(conv.mask))} masks: "
                "the adapter would convert, so this would test the adapter")
    return examples_for(conv, kinds=_MASKED_KINDS, need_mask=True)


@invariant("bool_equals_additive", strategy=_both_conventions)
def bool_equals_additive(bound: Instance, ex: AttnExample) -> Measure:
    """A bool keep-mask and the additive mask 0 (keep) / -inf (remove) give the same output.

    out(q, k, v, M) = out(q, k, v, where(M, 0, -inf)) for every bool M.
    """
    keep = build_keep(ex.mask_spec, ex.sizes)
    additive = additive_mask(keep, ex.q.dtype)
    assert keep is not None and additive is not None
    out_bool = bound(ex.q, ex.k, ex.v, keep)
    out_add = bound(ex.q, ex.k, ex.v, additive)
    ex_bool = ex._replace(mask=keep)
    return close(out_add, out_bool, relation_allowed(bound, ex_bool), "additive 0/-inf mask vs bool mask")


_BROADCAST_FORMS = ("11LL", "B1LL", "BHLL", "LL")


def _broadcastable(conv: Conventions) -> st.SearchStrategy[AttnExample] | str:
    if not conv.mask:
        return NO_MASK
    if len([f for f in _BROADCAST_FORMS if f in conv.mask_forms]) < 2:
        return f"the target accepts only the mask shapes {', '.join(sorted(conv.mask_forms))}: nothing to compare"
    return examples_for(conv, kinds=_MASKED_KINDS, need_mask=True)


@invariant("mask_broadcast", strategy=_broadcastable)
def mask_broadcast(bound: Instance, ex: AttnExample) -> Measure:
    """Masks that broadcast alike give the same output.

    With M of shape (1, 1, Lq, Lk): out(M) = out(M expanded to (B, 1, Lq, Lk)) =
    out(M expanded to (B, H, Lq, Lk)) = out(M as (Lq, Lk)).
    """
    if ex.mask is None:
        return UNCHECKED
    s = ex.sizes
    forms = bound.conventions.mask_forms
    base = ex.mask.expand(s.mask_target())[:1, :1]  # (1, 1, Lq, Lk): item 0, head 0
    shaped = {"11LL": base, "B1LL": base.expand(s.batch, 1, s.lq, s.lk),
              "BHLL": base.expand(s.mask_target()).contiguous(), "LL": base[0, 0]}
    present = [f for f in _BROADCAST_FORMS if f in forms]
    ref = bound(ex.q, ex.k, ex.v, shaped[present[0]])
    allowed = relation_allowed(bound, ex._replace(mask=base))
    measures = [close(bound(ex.q, ex.k, ex.v, shaped[f]), ref, allowed,
                      f"mask {tuple(shaped[f].shape)} vs {tuple(shaped[present[0]].shape)}") for f in present[1:]]
    return worst(*measures)
