"""Hypothesis strategies for multi-head attention: sizes, masks and input tensors.

Public API, for the property suite and for users' own tests::

    from mha_verify.properties.strategies import attention_examples
    @given(attention_examples())
    def test_my_layer(ex): ...   # ex.q (B, Lq, D), ex.k (B, Lk, D), ex.v (B, Lk, D), ex.mask

Tensors are not drawn element by element: Hypothesis draws a small description (sizes, a
mask kind and form, per-item magnitudes, a seed) and the tensors are built from it with a
seeded torch.Generator. Examples stay small and fast, and a shrunk counterexample reads as
a handful of integers and names.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from contextvars import ContextVar
from typing import NamedTuple

import torch
from hypothesis import strategies as st

from mha_verify.mha.masks import MASK_FORMS, MaskForm, additive_mask, causal_keep, kept_fraction

# Mask structures; the first shrinks best.
MASK_KINDS = ("none", "all_keep", "random", "padding", "causal", "fully_masked_rows", "fully_masked_item")
# bool keep-mask; additive float 0/-inf; additive float with finite biases on kept keys;
# additive float that "removes" keys with a finite large negative (finfo.min, -1e9, -1e4), as HF
# transformers and fairseq write masks: by the contract a finite value is a bias, applied exactly.
MASK_CONVENTIONS = ("bool", "float", "float_bias", "float_large")
# Block sizes of tiled kernels and chunked loops: lengths land on them, one off, and past them.
BOUNDARIES = (16, 32, 64, 128, 256)
# The cases of :func:`sizes`: ("small", 0) keeps every axis small; the others push one axis
# onto a block boundary (16 .. 256), one off it or past it with an odd remainder, or past the
# chunk sizes of head and batch loops (4, 8) and head-width caps (64), D up to 1024.
SIZE_CASES: tuple[tuple[str, object], ...] = (
    *(("small", 0),) * 12,
    ("lk", 33), ("lk", 31), ("lk", 32), ("lk", 65), ("lk", 129), ("lk", 257), ("lk", 19),
    ("lq", 17), ("lq", 16), ("lq", 33), ("lq", 130), ("lq", 257),
    ("lqlk", 64), ("lqlk", 129),
    ("batch", 8), ("batch", 9),
    ("heads", (16, 64)), ("heads", (8, 128)), ("heads", (5, 24)), ("heads", (12, 64)), ("heads", (8, 16)),
    ("heads", (16, 8)),
)
# Per-item magnitudes of q, k and v: 1e3 overflows exp() in a softmax without max-subtraction.
MAGNITUDES = (1.0, 1e-3, 1e-2, 0.1, 10.0, 100.0, 1e3)
# float16 tops out at 65504. At magnitude 100 the projections are ~60 and, at Hd = 128, the
# unscaled scores q.k ~ 4e4 with tails past the limit: a layer that computes (q k^T) / sqrt(Hd)
# in float16 overflows there, while the pre-scaled scores (q / sqrt(Hd)) k ~ 3e3 stay finite.
# Magnitude 1e3 overflows every float16 evaluation, the oracle's same-precision one included.
FLOAT16_MAGNITUDES = (1.0, 1e-3, 1e-2, 0.1, 10.0, 100.0)
# How the caller's tensors sit in memory. "contiguous": fresh tensors. "transposed": q, k and v are
# transposed views of (L, B, D) storage (sequence-first callers, torch MHA's own layout);
# "fused": slices of one (B, L, 3D) tensor, qkv.chunk(3, -1) of a fused projection (k and v
# only, from (B, Lk, 2D), when Lq != Lk); "cache": k and v are the first Lk rows of a
# preallocated (B, Lk + 3, D) cache whose unused rows hold NaN (static KV caches); "expanded_mask":
# the mask is a stride-0 expansion along each axis where its values are constant (a padding
# mask .expand()-ed over heads and queries, a causal mask over the batch).
LAYOUTS = ("contiguous", "transposed", "fused", "cache", "expanded_mask")


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
    layout: str = "contiguous"

    def describe(self) -> str:
        """A one-line, human-readable summary of this example (for counterexamples)."""
        s = self.sizes
        m = "no mask" if self.mask is None else (
            f"mask {self.mask_spec.kind} {self.mask_spec.convention}{_large(self.mask)} shape={tuple(self.mask.shape)}"
            f" ({kept_fraction(self.mask):.0%} kept)"
        )
        return (
            f"B={s.batch} Lq={s.lq} Lk={s.lk} D={s.d_model} H={s.n_head} (Hd={s.head_dim}), "
            f"{m}, item scales={list(self.scales)}, dtype={str(self.q.dtype).replace('torch.', '')}, "
            f"value seed={self.seed}" + ("" if self.layout == "contiguous" else f", layout {self.layout}")
        )


_FORCED_CASE: ContextVar[tuple[str, object] | None] = ContextVar("mha_verify_size_case", default=None)
# The cases of properties that cost several forward passes per example: lengths up to 33,
# batches of 8, up to 8 heads of width 16 (no D = 1024, no 257-long rows).
MODEST_CASES: tuple[tuple[str, object], ...] = (
    *(("small", 0),) * 12, ("lk", 33), ("lk", 17), ("lq", 17), ("lq", 16), ("batch", 8), ("heads", (8, 16)),
    ("heads", (5, 8)),
)
_CASE_TABLE: ContextVar[tuple[tuple[str, object], ...]] = ContextVar("mha_verify_size_cases", default=SIZE_CASES)


@contextlib.contextmanager
def modest_size_cases() -> Iterator[None]:
    """Within the block, :func:`sizes` strategies built draw from :data:`MODEST_CASES`."""
    token = _CASE_TABLE.set(MODEST_CASES)
    try:
        yield
    finally:
        _CASE_TABLE.reset(token)


@contextlib.contextmanager
def forced_size_case(case: tuple[str, object]) -> Iterator[None]:
    """Within the block, :func:`sizes` strategies built draw only ``case`` (one of SIZE_CASES).

    The runner sweeps :func:`boundary_cases` this way after its random examples, so a short
    derandomized run reaches every boundary whatever Hypothesis's generator favours.
    """
    if case not in SIZE_CASES and case not in MODEST_CASES:
        raise ValueError(f"case must be one of SIZE_CASES or MODEST_CASES, got case={case!r}")
    token = _FORCED_CASE.set(case)
    try:
        yield
    finally:
        _FORCED_CASE.reset(token)


def boundary_cases() -> tuple[tuple[str, object], ...]:
    """The cases of SIZE_CASES that push an axis past a boundary (all but "small")."""
    return tuple(dict.fromkeys(c for c in SIZE_CASES if c[0] != "small"))


def _large(mask: torch.Tensor) -> str:
    """' (-1e+09)' for a mask that removes keys with a finite large negative, else ''."""
    if mask.dtype == torch.bool:
        return ""
    low = float(mask.min()) if mask.numel() else 0.0
    return f" ({low:.3g})" if -math.inf < low <= -1e4 else ""


def _check_positive(**kwargs: int) -> None:
    for name, value in kwargs.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {name}={value!r}")


def sizes(
    *, max_batch: int = 9, max_len: int = 300, max_heads: int = 16, max_head_dim: int = 128,
    max_d_model: int = 1024, min_batch: int = 1, min_len: int = 1, fixed: tuple[int, int] | None = None,
    axes: tuple[int | None, int | None, int | None] = (None, None, None),
) -> st.SearchStrategy[Sizes]:
    """Sizes with D = H * Hd and Lq, Lk drawn independently, reaching past real block boundaries.

    A third of the examples are small (cheap, and they shrink well); each of the others
    pushes one axis (:data:`SIZE_CASES`) past the sizes where tiled kernels and chunked loops
    change behaviour, keeping the rest small: Lq and/or Lk on a block size of
    :data:`BOUNDARIES`, one off it or with an odd remainder; up to 16 heads and head widths
    up to 128 (D up to ``max_d_model``); 8 and 9 batch items.

    Lk = 1 (softmax identically 1: q, k and the scale cannot matter) is kept rare, ~10 %.
    ``fixed=(d_model, n_head)`` pins D and H (an exported model); ``min_batch``/``min_len``
    keep examples where a property compares something (permutations need 2 positions).
    ``axes=(B, Lq, Lk)`` pins each axis given (a model exported with static axes is judged at
    its sizes), whatever the case or the minimums.
    """
    _check_positive(max_batch=max_batch, max_len=max_len, max_heads=max_heads, max_head_dim=max_head_dim,
                    max_d_model=max_d_model, min_batch=min_batch, min_len=min_len)
    if min_batch > max_batch or min_len > max_len:
        raise ValueError(f"min_batch={min_batch}, min_len={min_len} must not exceed max_batch={max_batch}, "
                         f"max_len={max_len}")
    if fixed is not None:
        d_fixed, h_fixed = fixed
        _check_positive(d_model=d_fixed, n_head=h_fixed)
        if d_fixed % h_fixed:
            raise ValueError(f"fixed d_model={d_fixed} is not divisible by n_head={h_fixed}")
    for name, size in zip(("B", "Lq", "Lk"), axes, strict=True):
        if size is not None:
            _check_positive(**{name: size})
    forced = _FORCED_CASE.get()
    cases = _CASE_TABLE.get() if forced is None else (forced,)
    drawn = _draw_sizes(cases, min_batch, max_batch, min_len, max_len, max_heads, max_head_dim, max_d_model, fixed)
    if axes == (None, None, None):
        return drawn
    return drawn.map(lambda s: s._replace(batch=axes[0] or s.batch, lq=axes[1] or s.lq, lk=axes[2] or s.lk))


# Composite strategies are decorated once, here: ``st.composite`` inspects the function's
# signature, which cost 5 ms for every strategy built inside ``sizes()`` (10 s of a ci gate).
@st.composite
def _draw_sizes(draw: st.DrawFn, cases: tuple[tuple[str, object], ...], min_batch: int, max_batch: int,
                min_len: int, max_len: int, max_heads: int, max_head_dim: int, max_d_model: int,
                fixed: tuple[int, int] | None) -> Sizes:
    small_len = min(8, max_len)

    def clamp(n: int) -> int:
        return max(min_len, min(max_len, n))

    def small(lo: int = 1) -> int:
        return draw(st.integers(max(min_len, lo), max(min_len, lo, small_len)))

    # Every choice is drawn in the same order whatever the case, and the case overrides
    # afterwards: the shrinker can then move a counterexample to the "small" case (index 0).
    axis, value = draw(st.sampled_from(cases))
    batch = draw(st.integers(min_batch, max(min_batch, min(3, max_batch))))
    lq = small(1)
    lk_mode = draw(st.sampled_from(_LK_MODES))
    lk_other = small(2)
    n_head = draw(st.integers(1, min(4, max_heads)))
    head_dim = draw(st.integers(1, min(8, max_head_dim)))
    # beside a wide or batch axis, two positions at least: with one key, softmax is 1 and keys cannot matter
    if axis in ("batch", "heads"):
        lq = clamp(max(lq, 2))
        lk_mode = "other" if lk_mode == "one" else lk_mode
    # Lk = 1 only when chosen ("one"): a single query meets several keys otherwise (decoding)
    lk = lq if lk_mode == "same" and lq > 1 else clamp(1) if lk_mode == "one" else lk_other
    if axis == "batch":
        batch = max(min_batch, min(max_batch, int(value)))  # type: ignore[call-overload]
    if axis in ("lq", "lqlk"):
        lq = clamp(int(value))  # type: ignore[call-overload]
    if axis in ("lk", "lqlk"):
        lk = clamp(int(value))  # type: ignore[call-overload]
    if fixed is not None:
        return Sizes(batch, lq, lk, fixed[0], fixed[1])
    if axis == "heads":
        assert isinstance(value, tuple)
        wide: tuple[int, int] = value
        n_head, head_dim = min(wide[0], max_heads), min(wide[1], max_head_dim)
        while n_head * head_dim > max_d_model and head_dim > 1:
            head_dim //= 2
    return Sizes(batch, lq, lk, n_head * head_dim, n_head)


# Lk = 1 ("one") is one choice in ten, away from both ends: Hypothesis draws the first and last
# elements of a sampled_from more often than the rest (at the end it gave Lk = 1 in 13-18 % of
# the ci examples); the first, "same", is where a counterexample shrinks to.
_LK_MODES = ("same", "other", "same", "other", "one", "same", "other", "other", "same", "other")


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
    for name, chosen, allowed in (("kinds", kinds, MASK_KINDS), ("forms", forms, MASK_FORMS),
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
    elif kind == "padding":
        # per item (where the form has a batch axis) a length, padded on the right (encoder
        # batches), on the left (decoder batches) or with holes (packed or filtered tokens); the
        # first item always has at least one padded key when Lk > 1
        n_items = shape[0] if len(shape) == 4 else 1
        lengths = torch.randint(1, s.lk + 1, (n_items,), generator=gen)  # (n_items,)
        lengths[0] = min(int(lengths[0]), max(1, s.lk - 1))
        sides = torch.randint(0, len(PADDING_SIDES), (n_items,), generator=gen)
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
        raise ValueError(f"kind must be one of {MASK_KINDS}, got kind={spec.kind!r}")
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
    mixed_scales: bool = False,
    layouts: bool = True,
) -> st.SearchStrategy[AttnExample]:
    """Inputs for a multi-head attention layer: q, k, v and a mask, with k and v distinct.

    ``shapes`` defaults to :func:`sizes`, ``masks`` to :func:`mask_specs` and ``scales`` to
    :func:`magnitudes` (for float16, whose scores overflow at 65504, magnitudes up to 100).
    Each batch item gets its own magnitude; with ``mixed_scales`` every batch of two or more
    items holds one item at 1e-3 and one at 1e3 (float16: 100), side by side. About a third of
    the examples come in a non-contiguous :data:`LAYOUTS` layout (``layouts=False``: none).
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got dtype={dtype!r}")
    size_st = sizes() if shapes is None else shapes
    mask_st = mask_specs() if masks is None else masks
    if scales is None:
        scales = magnitudes(values=FLOAT16_MAGNITUDES) if dtype == torch.float16 else magnitudes()
    return _draw_example(size_st, mask_st, scales, dtype, mixed_scales, _LAYOUT_DRAWS if layouts else ("contiguous",))


# Contiguous first (where a counterexample shrinks to) and last (Hypothesis draws the ends of a
# sampled_from most often): about a third of the examples come in another layout.
_LAYOUT_DRAWS = ("contiguous", "transposed", "contiguous", "fused", "contiguous", "cache", "contiguous",
                 "expanded_mask", "contiguous")


@st.composite
def _draw_example(draw: st.DrawFn, size_st: st.SearchStrategy[Sizes], mask_st: st.SearchStrategy[MaskSpec],
                  scale_st: st.SearchStrategy[float], dtype: torch.dtype, mixed_scales: bool,
                  layouts: tuple[str, ...]) -> AttnExample:
    s = draw(size_st)
    spec = draw(mask_st)
    item_scales = tuple(draw(st.lists(scale_st, min_size=s.batch, max_size=s.batch)))
    if mixed_scales and s.batch >= 2:
        small, large = draw(st.permutations(range(s.batch)))[:2]
        extremes = (1e-3, 1e3) if dtype != torch.float16 else (1e-3, 100.0)
        item_scales = tuple(extremes[0] if i == small else extremes[1] if i == large else x
                            for i, x in enumerate(item_scales))
    seed = draw(st.integers(0, 2**16))
    layout = draw(st.sampled_from(layouts))
    return make_example(s, spec, item_scales, seed, dtype, layout)


def make_example(
    s: Sizes, spec: MaskSpec, item_scales: tuple[float, ...], seed: int, dtype: torch.dtype = torch.float32,
    layout: str = "contiguous",
) -> AttnExample:
    """Build the tensors of an example from its description (what a replay needs)."""
    gen = torch.Generator().manual_seed(seed)
    scale = torch.tensor(item_scales, dtype=torch.float64).view(-1, 1, 1)  # (B, 1, 1)
    q = (torch.randn(s.batch, s.lq, s.d_model, generator=gen, dtype=torch.float64) * scale).to(dtype)
    k = (torch.randn(s.batch, s.lk, s.d_model, generator=gen, dtype=torch.float64) * scale).to(dtype)
    v = (torch.randn(s.batch, s.lk, s.d_model, generator=gen, dtype=torch.float64) * scale).to(dtype)
    return with_layout(AttnExample(s, q, k, v, build_mask(spec, s, dtype), spec, item_scales, seed), layout)


def with_layout(ex: AttnExample, layout: str) -> AttnExample:
    """The same values as ``ex`` in ``layout`` (one of :data:`LAYOUTS`); q, k and v keep their
    identity relations (q is k is v stays so). ``ex.layout`` names what was applied: "contiguous"
    where the layout has nothing to change (no mask to expand, or no axis it is constant along)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got layout={layout!r}")
    q, k, v = ex.q.contiguous(), ex.k.contiguous(), ex.v.contiguous()
    mask = None if ex.mask is None else ex.mask.contiguous()
    shared = ex.k is ex.q and ex.v is ex.q  # a self-attention example: one tensor in three roles
    applied = layout
    if layout == "transposed":
        q, k, v = (t.transpose(0, 1).contiguous().transpose(0, 1) for t in (q, k, v))  # (L, B, D) storage
    elif layout == "fused" and q.shape[1] == k.shape[1]:
        q, k, v = torch.cat([q, k, v], dim=-1).chunk(3, dim=-1)  # slices of (B, L, 3D)
    elif layout == "fused":
        k, v = torch.cat([k, v], dim=-1).chunk(2, dim=-1)  # slices of (B, Lk, 2D)
    elif layout == "cache":
        k, v = (_cached(t) for t in (k, v))
    elif layout == "expanded_mask":
        mask, applied = _expanded(mask)
    if shared:
        k = v = q
    return ex._replace(q=q, k=k, v=v, mask=mask, layout=applied)


def _cached(t: torch.Tensor) -> torch.Tensor:
    """(B, L, D) -> the first L rows of a (B, L + 3, D) buffer whose other rows are NaN."""
    buffer = torch.full((t.shape[0], t.shape[1] + 3, t.shape[2]), math.nan, dtype=t.dtype)
    buffer[:, :t.shape[1]] = t
    return buffer[:, :t.shape[1]]


def _expanded(mask: torch.Tensor | None) -> tuple[torch.Tensor | None, str]:
    """``mask`` as a stride-0 expansion along every axis of size > 1 it is constant along."""
    if mask is None:
        return None, "contiguous"
    base = mask
    for axis in range(mask.dim()):
        if mask.shape[axis] > 1 and bool((mask == mask.narrow(axis, 0, 1)).all()):
            base = base.narrow(axis, 0, 1)
    if base.shape == mask.shape:
        return mask, "contiguous"
    return base.expand(mask.shape), "expanded_mask"
