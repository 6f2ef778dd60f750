"""The one mask converter: our mask to the form a target takes, for eager layers and onnxruntime
sessions alike.

Ours: None, a bool keep-mask (True = may attend) or an additive float mask (0 keeps, -inf
removes, finite values bias), broadcasting to (B, H, Lq, Lk). A target's form has two parts:

* its **shape**: which of the axes (B, H, Lq, Lk) it carries at full size (the others are 1),
  and which it keeps at all (a key-padding mask (B, Lk) drops H and Lq): :func:`to_shape`;
* its **kind**: "keep" (bool True = may attend), "drop" (bool True = masked out, torch MHA),
  "additive" (float, -inf removes) or "additive_min" (float, finfo(dtype).min removes, as HF
  builds masks): :func:`to_kind`.

A mask the target's form cannot carry (one that varies along an axis the form fixes to 1, or
finite float biases for a bool-only target) raises NotApplicable: that example compares nothing.
"""

from __future__ import annotations

import torch

from mha_verify.mha.masks import additive_mask, keep_mask
from mha_verify.properties.protocol import NotApplicable

AXES = ("B", "H", "Lq", "Lk")
KINDS = ("keep", "drop", "additive", "additive_min")


def to_shape(mask: torch.Tensor, sizes: tuple[int, int, int, int], full: tuple[bool, bool, bool, bool],
             rank_axes: tuple[int, ...] = (0, 1, 2, 3), *, what: str = "the target") -> torch.Tensor:
    """``mask`` (rank <= 4) -> full size on the axes ``full`` marks, 1 on the others, keeping only
    ``rank_axes`` (indices into (B, H, Lq, Lk); the axes left out must be 1 by then).

    ``sizes`` is (B, H, Lq, Lk). NotApplicable if the mask varies along an axis set to 1.
    """
    m = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))  # (Lq, Lk) -> (1, 1, Lq, Lk)
    for i in range(4):
        if not full[i] and m.shape[i] != 1:
            first = m.narrow(i, 0, 1)
            if not bool((m == first).all()):
                raise NotApplicable(f"{what} cannot take a mask of shape {tuple(mask.shape)} that varies along its "
                                    f"{AXES[i]} axis")
            m = first
    m = m.expand(tuple(sizes[i] if full[i] else 1 for i in range(4)))
    for i in sorted(set(range(4)) - set(rank_axes), reverse=True):
        assert m.shape[i] == 1, f"axis {AXES[i]} left out of the rank but not 1"
        m = m.select(i, 0)
    return m


def to_kind(mask: torch.Tensor, kind: str, dtype: torch.dtype, *,
            takes: frozenset[str] = frozenset({"bool", "float"})) -> torch.Tensor:
    """``mask`` in ``kind`` (see the module docstring); ``takes``: the types a "keep" target accepts
    as they are (a float mask for a bool-only target becomes a keep-mask, where it has no finite
    bias on a kept key)."""
    if kind == "keep":
        if mask.dtype == torch.bool or "float" in takes:
            return mask
        keep = keep_mask(mask)
        assert keep is not None
        if bool((mask[keep] != 0).any()):
            raise NotApplicable("the target takes bool masks only: finite float biases have no bool form")
        return keep
    if kind == "drop":  # a float mask stays additive where the target takes floats (torch MHA does)
        if mask.dtype != torch.bool and "float" in takes:
            return mask
        return ~to_kind(mask, "keep", dtype, takes=frozenset({"bool"}))
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got kind={kind!r}")
    additive = additive_mask(mask, dtype)
    assert additive is not None
    if kind == "additive_min":  # a removed key is finfo.min, not -inf
        additive = additive.clamp(min=torch.finfo(dtype).min)
    return additive
