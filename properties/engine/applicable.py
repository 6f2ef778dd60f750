"""Which examples a target can take, decided from its conventions before a property runs, and
the keep-mask views of an example that properties compare on."""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from mha_verify.mha.masks import MASK_FORMS, causal_keep, full_keep
from mha_verify.properties.protocol import LAWS_ONLY, NO_MASK, Conventions
from mha_verify.properties.strategies.examples import AttnExample, attention_examples
from mha_verify.properties.strategies.masks import MASK_KINDS, MaskSpec, mask_specs
from mha_verify.properties.strategies.size_cases import Sizes, sizes

# mask kinds a causal target's own mask cannot contradict usefully are still drawn: the target
# ANDs them with its causal mask, and the oracle does the same.


def keep_of(ex: AttnExample, causal: bool | str = False) -> torch.Tensor:
    """The example's keep-mask expanded to (B, H, Lq, Lk), with the target's causality applied
    (``causal``: False, True = "top_left", or "bottom_right", under which Lq > Lk leaves the first
    Lq - Lk rows fully masked)."""
    keep = full_keep(ex.mask, ex.sizes.mask_target())
    if causal:
        keep = keep & causal_keep(ex.sizes.lq, ex.sizes.lk, align=causal)
    return keep


def fully_masked(ex: AttnExample, causal: bool | str = False) -> torch.Tensor:
    """bool (B, H, Lq): fully masked query rows of each head (every key removed)."""
    return ~keep_of(ex, causal).any(dim=-1)


def comparable_rows(ex: AttnExample, causal: bool | str = False) -> torch.Tensor:
    """bool (B, Lq): output rows with no fully masked head row (comparable under any convention)."""
    return ~fully_masked(ex, causal).any(dim=1)


def weights_beyond(conv: Conventions) -> str | None:
    """Why the weights a layer returns are not held to softmax's laws (rows summing to one, zero on
    masked keys): it takes a step the oracle does not model (``Conventions.beyond``: talking heads mix
    them across heads after the softmax); None where they are."""
    if not conv.beyond:
        return None
    return (f"{LAWS_ONLY}: it takes {conv.beyond}, a step beyond the attention the oracle models, which may "
            "change the weights it returns")


def mixed_positions(conv: Conventions, *, causal_laws: bool = False) -> str | None:
    """Why a law cannot hold a layer whose step carries positions into each other before the scores
    (``Conventions.mixes_positions``): the laws about a masked key's k and v, and with ``causal_laws``
    the causal ones where that step reaches a position from a later one and the layer is not causal
    itself; None where the law holds it."""
    if conv.mixes_positions is None:
        return None
    if not causal_laws:
        return (f"{LAWS_ONLY}: it takes {conv.mixes_positions}, which carries each position into its neighbours' "
                "queries, keys and values before the scores: a mask removes a key from the scores only")
    if conv.mixes_future is None or conv.causal:
        return None
    return (f"{LAWS_ONLY}: it takes {conv.mixes_positions}, which reaches a position from a later one "
            f"({conv.mixes_future}): a causal mask does not make the layer causal")


def _mask_conventions(conv: Conventions, removal: bool) -> tuple[str, ...]:
    """The mask conventions to draw. ``removal``: only those that remove keys (a finite large
    negative is a bias by the contract, so it removes nothing)."""
    out: list[str] = []
    if "bool" in conv.mask:
        out.append("bool")
    if "float" in conv.mask:
        out += ["float", "float_bias"] + ([] if removal else ["float_large"])
    return tuple(out)


def examples_for(
    conv: Conventions,
    *,
    kinds: tuple[str, ...] = MASK_KINDS,
    shapes: st.SearchStrategy[Sizes] | None = None,
    scales: st.SearchStrategy[float] | None = None,
    dtype: torch.dtype = torch.float32,
    need_mask: bool = False,
    min_batch: int = 1,
    min_len: int = 1,
    mixed_scales: bool = False,
    large_negatives: bool = True,
    layouts: bool = True,
) -> st.SearchStrategy[AttnExample] | str:
    """Examples the target can take, or the reason (a str) why the property cannot apply.

    Self-attention-only targets get q = k = v, targets that take keys and values as one argument
    (``kv_shared``) k = v != q; targets without a mask get no mask; masks
    come only in the types and shapes the target accepts (``conv.mask``, ``conv.mask_forms``);
    a target taking key padding as lengths (``mask_lengths``) gets right padding only;
    ``need_mask`` properties (about removed keys) get masks that remove keys, and so do those
    that ask for no ``large_negatives`` (finite differences cannot resolve a score of 1e9);
    a target of fixed sizes or dtype gets only those. Targets that declare something other
    than zeros on fully masked rows, and those held by the laws alone, get examples without such rows (the
    ``fully_masked_rows`` property checks their declaration separately). ``layouts=False``: fresh
    contiguous tensors only (otherwise a third come as views callers produce, :data:`LAYOUTS`).
    """
    conventions = _mask_conventions(conv, removal=need_mask or not large_negatives)
    if not conventions:
        if need_mask:
            return NO_MASK
        kinds = ("none",)
    elif need_mask:
        kinds = tuple(k for k in kinds if k != "none")
    if conv.mask_lengths and kinds != ("none",):  # key padding as lengths (B,): right padding, or none
        kinds = tuple("right_padding" if k == "padding" else k for k in kinds if k in ("none", "all_keep", "padding"))
        if not kinds or (kinds == ("none",) and need_mask):
            return ("the target takes key padding as lengths (B,), which say right padding only: the masks this "
                    "property needs have no such form")
    forms = tuple(f for f in MASK_FORMS if f in conv.mask_forms)
    if not forms:
        if need_mask:
            return "the target accepts no mask shape we generate"
        kinds = ("none",)
        forms = MASK_FORMS
    if conv.dtype is not None:
        dtype = conv.dtype
    if shapes is None:
        shapes = sizes(fixed=conv.sizes, min_batch=min_batch, min_len=min_len, axes=conv.axes)
    elif conv.axes != (None, None, None):
        fixed_axes = conv.axes
        shapes = shapes.map(lambda s: s._replace(batch=fixed_axes[0] or s.batch, lq=fixed_axes[1] or s.lq,
                                                 lk=fixed_axes[2] or s.lk))
    if conv.max_length is not None:  # a layer sliced to its own causal buffer takes no longer sequence
        longest = conv.max_length
        shapes = shapes.map(lambda s: s._replace(lq=min(s.lq, longest), lk=min(s.lk, longest)))
    if (conv.rotary is not None or conv.head_dim_multiple > 1) and conv.sizes is None:  # only head widths it takes
        m = math.lcm(conv.head_dim_multiple, conv.rotary.head_dim_multiple() if conv.rotary is not None else 1)
        shapes = shapes.map(lambda s: s._replace(d_model=s.n_head * max(m, -(-s.head_dim // m) * m)))
    if conv.sizes is None and any(n is not None and n.kind == "layer" for n in (conv.input_norm, conv.context_norm)):
        # a LayerNorm over one feature gives its bias whatever the input: the layer would compute nothing
        # of it, and with a zero bias q = k = 0, where a QK-norm (F.normalize) is not differentiable
        # (na-vit's gradcheck failed there): D >= 2
        shapes = shapes.map(lambda s: s._replace(d_model=2) if s.d_model == 1 else s)
    if not conv.cross_attention:
        shapes = shapes.map(lambda s: s._replace(lk=s.lq))
    masks: st.SearchStrategy[MaskSpec] = mask_specs(kinds=kinds, forms=forms, conventions=conventions or ("bool",))
    strategy = attention_examples(shapes=shapes, masks=masks, scales=scales, dtype=dtype, mixed_scales=mixed_scales,
                                  layouts=layouts)
    if not conv.cross_attention:
        strategy = strategy.map(lambda ex: ex._replace(k=ex.q, v=ex.q))
    elif conv.kv_shared:  # one argument for keys and values: k = v, still distinct from q
        strategy = strategy.map(lambda ex: ex._replace(v=ex.k))
    if conv.fully_masked != "zeros" or conv.beyond:
        # a layer held by the laws alone: what its fully masked rows give is not held (its step may
        # attend a sink or a learned key there), and NaN there would read as a broken law
        strategy = strategy.filter(lambda ex: not bool(fully_masked(ex, conv.causal).any()))
    return strategy
