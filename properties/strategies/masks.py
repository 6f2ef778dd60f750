"""Attention masks as small descriptions (kind, shape form, convention, seed) and the tensors built
from them: padding on either side or with holes, causal, random, fully masked rows and items, as
bool keep-masks or additive floats (0/-inf, with biases, or a finite large negative).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from hypothesis import strategies as st

from mha_verify.mha.masks import MASK_FORMS, MaskForm, additive_mask, causal_keep
from mha_verify.properties.strategies.size_cases import Sizes

# Mask structures; the first shrinks best.
MASK_KINDS = ("none", "all_keep", "random", "padding", "causal", "fully_masked_rows", "fully_masked_item")
#: drawn only where asked for: right padding alone, the one padding a layer taking lengths (B,) can be given
EXTRA_KINDS = ("right_padding",)
# bool keep-mask; additive float 0/-inf; additive float with finite biases on kept keys;
# additive float that "removes" keys with a finite large negative (finfo.min, -1e9, -1e4), as HF
# transformers and fairseq write masks: by the contract a finite value is a bias, applied exactly.
MASK_CONVENTIONS = ("bool", "float", "float_bias", "float_large")

class MaskSpec(NamedTuple):
    """How to build a mask: structure, shape form, convention and the seed of its random bits."""

    kind: str
    form: str
    convention: str
    seed: int


def mask_specs(
    *,
    kinds: tuple[str, ...] = MASK_KINDS,
    forms: tuple[str, ...] = MASK_FORMS,
    conventions: tuple[str, ...] = MASK_CONVENTIONS,
) -> st.SearchStrategy[MaskSpec]:
    """Descriptions of masks; turn one into a tensor with :func:`build_mask`.

    Per-head masks ("BHLL", the general form, the only one where heads see different keys)
    are drawn twice as often as each other form: bugs in a layer's head axis of the mask show
    nowhere else (the ci examples of oracle_agreement held 3 % of them at equal odds).
    """
    for name, chosen, allowed in (("kinds", kinds, MASK_KINDS + EXTRA_KINDS), ("forms", forms, MASK_FORMS),
                                  ("conventions", conventions, MASK_CONVENTIONS)):
        bad = [c for c in chosen if c not in allowed]
        if not chosen or bad:
            raise ValueError(f"{name} must be a non-empty subset of {allowed}, got {name}={chosen!r}")
    weighted = tuple(f for form in forms for f in ((form, form) if form == "BHLL" else (form,)))
    return st.builds(
        MaskSpec, st.sampled_from(kinds), st.sampled_from(weighted), st.sampled_from(conventions),
        st.integers(0, 2**16),
    )


def _form_shape(form: str, s: Sizes) -> tuple[int, ...]:
    return MaskForm(form).shape(s.batch, s.n_head, s.lq, s.lk)


def build_keep(spec: MaskSpec, s: Sizes) -> torch.Tensor | None:
    """The bool keep-mask (True = may attend) that ``spec`` describes, in the shape of its form.

    Masks with a batch axis differ per item. A key-padding form (B, 1, 1, Lk) has no query
    axis, so a causal structure there becomes padding and fully masked rows become a fully masked item.
    """
    if spec.kind == "none":
        return None
    shape = _form_shape(spec.form, s)
    gen = torch.Generator().manual_seed(spec.seed)
    kind = "padding" if spec.kind == "causal" and spec.form == "B11L" else spec.kind
    if kind == "all_keep":
        keep = torch.ones(shape, dtype=torch.bool)
    elif kind == "random":
        keep = torch.rand(shape, generator=gen) < 0.6
    elif kind in ("padding", "right_padding"):
        # per item (where the form has a batch axis) a length, padded on the right (encoder
        # batches), on the left (decoder batches) or with holes (packed or filtered tokens); the
        # first item always has at least one padded key when Lk > 1
        n_items = shape[0] if len(shape) == 4 else 1
        lengths = torch.randint(1, s.lk + 1, (n_items,), generator=gen)  # (n_items,)
        lengths[0] = min(int(lengths[0]), max(1, s.lk - 1))
        sides = torch.randint(0, len(PADDING_SIDES), (n_items,), generator=gen)
        if kind == "right_padding":
            sides.zero_()
        keep = torch.stack([_padded(int(n), PADDING_SIDES[int(side)], s.lk, gen)
                            for n, side in zip(lengths, sides, strict=True)]).view(n_items, 1, 1, s.lk)
        keep = keep.expand(n_items, *shape[-3:]) if len(shape) == 4 else keep[0, 0].expand(shape)
    elif kind == "causal":
        keep = causal_keep(s.lq, s.lk).expand(shape)
    elif kind == "fully_masked_rows":
        keep = torch.rand(shape, generator=gen) < 0.6
        masked = torch.rand(shape[:-1], generator=gen) < 0.4  # (..., Lq)
        masked.view(-1)[torch.randint(0, masked.numel(), (1,), generator=gen)] = True  # at least one fully masked row
        keep = keep & ~masked.unsqueeze(-1)
    elif kind == "fully_masked_item":
        keep = torch.rand(shape, generator=gen) < 0.6
        if len(shape) == 4:
            keep[torch.randint(0, shape[0], (1,), generator=gen)] = False  # one item sees no key, next to live ones
        else:
            keep[:] = False  # no batch axis: every item is the fully masked item
    else:
        raise ValueError(f"kind must be one of {MASK_KINDS + EXTRA_KINDS}, got kind={spec.kind!r}")
    return keep.contiguous()


PADDING_SIDES = ("right", "left", "holes")


def _padded(length: int, side: str, lk: int, gen: torch.Generator) -> torch.Tensor:
    """bool (Lk,): ``length`` kept keys, padded on ``side`` (holes: kept keys at random places)."""
    at = torch.arange(lk)
    if side == "right":
        return at < length
    if side == "left":
        return at >= lk - length
    keep = torch.zeros(lk, dtype=torch.bool)
    keep[torch.randperm(lk, generator=gen)[:length]] = True
    return keep


# finite large negatives that layers use to remove keys; drawn per mask from its seed
LARGE_NEGATIVES = ("finfo.min", -1e9, -1e4)


def build_mask(spec: MaskSpec, s: Sizes, dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
    """The mask that ``spec`` describes, in its convention: bool, or additive float of ``dtype``.

    "float": 0 / -inf; "float_bias": 0 / -inf plus N(0, 1) biases; "float_large": 0 / a
    finite large negative (``torch.finfo(dtype).min``, -1e9 or -1e4), a bias by the contract.
    """
    keep = build_keep(spec, s)
    if keep is None or spec.convention == "bool":
        return keep
    if spec.convention == "float_large":
        # A row whose every key has the large negative is a row of equal biases: float64 keeps
        # the scores under them, float32 rounds them away (1e9 + s), so no same-precision
        # formula agrees with the oracle there and its tolerance would swallow the example.
        # Every row keeps its first key, the one key that any causal window also shows.
        keep = keep.clone()
        keep[..., 0] = True
        choice = LARGE_NEGATIVES[spec.seed % len(LARGE_NEGATIVES)]
        big = torch.finfo(dtype).min if choice == "finfo.min" else max(float(choice), torch.finfo(dtype).min)
        return torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, big)
    additive = additive_mask(keep, dtype)
    assert additive is not None
    if spec.convention == "float_bias":
        gen = torch.Generator().manual_seed(spec.seed + 1)
        additive = additive + torch.randn(keep.shape, generator=gen).to(dtype)
    return additive
