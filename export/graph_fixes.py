"""Edits applied to an exported ONNX graph so that its interface is the documented one.

See :mod:`mha_verify.export.wrapper` for the interface. Torch exports the graph with a full
(B, H, Lq, Lk) example mask whose dims are tied to those of q and k; these edits make the
mask input broadcastable:

1. **Re-source dimensions.** The dynamo exporter materializes a symbolic size from any
   input that carries it; it often reads B from ``Shape(mask)``. After the mask is allowed
   to be (1, 1, 1, 1) that would be wrong, so every ``Shape(mask)`` is replaced by the same
   sizes read from q (B, Lq) and k (Lk) and the constant H. In the traced program the mask's
   dims *are* those symbols, so the graph computes the same function.
2. **Relax the mask input** to dims ``mask_batch, mask_heads, mask_lq, mask_lk``.

The mask stays a plain, required graph input (no initializer of the same name): every
binding's ``get_inputs()`` lists it, and onnxruntime logs no "Initializer mask appears in
graph inputs" warning. A mask-free graph is a separate export (``mask_input=False``).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MASK_DIMS = ("mask_batch", "mask_heads", "mask_lq", "mask_lk")
# axis of the (B, H, Lq, Lk) mask -> (graph input, axis) carrying the same size; None = H (constant)
_SOURCES: dict[int, tuple[str, int] | None] = {0: ("q", 0), 1: None, 2: ("q", 1), 3: ("k", 1)}
# a self-attention graph's single input x (B, L, D) carries B and both lengths
SELF_SOURCES: dict[int, tuple[str, int] | None] = {0: ("x", 0), 1: None, 2: ("x", 1), 3: ("x", 1)}


def _attr(node: onnx.NodeProto, name: str, default: int | None) -> int | None:
    for a in node.attribute:
        if a.name == name:
            return int(a.i)
    return default


def resource_mask_dims(model: onnx.ModelProto, n_head: int, mask: str = "mask",
                       sources: dict[int, tuple[str, int] | None] | None = None) -> int:
    """Replace every ``Shape(mask)`` node by sizes read from q and k (step 1); returns how many.

    ``sources``: which input axis carries each mask axis (default q and k; ``SELF_SOURCES``
    for a self-attention graph with the single input x).
    """
    sources = _SOURCES if sources is None else sources
    nodes = list(model.graph.node)
    out: list[onnx.NodeProto] = []
    replaced = 0
    for node in nodes:
        if node.op_type != "Shape" or list(node.input) != [mask]:
            out.append(node)
            continue
        start = _attr(node, "start", 0) or 0
        end = _attr(node, "end", None)
        axes = range(4)[slice(start, end)]
        parts = []
        for axis in axes:
            name = f"{node.output[0]}__axis{axis}"
            src = sources[axis]
            if src is None:
                out.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(
                    np.array([n_head], dtype=np.int64), name)))
            else:
                out.append(helper.make_node("Shape", [src[0]], [name], start=src[1], end=src[1] + 1))
            parts.append(name)
        if len(parts) == 1:
            out.append(helper.make_node("Identity", parts, [node.output[0]]))
        else:
            out.append(helper.make_node("Concat", parts, [node.output[0]], axis=0))
        replaced += 1
    del model.graph.node[:]
    model.graph.node.extend(out)
    return replaced


def relax_mask_input(model: onnx.ModelProto, mask: str = "mask") -> None:
    """Make the mask input (rank 4, bool) broadcastable (step 2)."""
    inputs = {i.name: i for i in model.graph.input}
    if mask not in inputs:
        raise ValueError(f"the exported graph has no input {mask!r} (inputs: {', '.join(inputs)})")
    tensor_type = inputs[mask].type.tensor_type
    if tensor_type.elem_type != TensorProto.BOOL or len(tensor_type.shape.dim) != 4:
        raise ValueError(f"the exported mask input must be a rank-4 bool tensor, got {inputs[mask].type}")
    for dim, name in zip(tensor_type.shape.dim, MASK_DIMS, strict=True):
        dim.Clear()
        dim.dim_param = name


def refresh_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Drop intermediate shapes (they may name the old mask dims) and infer them again, strictly."""
    del model.graph.value_info[:]
    return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
