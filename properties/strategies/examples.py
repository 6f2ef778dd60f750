"""Whole attention inputs: q, k, v of per-item magnitudes and a mask, built from a seed, and the
memory layouts a caller's tensors come in (transposed views, fused slices, a KV cache, expanded masks).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from hypothesis import strategies as st

from mha_verify.mha.masks import kept_fraction
from mha_verify.properties.strategies.masks import MaskSpec, build_mask, mask_specs
from mha_verify.properties.strategies.size_cases import Sizes, sizes

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



def _large(mask: torch.Tensor) -> str:
    """' (-1e+09)' for a mask that removes keys with a finite large negative, else ''."""
    if mask.dtype == torch.bool:
        return ""
    low = float(mask.min()) if mask.numel() else 0.0
    return f" ({low:.3g})" if -math.inf < low <= -1e4 else ""


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
