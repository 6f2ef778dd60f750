"""One call of a module, traced to an ATen graph.

``torch.export.export(strict=False)`` first: it keeps the ops as the layer called them
(``aten.matmul``, ``aten.softmax``, ``aten.scaled_dot_product_attention`` with its keyword
arguments) and each node's stack trace. Where export refuses the call (code that depends on
values), ``make_fx`` with real tensors traces what actually ran, at a lower level (``aten.bmm``,
``aten._softmax``, the CPU kernel of SDPA).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import fx, nn


@dataclass(frozen=True)
class Trace:
    """The graph of one call, and how it was made ("export" or "make_fx")."""

    graph: fx.Graph
    how: str

    def calls(self) -> list[fx.Node]:
        return [n for n in self.graph.nodes if n.op == "call_function"]


class _Call(nn.Module):
    """``fn(*args)`` as a module, for torch.export: the layer's parameters are reached through it."""

    def __init__(self, fn: Callable[..., object], owner: nn.Module | None) -> None:
        super().__init__()
        self.fn = fn
        self.owner = owner  # registered, so that export lifts the layer's parameters and buffers

    def forward(self, *args: torch.Tensor) -> object:
        return self.fn(*args)


def trace_call(fn: Callable[..., object], args: tuple[torch.Tensor, ...], *, owner: nn.Module | None = None
               ) -> Trace:
    """The graph of ``fn(*args)``; ``owner`` is the module whose parameters ``fn`` uses. RuntimeError
    naming both tracers' errors where neither can trace the call."""
    errors = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with torch.no_grad():
                program = torch.export.export(_Call(fn, owner), args, strict=False)
            return Trace(program.graph, "export")
        except Exception as exc:
            errors.append(f"torch.export: {type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from torch.fx.experimental.proxy_tensor import make_fx

            with torch.no_grad():
                graph = make_fx(fn, tracing_mode="real")(*args).graph
            return Trace(graph, "make_fx")
        except Exception as exc:
            errors.append(f"make_fx: {type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}")
    raise RuntimeError("neither torch.export nor make_fx could trace the call: " + "; ".join(errors))
