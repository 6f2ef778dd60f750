"""Hypothesis strategies for multi-head attention: sizes, masks and input tensors.

Public API, for the property suite and for users' own tests::

    from properties.strategies import attention_examples
    @given(attention_examples())
    def test_my_layer(ex): ...   # ex.q (B, Lq, D), ex.k (B, Lk, D), ex.v (B, Lk, D), ex.mask

Tensors are not drawn element by element: Hypothesis draws a small description (sizes, a
mask kind and form, per-item magnitudes, a seed) and the tensors are built from it with a
seeded torch.Generator. Examples stay small and fast, and a shrunk counterexample reads as
a handful of integers and names.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from hypothesis import strategies as st

# Mask structures; the first shrinks best.
MASK_KINDS = ("none", "all_keep", "random", "padding", "causal", "dead_rows", "dead_item")
# Mask shapes, all broadcasting to (B, H, Lq, Lk).
MASK_FORMS = ("B1LL", "11LL", "LL", "BHLL")
# bool keep-mask, additive float 0/-inf, additive float with finite biases on kept keys.
MASK_CONVENTIONS = ("bool", "float", "float_bias")
# Per-item magnitudes of q, k and v: 1e3 overflows exp() in a softmax without max-subtraction.
MAGNITUDES = (1.0, 1e-3, 1e-2, 0.1, 10.0, 100.0, 1e3)


class Sizes(NamedTuple):
    """B, Lq, Lk (== Lv), D = d_model and H = n_head, with D % H == 0."""

    batch: int
    lq: int
    lk: int
    d_model: int
    n_head: int

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def mask_target(self) -> tuple[int, int, int, int]:
        """(B, H, Lq, Lk), the shape every mask broadcasts to."""
        return (self.batch, self.n_head, self.lq, self.lk)


class MaskSpec(NamedTuple):
    """How to build a mask: structure, shape form, convention and the seed of its random bits."""

    kind: str
    form: str
    convention: str
    seed: int


class AttnExample(NamedTuple):
    """One generated input: q (B, Lq, D), k (B, Lk, D), v (B, Lk, D), mask or None.

    k and v are always distinct tensors with distinct values. ``scales`` holds the
    magnitude of each batch item; ``seed`` drew the values.
    """

    sizes: Sizes
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor | None
    mask_spec: MaskSpec
    scales: tuple[float, ...]
    seed: int

    def describe(self) -> str:
        """A one-line, human-readable summary of this example (for counterexamples)."""
        s = self.sizes
        m = "no mask" if self.mask is None else (
            f"mask {self.mask_spec.kind} {self.mask_spec.convention} shape={tuple(self.mask.shape)}"
            f" ({_keep_fraction(self.mask):.0%} kept)"
        )
        return (
            f"B={s.batch} Lq={s.lq} Lk={s.lk} D={s.d_model} H={s.n_head} (Hd={s.head_dim}), "
            f"{m}, item scales={list(self.scales)}, dtype={str(self.q.dtype).replace('torch.', '')}, "
            f"value seed={self.seed}"
        )


def _keep_fraction(mask: torch.Tensor) -> float:
    keep = mask if mask.dtype == torch.bool else mask > -math.inf
    return float(keep.float().mean()) if keep.numel() else 1.0


def _check_positive(**kwargs: int) -> None:
    for name, value in kwargs.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {name}={value!r}")


def sizes(
    *, max_batch: int = 3, max_len: int = 6, max_heads: int = 4, max_head_dim: int = 64
) -> st.SearchStrategy[Sizes]:
    """Sizes with D = H * Hd, Hd in [1, max_head_dim], and Lq, Lk drawn independently.

    Lk is drawn as "equal to Lq", "1" or "any" so that all three cases are common.
    """
    _check_positive(max_batch=max_batch, max_len=max_len, max_heads=max_heads, max_head_dim=max_head_dim)

    @st.composite
    def draw_sizes(draw: st.DrawFn) -> Sizes:
        batch = draw(st.integers(1, max_batch))
        lq = draw(st.integers(1, max_len))
        lk = draw(st.one_of(st.just(lq), st.just(1), st.integers(1, max_len)))
        n_head = draw(st.integers(1, max_heads))
        head_dim = draw(st.one_of(st.integers(1, min(8, max_head_dim)), st.integers(1, max_head_dim)))
        return Sizes(batch, lq, lk, n_head * head_dim, n_head)

    return draw_sizes()


def mask_specs(
    *,
    kinds: tuple[str, ...] = MASK_KINDS,
    forms: tuple[str, ...] = MASK_FORMS,
    conventions: tuple[str, ...] = MASK_CONVENTIONS,
) -> st.SearchStrategy[MaskSpec]:
    """Descriptions of masks; turn one into a tensor with :func:`build_mask`."""
    for name, chosen, allowed in (("kinds", kinds, MASK_KINDS), ("forms", forms, MASK_FORMS),
                                  ("conventions", conventions, MASK_CONVENTIONS)):
        bad = [c for c in chosen if c not in allowed]
        if not chosen or bad:
            raise ValueError(f"{name} must be a non-empty subset of {allowed}, got {name}={chosen!r}")
    return st.builds(
        MaskSpec, st.sampled_from(kinds), st.sampled_from(forms), st.sampled_from(conventions),
        st.integers(0, 2**16),
    )


def _form_shape(form: str, s: Sizes) -> tuple[int, ...]:
    return {
        "BHLL": (s.batch, s.n_head, s.lq, s.lk),
        "B1LL": (s.batch, 1, s.lq, s.lk),
        "11LL": (1, 1, s.lq, s.lk),
        "LL": (s.lq, s.lk),
    }[form]


def build_keep(spec: MaskSpec, s: Sizes) -> torch.Tensor | None:
    """The bool keep-mask (True = may attend) that ``spec`` describes, in the shape of its form."""
    if spec.kind == "none":
        return None
    shape = _form_shape(spec.form, s)
    gen = torch.Generator().manual_seed(spec.seed)
    rows = torch.arange(s.lq).unsqueeze(-1)  # (Lq, 1)
    cols = torch.arange(s.lk)  # (Lk,)
    if spec.kind == "all_keep":
        keep = torch.ones(shape, dtype=torch.bool)
    elif spec.kind == "random":
        keep = torch.rand(shape, generator=gen) < 0.6
    elif spec.kind == "padding":
        # per item (where the form has a batch axis): keys at and past the item's length are padding
        n_items = shape[0] if len(shape) == 4 else 1
        lengths = torch.randint(1, s.lk + 1, (n_items,), generator=gen)  # (n_items,)
        keep = (cols < lengths.view(-1, 1, 1, 1)).expand(n_items, shape[-3] if len(shape) == 4 else 1, s.lq, s.lk)
        keep = keep.reshape(shape) if len(shape) == 4 else keep[0, 0]
    elif spec.kind == "causal":
        keep = (cols <= rows).expand(shape)
    elif spec.kind == "dead_rows":
        keep = torch.rand(shape, generator=gen) < 0.6
        dead = torch.rand(shape[:-1], generator=gen) < 0.4  # (..., Lq)
        dead.view(-1)[torch.randint(0, dead.numel(), (1,), generator=gen)] = True  # at least one dead row
        keep = keep & ~dead.unsqueeze(-1)
    elif spec.kind == "dead_item":
        keep = torch.rand(shape, generator=gen) < 0.6
        if len(shape) == 4:
            keep[torch.randint(0, shape[0], (1,), generator=gen)] = False  # one item sees no key at all
        else:
            keep[:] = False  # no batch axis: every item is the dead item
    else:
        raise ValueError(f"kind must be one of {MASK_KINDS}, got kind={spec.kind!r}")
    return keep.contiguous()


def build_mask(spec: MaskSpec, s: Sizes, dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
    """The mask that ``spec`` describes, in its convention: bool, or additive float of ``dtype``."""
    keep = build_keep(spec, s)
    if keep is None or spec.convention == "bool":
        return keep
    additive = torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, -math.inf)
    if spec.convention == "float_bias":
        gen = torch.Generator().manual_seed(spec.seed + 1)
        additive = additive + torch.randn(keep.shape, generator=gen).to(dtype)
    return additive


def magnitudes(*, values: tuple[float, ...] = MAGNITUDES) -> st.SearchStrategy[float]:
    """One magnitude for the values of a batch item; shrinks towards 1.0."""
    if not values or any(not (v > 0 and math.isfinite(v)) for v in values):
        raise ValueError(f"values must be non-empty, positive and finite, got values={values!r}")
    return st.sampled_from(values)


def attention_examples(
    *,
    shapes: st.SearchStrategy[Sizes] | None = None,
    masks: st.SearchStrategy[MaskSpec] | None = None,
    scales: st.SearchStrategy[float] | None = None,
    dtype: torch.dtype = torch.float32,
) -> st.SearchStrategy[AttnExample]:
    """Inputs for a multi-head attention layer: q, k, v and a mask, with k and v distinct.

    ``shapes`` defaults to :func:`sizes`, ``masks`` to :func:`mask_specs` and ``scales`` to
    :func:`magnitudes`. Each batch item gets its own magnitude, so items of very different
    scales meet in one batch.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got dtype={dtype!r}")
    size_st = sizes() if shapes is None else shapes
    mask_st = mask_specs() if masks is None else masks
    scale_st = magnitudes() if scales is None else scales

    @st.composite
    def draw_example(draw: st.DrawFn) -> AttnExample:
        s = draw(size_st)
        spec = draw(mask_st)
        item_scales = tuple(draw(st.lists(scale_st, min_size=s.batch, max_size=s.batch)))
        seed = draw(st.integers(0, 2**16))
        return make_example(s, spec, item_scales, seed, dtype)

    return draw_example()


def make_example(
    s: Sizes, spec: MaskSpec, item_scales: tuple[float, ...], seed: int, dtype: torch.dtype = torch.float32
) -> AttnExample:
    """Build the tensors of an example from its description (what a replay needs)."""
    gen = torch.Generator().manual_seed(seed)
    scale = torch.tensor(item_scales, dtype=torch.float64).view(-1, 1, 1)  # (B, 1, 1)
    q = (torch.randn(s.batch, s.lq, s.d_model, generator=gen, dtype=torch.float64) * scale).to(dtype)
    k = (torch.randn(s.batch, s.lk, s.d_model, generator=gen, dtype=torch.float64) * scale).to(dtype)
    v = (torch.randn(s.batch, s.lk, s.d_model, generator=gen, dtype=torch.float64) * scale).to(dtype)
    return AttnExample(s, q, k, v, build_mask(spec, s, dtype), spec, item_scales, seed)
