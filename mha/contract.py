"""Input validation for multi-head attention: the contract, checked at the boundary.

Every check raises ``ValueError`` (bad sizes or shapes) or ``TypeError`` (bad types or
dtypes) with a message that names the argument and the values involved, so that no bad
input surfaces as a raw torch ``RuntimeError`` or as a NaN.

Dimension letters used throughout the project:
    B   batch size
    Lq  query length
    Lk  key length (== Lv, the value length)
    D   model width (d_model)
    H   number of heads (n_head)
    Hd  head width, D // H
"""

from __future__ import annotations

import math

import torch


def check_sizes(d_model: object, n_head: object, dropout: object) -> None:
    """Validate the constructor arguments of a multi-head attention layer."""
    for name, value in (("d_model", d_model), ("n_head", n_head)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {name}={value!r} ({type(value).__name__})")
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {name}={value}")
    assert isinstance(d_model, int) and isinstance(n_head, int)  # narrowed above, for mypy
    if d_model % n_head != 0:
        raise ValueError(
            f"d_model must be divisible by n_head, got d_model={d_model}, n_head={n_head} "
            f"(remainder {d_model % n_head})"
        )
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)):
        raise TypeError(f"dropout must be a float, got dropout={dropout!r} ({type(dropout).__name__})")
    if not (0.0 <= float(dropout) < 1.0) or math.isnan(float(dropout)):
        raise ValueError(f"dropout must be in [0, 1), got dropout={dropout}")


def _tracing() -> bool:
    """True while torch.jit.trace or torch.export traces the module (shapes are symbolic)."""
    return bool(torch.jit.is_tracing() or torch.compiler.is_exporting())


def check_qkv(
    q: object, k: object, v: object, *, d_model: int, dtype: torch.dtype, device: torch.device
) -> tuple[int, int, int]:
    """Validate q (B, Lq, D), k (B, Lk, D), v (B, Lv, D); return (B, Lq, Lk).

    ``dtype`` and ``device`` are those of the layer's parameters: the inputs must match them.
    The common, valid case costs a few attribute reads; only a failing input takes the slow
    path that works out which rule it broke and says so.
    """
    if type(q) is torch.Tensor and type(k) is torch.Tensor and type(v) is torch.Tensor:
        qs, ks, vs = q.shape, k.shape, v.shape
        if (
            len(qs) == 3 and len(ks) == 3 and len(vs) == 3
            and qs[2] == d_model and ks[2] == d_model and vs[2] == d_model
            and qs[0] == ks[0] and ks[0] == vs[0] and ks[1] == vs[1]
            and qs[0] > 0 and qs[1] > 0 and ks[1] > 0
            and q.dtype == dtype and k.dtype == dtype and v.dtype == dtype
            and q.device == device and k.device == device and v.device == device
        ):
            return qs[0], qs[1], ks[1]
    return _check_qkv_slow(q, k, v, d_model=d_model, dtype=dtype, device=device)


def _check_qkv_slow(
    q: object, k: object, v: object, *, d_model: int, dtype: torch.dtype, device: torch.device
) -> tuple[int, int, int]:
    tensors = {"q": q, "k": k, "v": v}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    assert isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
    dtypes = {n: t.dtype for n, t in (("q", q), ("k", k), ("v", v))}
    if len(set(dtypes.values())) != 1:
        raise TypeError(f"q, k and v must share one dtype, got q={q.dtype}, k={k.dtype}, v={v.dtype}")
    if not q.dtype.is_floating_point:
        raise TypeError(f"q, k and v must be floating point, got dtype={q.dtype}")
    if q.dtype != dtype:
        raise TypeError(
            f"q, k and v must have the layer's dtype {dtype}, got dtype={q.dtype} "
            f"(convert the layer with .to({q.dtype}) or the inputs with .to({dtype}))"
        )
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on one device, got q={q.device}, k={k.device}, v={v.device}")
    if q.device != device:
        raise ValueError(f"q, k and v must be on the layer's device {device}, got device={q.device}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(f"{name} must have shape (B, L, D) with rank 3, got {name}.shape={tuple(t.shape)}")
    if _tracing():
        return q.shape[0], q.shape[1], k.shape[1]
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.shape[-1] != d_model:
            raise ValueError(
                f"{name} must have feature size d_model={d_model}, got {name}.shape={tuple(t.shape)}"
            )
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise ValueError(
            f"q, k and v must share the batch size, got q.shape={tuple(q.shape)}, "
            f"k.shape={tuple(k.shape)}, v.shape={tuple(v.shape)}"
        )
    if k.shape[1] != v.shape[1]:
        raise ValueError(
            f"k and v must have the same length (Lk == Lv), got Lk={k.shape[1]}, Lv={v.shape[1]} "
            f"(k.shape={tuple(k.shape)}, v.shape={tuple(v.shape)})"
        )
    for name, t in (("q", q), ("k", k)):
        if t.shape[0] == 0 or t.shape[1] == 0:
            raise ValueError(f"{name} must have B >= 1 and L >= 1, got {name}.shape={tuple(t.shape)}")
    return q.shape[0], q.shape[1], k.shape[1]


def check_mask(mask: object, *, target: tuple[int, int, int, int], dtype: torch.dtype, device: torch.device) -> None:
    """Validate an attention mask against ``target`` = (B, H, Lq, Lk).

    Accepted: a bool keep-mask (True = this query may attend to this key) or an additive
    float mask of the inputs' dtype (0 keeps, -inf removes), of any shape that broadcasts
    to (B, H, Lq, Lk). Integer masks are rejected: 0/1 could mean keep/drop or an additive bias.
    """
    if type(mask) is torch.Tensor and mask.dtype == torch.bool and mask.device == device:  # the common case
        shape = mask.shape
        if len(shape) <= 4 and all(size == 1 or size == want for size, want in
                                   zip(reversed(shape), reversed(target), strict=False)):
            return
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor or None, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.dtype.is_floating_point:
        raise TypeError(
            f"mask must be bool (True = may attend) or float (additive, 0 keeps, -inf removes), "
            f"got mask.dtype={mask.dtype}; integer masks are ambiguous, convert with mask.bool()"
        )
    if mask.dtype.is_floating_point and mask.dtype != dtype:
        raise TypeError(f"a float mask must have the inputs' dtype {dtype}, got mask.dtype={mask.dtype}")
    if mask.device != device:
        raise ValueError(f"mask must be on the inputs' device {device}, got mask.device={mask.device}")
    if mask.dim() > 4:
        raise ValueError(
            f"mask must broadcast to (B, H, Lq, Lk)={tuple(target)}, got mask.shape={tuple(mask.shape)} (rank > 4)"
        )
    if _tracing():
        return
    for size, want in zip(reversed(mask.shape), reversed(target), strict=False):
        if size not in (1, want):
            raise ValueError(
                f"mask must broadcast to (B, H, Lq, Lk)={tuple(target)}, got mask.shape={tuple(mask.shape)}"
            )
    # max() propagates NaN, so one reduction finds both NaN and +inf
    if mask.dtype.is_floating_point and mask.numel() and not bool(mask.max() < math.inf):
        raise ValueError("a float mask must hold finite values or -inf, got NaN or +inf in mask")
