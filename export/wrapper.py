"""The module that gets exported: any target, called in our convention ``(q, k, v, mask)``.

The graph's interface (what :func:`mha_verify.export.onnx_export.export_onnx` writes):

* ``q`` (B, Lq, D), ``k`` (B, Lk, D), ``v`` (B, Lk, D) in the model's dtype; B, Lq and Lk
  dynamic and independent of each other.
* ``mask``: a **bool keep-mask** (True = this query may attend to this key) of rank 4 whose
  every axis is either 1 or the full size of (B, H, Lq, Lk); a real, required graph input
  that every binding's ``get_inputs()`` lists. "No mask" is a (1, 1, 1, 1) True tensor.
  It is not an overridable initializer: that would hide it from ``get_inputs()``, make every
  session log "Initializer mask appears in graph inputs", and let a caller feeding inputs
  positionally run unmasked without knowing.
  Deployments that never mask export a **mask-free graph** instead (``mask_input=False``,
  ``mha-verify export --no-mask-input``): inputs q, k, v only, and no mask work at run time
  (BENCHMARKS.md measures what an all-True mask costs against it).
  Additive float masks are not a graph input: 0/-inf masks convert exactly to bool
  (``mask > -inf``); finite biases have no bool form.
* ``out`` (B, Lq, D), the first output.
"""

from __future__ import annotations

import torch
from torch import nn

from mha_verify.mha import MultiHeadAttention
from mha_verify.mha.masks import MaskForm
from mha_verify.properties.targets.eager import Bound


def mask_heads(bound: Bound) -> int:
    """The head axis of the exported mask: H, or 1 for a target that takes no per-head mask.

    A target whose conventions lack the ``BHLL`` mask form (its mask is (B, Lq, Lk) or a key
    padding mask) cannot take a mask that differs across heads; its graph's mask input is
    (B|1, 1, Lq|1, Lk|1), and onnxruntime validation feeds it only masks shared by all heads.
    """
    return bound.n_head if MaskForm.BHLL in bound.conventions.mask_forms else 1


class ExportWrapper(nn.Module):
    """``forward(q, k, v, mask)`` in our convention, delegating to the bound target's adapter.

    ``mask`` is a bool keep-mask broadcasting to (B, H, Lq, Lk). For targets other than our
    reference the mask is first broadcast to the full (B, H, Lq, Lk) with an ``And``, so an
    adapter that reshapes it (torch.nn.MultiheadAttention's (B*H, Lq, Lk) layout) still sees
    the full shape when the model is fed a broadcast mask; for the reference only its Lq and
    Lk axes are broadcast (a (1|B, 1|H, Lq, Lk) mask costs little even when no mask is fed).
    """

    def __init__(self, bound: Bound) -> None:
        super().__init__()
        self.target = bound.module
        self._adapter = bound.adapter
        self.mask_heads = mask_heads(bound)
        self.expand_mask = not isinstance(bound.module, MultiHeadAttention)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.expand_mask:
            # (B|1, H|1, Lq|1, Lk|1) -> (B, H, Lq, Lk)
            full = torch.ones(q.shape[0], self.mask_heads, q.shape[1], k.shape[1], dtype=torch.bool, device=q.device)
        else:
            # (B|1, H|1, Lq|1, Lk|1) -> (B|1, H|1, Lq, Lk): onnxruntime's Attention kernel (opset 23+)
            # wants the mask's Lq and Lk axes in full, though the ONNX spec lets them broadcast
            full = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool, device=q.device)
        mask = mask & full
        return self._adapter.call(self.target, q, k, v, mask)


def example_inputs(
    d_model: int, n_head: int, *, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
    batch: int = 2, lq: int = 3, lk: int = 5,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Example inputs for an export: four *distinct* tensors with *distinct*, non-1 sizes.

    Distinct objects, because torch's dynamo exporter wires one input into another's place
    when two example inputs are the same tensor (pytorch issue 139646); distinct sizes
    B=2, Lq=3, Lk=5 (and != H, != D), because equal example sizes let the exporter merge
    dimensions, and size-1 examples are specialized to constants by torch.export.
    Returns q (B, Lq, D), k (B, Lk, D), v (B, Lk, D) and a full bool mask (B, H, Lq, Lk).
    """
    sizes = {"batch": batch, "lq": lq, "lk": lk}
    for name, size in sizes.items():
        if size < 2:
            raise ValueError(f"example {name} must be >= 2 (torch.export specializes size 1), got {name}={size}")
    if lq == lk:
        raise ValueError(f"example lq and lk must differ, got lq={lq}, lk={lk}")
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(batch, lq, d_model, generator=gen).to(dtype=dtype, device=device)
    k = torch.randn(batch, lk, d_model, generator=gen).to(dtype=dtype, device=device)
    v = torch.randn(batch, lk, d_model, generator=gen).to(dtype=dtype, device=device)
    mask = (torch.rand(batch, n_head, lq, lk, generator=gen) < 0.8).to(device)
    mask[..., 0] = True  # no fully masked rows in the example (keeps every path traced alike)
    return q, k, v, mask


class MaskFreeWrapper(nn.Module):
    """``forward(q, k, v)``: the target with no mask, for a mask-free graph."""

    def __init__(self, bound: Bound) -> None:
        super().__init__()
        self.target = bound.module
        self._adapter = bound.adapter

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self._adapter.call(self.target, q, k, v, None)


class SelfAttentionWrapper(nn.Module):
    """``forward(x, mask)`` or ``forward(x)``: a self-attention-only target exported with one input.

    x (B, L, D) is query, key and value at once (the very same tensor, so the adapter's
    self-attention call holds when traced); ``mask`` (when the target takes one) is a bool
    keep-mask broadcasting to (B, H, L, L), expanded in full as for any foreign target
    (to (B, 1, L, L) for a target whose mask has no head axis: :func:`mask_heads`).
    """

    def __init__(self, bound: Bound, with_mask: bool) -> None:
        super().__init__()
        self.target = bound.module
        self._adapter = bound.adapter
        self.mask_heads = mask_heads(bound)
        self.with_mask = with_mask

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.with_mask and mask is not None:
            # (B|1, H|1, L|1, L|1) -> (B, H, L, L), or (B, 1, L, L) without a head axis
            mask = mask & torch.ones(x.shape[0], self.mask_heads, x.shape[1], x.shape[1], dtype=torch.bool,
                                     device=x.device)
        return self._adapter.call(self.target, x, x, x, mask if self.with_mask else None)
