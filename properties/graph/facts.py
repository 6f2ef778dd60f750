"""Facts about the attention a traced call computes, as queries on its dataflow.

Each fact carries its evidence: the layer's source lines of the nodes it rests on (from their stack
traces), so a report can quote the code without reading it. Two forms of attention are read:

- explicit: a softmax over scores that come from a product of two tensors (``matmul``, ``bmm``,
  ``einsum``, ``baddbmm``). Between the product and the softmax, and on the product's two operands
  back to where they are made, multiplications and divisions by numbers make the scale; views,
  transposes and casts carry it; an addition (a mask, a bias), ``masked_fill`` and ``where`` keep
  it on their score operand. Anything else there (a tensor factor, a tanh soft-cap) leaves the
  scale unread, said with the op.
- SDPA: ``scaled_dot_product_attention`` (or its CPU kernel, under make_fx), whose ``scale``
  argument, or 1/sqrt(E) by default, is the scale, and whose ``is_causal`` is read too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import fx

from mha_verify.properties.graph.trace import Trace

aten = torch.ops.aten

_SOFTMAX = {aten.softmax.int, aten._softmax.default, aten._safe_softmax.default}
_PRODUCTS = {aten.matmul.default, aten.bmm.default, aten.einsum.default, aten.baddbmm.default, aten.mm.default}
_SDPA = {aten.scaled_dot_product_attention.default, aten._scaled_dot_product_flash_attention_for_cpu.default,
         aten._scaled_dot_product_attention_math.default}
#: ops that move or cast values without changing them: the scale passes through
_CARRY = {aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.transpose.int,
          aten.permute.default, aten.contiguous.default, aten.clone.default, aten.expand.default,
          aten._to_copy.default, aten.to.dtype, aten.to.dtype_layout, aten.type_as.default, aten.unsqueeze.default,
          aten.squeeze.dim, aten.alias.default, aten.t.default, aten.detach.default}
#: ops that add to or fill the scores: the score operand (the first) carries the scale
_FILL = {aten.add.Tensor, aten.masked_fill.Scalar, aten.masked_fill.Tensor, aten.sub.Tensor}


@dataclass(frozen=True)
class Fact:
    """A value read from the graph, and the source lines it rests on (or what stopped the reading)."""

    value: object
    evidence: tuple[str, ...]


def _line(node: fx.Node) -> str:
    trace = (node.meta.get("stack_trace") or "").strip().splitlines()
    return trace[-1].strip() if trace else f"{node.target}"


def _number(arg: object) -> float | None:
    return float(arg) if isinstance(arg, (int, float)) and not isinstance(arg, bool) else None


def softmaxes(trace: Trace) -> list[fx.Node]:
    return [n for n in trace.calls() if n.target in _SOFTMAX]


def softmax_axis(node: fx.Node) -> Fact:
    """The axis a softmax normalizes over, as the call gives it (-1: the keys, in (..., Lq, Lk))."""
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    return Fact(dim, (_line(node),))


def _operand_factor(node: fx.Node, lines: list[str]) -> float:
    """The product of the numbers ``node`` was multiplied by on its way to a product's operand."""
    factor = 1.0
    while isinstance(node, fx.Node) and node.op == "call_function":
        if node.target in _CARRY:
            node = node.args[0]  # type: ignore[assignment]
            continue
        if node.target in (aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar):
            a, b = node.args[0], node.args[1]
            number = _number(b) if _number(b) is not None else _number(a)
            if number is None:
                return factor  # a tensor factor: a learned scale, a norm's gain: the operand's own
            lines.append(_line(node))
            factor = factor * number if node.target in (aten.mul.Tensor, aten.mul.Scalar) else factor / number
            node = a if _number(b) is not None else b  # type: ignore[assignment]
            continue
        break
    return factor


def score_scale(softmax: fx.Node) -> Fact:
    """The number the scores reaching ``softmax`` are multiplied by, from the product of q and k on:
    ``Fact(scale, lines)``, or ``Fact(None, (why,))`` where an op in between leaves it unread."""
    node = softmax.args[0]
    factor, lines = 1.0, [_line(softmax)]
    while isinstance(node, fx.Node) and node.op == "call_function":
        if node.target in _PRODUCTS:
            lines.append(_line(node))
            if node.target == aten.baddbmm.default:
                alpha = _number(node.kwargs.get("alpha", 1.0))
                if alpha is None:
                    return Fact(None, (f"baddbmm with a tensor alpha at `{_line(node)}`",))
                factor *= alpha
                operands = node.args[1:3]
            elif node.target == aten.einsum.default:
                operands = tuple(node.args[1])  # type: ignore[arg-type]
            else:
                operands = node.args[:2]
            for operand in operands:
                if isinstance(operand, fx.Node):
                    factor *= _operand_factor(operand, lines)
            return Fact(factor, tuple(dict.fromkeys(reversed(lines))))
        if node.target in _CARRY or node.target in _FILL:
            node = node.args[0]
        elif node.target == aten.where.self:
            node = node.args[1]
        elif node.target in (aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar):
            a, b = node.args[0], node.args[1]
            number = _number(b)
            if number is None:
                return Fact(None, (f"scores multiplied by a tensor at `{_line(node)}`",))
            lines.append(_line(node))
            factor = factor * number if node.target in (aten.mul.Tensor, aten.mul.Scalar) else factor / number
            node = a
        else:
            return Fact(None, (f"{node.target} between the product and the softmax at `{_line(node)}`",))
    return Fact(None, ("no product of two tensors before the softmax",))


def sdpa_calls(trace: Trace) -> list[fx.Node]:
    return [n for n in trace.calls() if n.target in _SDPA]


def sdpa_scale(node: fx.Node) -> Fact:
    """The scale an SDPA call applies: its ``scale`` argument, else 1/sqrt(E) of its query's width."""
    scale = _number(node.kwargs.get("scale"))
    if scale is None:
        query = node.args[0]
        value = query.meta.get("val") if isinstance(query, fx.Node) else None
        if not isinstance(value, torch.Tensor):
            return Fact(None, (f"the width of SDPA's query is not in the graph at `{_line(node)}`",))
        scale = 1 / math.sqrt(int(value.shape[-1]))
    return Fact(scale, (_line(node),))


def sdpa_causal(node: fx.Node) -> Fact:
    """Whether an SDPA call is causal by its flag (``is_causal``)."""
    flag = node.kwargs.get("is_causal", node.args[5] if len(node.args) > 5 else False)
    return Fact(bool(flag), (_line(node),))


def attention_scales(trace: Trace) -> list[Fact]:
    """The scale of every attention the call computes, explicit softmaxes first, then SDPA calls."""
    return [score_scale(n) for n in softmaxes(trace)] + [sdpa_scale(n) for n in sdpa_calls(trace)]
