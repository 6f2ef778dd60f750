"""Memory layout: the output does not depend on how the caller's tensors sit in memory.

Kernel wrappers that skip ``.contiguous()`` read a view's storage as if it were dense: exact on
the fresh tensors a test makes, wrong by the size of the values on the views callers hand
them (PyTorch's OpInfo tests feed non-contiguous samples for this reason).
"""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import strategies as st

from mha_verify.properties.engine.applicable import examples_for
from mha_verify.properties.engine.measure import UNCHECKED, Measure, close, relation_allowed
from mha_verify.properties.engine.registry import invariant
from mha_verify.properties.protocol import Conventions, Instance, NotApplicable
from mha_verify.properties.strategies.examples import LAYOUTS, AttnExample, with_layout


def _contiguous(conv: Conventions) -> st.SearchStrategy[AttnExample] | str:
    if not conv.torch_modes:  # false exactly for onnxruntime sessions
        return "an onnxruntime session is fed copies of the inputs: their memory layout never reaches the graph"
    return examples_for(conv, layouts=False)


@invariant("layout_independence", strategy=_contiguous)
def layout_independence(bound: Instance, ex: AttnExample) -> Measure:
    """The output on views of the inputs equals the output on fresh contiguous tensors of the same values.

    In one layout of :data:`~mha_verify.properties.strategies.LAYOUTS` per example, in turn by
    the example's seed (the next one where the example cannot take it): q, k, v as transposed
    views of (L, B, D) storage; as slices of one fused (B, L, 3D) tensor; k and v as the first Lk
    rows of a (B, Lk + 3, D) cache whose other rows are NaN; the mask as a stride-0 expansion.
    The output is within the relation allowance (twice the
    derived tolerance) of the contiguous call's, on the rows where the contiguous call's output is
    finite (a NaN row in both is the fully-masked-row property's finding, not a layout's). A
    target that raises on a view and not on contiguous copies is held on the next layout, with a
    warning naming the error (it rejects what callers hand it, but computes nothing wrong).
    """
    reference = bound(ex.q, ex.k, ex.v, ex.mask).detach()
    rows = torch.isfinite(reference).all(dim=-1)  # (B, Lq)
    if not bool(rows.any()):
        return UNCHECKED
    allowed = relation_allowed(bound, ex)
    others = LAYOUTS[1:]
    rejected = None
    for layout in (others[(ex.seed + i) % len(others)] for i in range(len(others))):
        view = with_layout(ex, layout)
        if view.layout == "contiguous":
            continue  # nothing to lay out differently (no mask to expand)
        try:
            out = bound(view.q, view.k, view.v, view.mask)
        except NotApplicable as exc:
            rejected = rejected or f"{exc} on {layout} inputs"
            continue
        measure = close(out, reference, allowed, f"output on {layout} inputs vs the same values contiguous", rows)
        return measure if rejected is None or not measure.checked else dataclasses.replace(measure, remark=rejected)
    if rejected is not None:  # every layout refused: unchecked, and the verdict says why
        raise NotApplicable(rejected)
    return UNCHECKED
