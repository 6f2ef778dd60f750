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

from mha_verify.properties.strategies.examples import (
    LAYOUTS,
    MAGNITUDES,
    AttnExample,
    attention_examples,
    magnitudes,
    make_example,
    with_layout,
)
from mha_verify.properties.strategies.masks import MASK_CONVENTIONS, MASK_KINDS, MaskSpec, build_mask, mask_specs
from mha_verify.properties.strategies.size_cases import BOUNDARIES, SIZE_CASES, Sizes, sizes

__all__ = [
    "BOUNDARIES", "LAYOUTS", "MAGNITUDES", "MASK_CONVENTIONS", "MASK_KINDS", "SIZE_CASES", "AttnExample", "MaskSpec",
    "Sizes", "attention_examples", "build_mask", "magnitudes", "make_example", "mask_specs", "sizes", "with_layout",
]
