"""The precision a layer computes float64 inputs at, measured before a float64 check judges it.

A float64 check (``gradcheck``) rests on the layer computing in float64. Many layers do not, on
purpose: an RMSNorm that casts to float32, a softmax taken with ``dtype=torch.float32``, a rotary
applied to ``q.float()``. Their float64 output then differs from the float64 oracle by float32's
rounding (~1e-8), not float64's (~1e-15), and a float64 gradcheck fails through a choice the
library made. :func:`read_precision` tells the two apart by measuring:

* the float64 output against the float64 oracle, held by the one tolerance rule in float64 (is it
  float64 computation?) and in the lowest dtype seen (is it explained by that dtype's rounding?);
* where the low-precision steps are: every operator that, during the float64 forward, gives a
  floating tensor of a lower precision, named by the innermost module running it (forward hooks)
  and its operator (a ``TorchDispatchMode``), so the finding says "in q_norm (Qwen3RMSNorm)"
  because that is where float32 appeared, never because of the library's name.

A layer whose error is float64's, or whose error no low-precision step explains (a wrong formula
computed in float64), gets no policy: its float64 checks run as usual.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from mha_verify.mha.reference import multi_head, same_precision
from mha_verify.mha.tolerance import compare
from mha_verify.properties.protocol import Instance, Subject
from mha_verify.properties.strategies.examples import make_example
from mha_verify.properties.strategies.masks import MaskSpec
from mha_verify.properties.strategies.size_cases import Sizes

#: lower precisions, lowest last: the dtype a float64 input may be computed at
_LOWER = (torch.float32, torch.bfloat16, torch.float16)
#: operators that make no arithmetic of their own (views, copies into a dtype, metadata)
_NO_ARITHMETIC = frozenset({"view", "_unsafe_view", "reshape", "expand", "t", "transpose", "permute", "unsqueeze",
                            "squeeze", "slice", "select", "detach", "alias", "clone", "contiguous", "split",
                            "split_with_sizes", "chunk", "unbind", "cat", "stack", "lift_fresh", "empty_like",
                            "zeros_like", "ones_like", "empty", "zeros", "ones", "full", "arange", "copy_",
                            "_to_copy", "to", "as_strided", "index", "index_select", "gather", "repeat",
                            "new_empty", "new_zeros", "new_ones", "fill_", "zero_", "masked_fill", "where",
                            # random draws and factories: values made, not inputs computed on
                            "randn", "rand", "randint", "normal", "uniform", "bernoulli", "randperm", "empty_strided",
                            "scalar_tensor", "linspace"})


@dataclass(frozen=True)
class Step:
    """Where float64 inputs met a lower precision: a module (its path in the layer, "" for the
    layer's own forward, None outside every module of the layer) and the operators there."""

    where: str | None
    module_type: str
    dtype: str
    ops: tuple[str, ...]

    def describe(self) -> str:
        ops = ", ".join(self.ops[:6]) + (", ..." if len(self.ops) > 6 else "")
        if self.where is None:
            place = "outside the layer's modules (in what its model computes and passes to it, as the harness does)"
        elif self.where == "":
            place = f"in the layer's own forward ({self.module_type})"
        else:
            place = f"in {self.where} ({self.module_type})"
        return f"{place}: {ops} in {self.dtype}"


@dataclass(frozen=True)
class PrecisionReading:
    """What one float64 forward measured.

    error / allowed64: the float64 output's max error against the float64 oracle, and what the
    tolerance rule allows float64 computation; allowed_low: what it allows the lowest dtype seen
    (inf where none was seen); steps: the low-precision steps, in the order they ran.
    """

    error: float
    allowed64: float
    allowed_low: float
    steps: tuple[Step, ...]
    example: str
    #: the layer takes a step the oracle does not model (``Conventions.beyond``): its output was not
    #: held against the oracle (error and allowances NaN), and any low-precision step is its policy
    laws_only: bool = False

    @property
    def policy(self) -> bool:
        """The layer computes float64 inputs at a lower precision, and that precision explains its
        error: a float64 check's premise does not hold (a precision policy, not a defect). For a layer
        held by the laws alone no error can be measured against the oracle: a lower precision anywhere
        in its float64 forward is the policy (a float64 gradcheck would measure that rounding)."""
        if self.laws_only:
            return bool(self.steps)
        return bool(self.steps) and self.error > self.allowed64 and self.error <= self.allowed_low

    @property
    def dtype(self) -> str:
        """The lowest precision seen ("float32", ...), or "float64"."""
        seen = {s.dtype for s in self.steps}
        return next((str(d).replace("torch.", "") for d in reversed(_LOWER) if str(d).replace("torch.", "") in seen),
                    "float64")

    def finding(self) -> str:
        """The finding in words: at what precision, where, and by how much."""
        where = "; ".join(s.describe() for s in self.steps[:4]) + ("; ..." if len(self.steps) > 4 else "")
        if self.laws_only:
            return (f"float64 inputs are computed at {self.dtype} precision {where} (laws only: its output is not "
                    f"held against the oracle; {self.example})")
        return (f"float64 inputs are computed at {self.dtype} precision {where}. Its float64 output differs "
                f"from the float64 oracle by {self.error:.3g} (float64 computation allows {self.allowed64:.3g}, "
                f"{self.dtype} {self.allowed_low:.3g}; {self.example})")


class _Recorder(TorchDispatchMode):
    """Records, per operator call, the dtype of every floating output below float64."""

    def __init__(self, where: list[str | None]) -> None:
        super().__init__()
        self.where = where
        self.seen: list[tuple[str | None, str, str]] = []  # (module path, operator, dtype)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name.rstrip("_") not in _NO_ARITHMETIC:
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.dtype in _LOWER:
                    self.seen.append((self.where[-1] if self.where else None, name, str(t.dtype).replace("torch.", "")))
                    break
        return out


def _steps(seen: list[tuple[str | None, str, str]], types: dict[str, str]) -> tuple[Step, ...]:
    """Consecutive records grouped by (module, dtype), operators each listed once."""
    grouped: dict[tuple[str | None, str], list[str]] = {}
    for where, op, dtype in seen:
        ops = grouped.setdefault((where, dtype), [])
        if op not in ops:
            ops.append(op)
    return tuple(Step(where, types.get(where or "", "") if where is not None else "", dtype, tuple(ops))
                 for (where, dtype), ops in grouped.items())


def _hooks(module: nn.Module, where: list[str | None]) -> list[Any]:
    handles = []
    for path, sub in module.named_modules():
        def pre(_m: nn.Module, _a: Any, path: str = path) -> None:
            where.append(path)

        def post(_m: nn.Module, _a: Any, _o: Any) -> None:
            if where:
                where.pop()

        handles.append(sub.register_forward_pre_hook(pre))
        handles.append(sub.register_forward_hook(post))
    return handles


def measure_precision(bound: Instance, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      example: str) -> PrecisionReading:
    """Call ``bound`` (built in float64) on float64 ``q, k, v`` with no mask, recording the
    low-precision steps, and hold its output against the float64 oracle."""
    module = getattr(bound, "module", None)
    where: list[str | None] = []
    types: dict[str, str] = {}
    handles: list[Any] = []
    if isinstance(module, nn.Module):
        types = {path: type(sub).__name__ for path, sub in module.named_modules()}
        handles = _hooks(module, where)
    recorder = _Recorder(where)
    try:
        with torch.no_grad(), recorder:
            out = bound(q, k, v, None)
    finally:
        for h in handles:
            h.remove()
    conv = bound.conventions
    steps = _steps(recorder.seen, types)
    if conv.beyond:
        return PrecisionReading(math.nan, math.nan, math.nan, steps, example, laws_only=True)
    params = bound.params()
    ref, _ = multi_head(q, k, v, params, bound.n_head, None, causal=conv.causal, fully_masked=conv.fully_masked,
                        scoring=conv.scoring)

    def allowed(dtype: torch.dtype) -> tuple[float, float]:
        same, _ = same_precision(q, k, v, params, bound.n_head, None, dtype=dtype, oracle=ref, causal=conv.causal,
                                 fully_masked=conv.fully_masked, scoring=conv.scoring)
        c = compare(out, ref, same, dtype)
        return c.error, c.allowed

    error, allowed64 = allowed(torch.float64)
    low = next((d for d in reversed(_LOWER) if any(s.dtype == str(d).replace("torch.", "") for s in steps)), None)
    allowed_low = math.inf if low is None else allowed(low)[1]
    return PrecisionReading(error, allowed64, allowed_low, steps, example)


def read_precision(target: Subject, *, lengths: tuple[int, int] = (5, 7)) -> PrecisionReading:
    """The precision ``target`` computes float64 inputs at: one float64 forward at its probe sizes
    (B = 2, Lq and Lk of ``lengths``; Lk = Lq for self-attention, k = v where it takes them as one)."""
    d_model, n_head = target.probe_sizes
    bound = target.build(d_model, n_head, dtype=torch.float64)
    conv = bound.conventions
    multiple = math.lcm(conv.head_dim_multiple, conv.rotary.head_dim_multiple() if conv.rotary is not None else 1)
    if conv.sizes is None and (d_model // n_head) % multiple:  # a head width it takes, as the strategies draw
        bound = target.build(n_head * -(-(d_model // n_head) // multiple) * multiple, n_head, dtype=torch.float64)
    lq, lk = lengths if conv.cross_attention else (lengths[0], lengths[0])
    sizes = Sizes(2, lq, lk, bound.d_model, bound.n_head)
    ex = make_example(sizes, MaskSpec("none", "BHLL", "bool", 0), (1.0, 1.0), 0, dtype=torch.float64)
    k, v = (ex.q, ex.q) if not conv.cross_attention else (ex.k, ex.k if conv.kv_shared else ex.v)
    described = f"B=2 Lq={lq} Lk={lk} D={bound.d_model} H={bound.n_head}, no mask"
    return measure_precision(bound, ex.q, k, v, described)
