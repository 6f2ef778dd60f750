"""Generated inputs for validating an exported model: the property suite's strategies at a
fixed (d_model, n_head), with the masks an ONNX model takes (bool, or float 0/-inf).

B, Lq and Lk are drawn independently (Lk "equal to Lq", "1" or "any"), 1 included; masks
of every kind and form (incl. fully masked rows and items); k and v always distinct.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import strategies as st

from properties.strategies import MASK_KINDS, AttnExample, Sizes, magnitudes, make_example, mask_specs

# float16 overflows (65504) on the scores of items of magnitude 100 and more; the property
# suite's larger magnitudes stay for float32.
FLOAT16_MAGNITUDES = (1.0, 1e-3, 1e-2, 0.1, 10.0)


def export_examples(
    d_model: int, n_head: int, *, dtype: torch.dtype = torch.float32, max_batch: int = 4, max_len: int = 8,
    kinds: tuple[str, ...] = MASK_KINDS,
) -> st.SearchStrategy[AttnExample]:
    """Examples q (B, Lq, D), k (B, Lk, D), v (B, Lk, D), mask, with D, H fixed and B, Lq, Lk free."""
    for name, value in (("d_model", d_model), ("n_head", n_head), ("max_batch", max_batch), ("max_len", max_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {name}={value!r}")
    scales = magnitudes(values=FLOAT16_MAGNITUDES) if dtype == torch.float16 else magnitudes()
    masks = mask_specs(kinds=kinds, forms=("B1LL", "11LL", "LL", "BHLL"), conventions=("bool", "float"))

    @st.composite
    def draw_example(draw: st.DrawFn) -> AttnExample:
        batch = draw(st.integers(1, max_batch))
        lq = draw(st.integers(1, max_len))
        lk = draw(st.one_of(st.just(lq), st.just(1), st.integers(1, max_len)))
        spec = draw(masks)
        item_scales = tuple(draw(st.lists(scales, min_size=batch, max_size=batch)))
        seed = draw(st.integers(0, 2**16))
        return make_example(Sizes(batch, lq, lk, d_model, n_head), spec, item_scales, seed, dtype)

    return draw_example()


def keep_mask(mask: torch.Tensor | None) -> np.ndarray | None:
    """A mask in our convention -> bool keep-mask of rank 4 (B|1, H|1, Lq, Lk) as numpy, or None."""
    if mask is None:
        return None
    keep = mask if mask.dtype == torch.bool else mask > -math.inf
    keep = keep.reshape((1,) * (4 - keep.dim()) + tuple(keep.shape))  # (Lq, Lk) -> (1, 1, Lq, Lk)
    return keep.cpu().numpy()
