"""Each fused attention block of a whole model, cut out with its projections into an attention layer
file of its own, so that the property registry (``validate`` on an attention ONNX file) holds it to
the float64 oracle with the weights it computes with.

A ``com.microsoft.Attention`` node (onnxruntime's transformer optimizer: packed q/k/v weights
(D, 3D) and bias (3D,), ``num_heads``, ``scale``, ``mask_filter_value``, ``unidirectional`` as the
node has them) is written as:

    x (B, L, D) float32, attention_bias (B, 1, L, L) float32 (0 keeps a key, finfo(float32).min
    removes it) -> the node -> the output projection that follows it (a MatMul by a (D, D)
    initializer, with its bias from an ``Add`` or the ``SkipLayerNormalization`` it feeds) -> out

The cut keeps the node itself, attributes and all; only its mask is fed through the node's additive
``attention_bias`` input rather than the lengths the whole graph computes (which the node offsets by
``mask_filter_value``, -10000 unless set: not a removal once scores pass 1e4). So the block's
arithmetic (packed projections, heads, scale, softmax, output projection) is held to the oracle over
every mask shape the registry draws, with transformers' conventions (finfo.min removes; a fully
masked row averages every key), while what lengths do to left padding stays the whole model's
finding. Other fused ops (``MultiHeadAttention``, ``GroupQueryAttention`` with its cache, rotary
and ``seqlens_k``) are not cut yet: :func:`cut_block` says so by name.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mha_verify.properties.model.graph_blocks import Block
from mha_verify.properties.onnx.model_file import ModelError


def cut_block(model: onnx.ModelProto, block: Block, out: Path) -> Path:
    """``block`` of ``model`` written to ``out`` as an attention layer file; ModelError naming why a
    block cannot be cut."""
    node = next((n for n in model.graph.node if n.name == block.name), None)
    consts = {i.name: i for i in model.graph.initializer}
    if node is not None and (node.domain, node.op_type) == ("com.microsoft", "Attention"):
        front, kept, d = _packed_front(node, consts, block)
    elif node is not None and (node.domain, node.op_type) == ("com.microsoft", "MultiHeadAttention"):
        front, kept, d = _separate_front(model, node, consts, block)
    else:
        raise ModelError(f"{block.name} ({block.op}) is not cut out yet: only com.microsoft.Attention and "
                         "MultiHeadAttention blocks are")
    projection, o_bias = _output_projection(model, node.output[0], consts, d)
    if projection is None:
        raise ModelError(f"{block.name}'s output does not go through a (D, D) projection (MatMul by an initializer)")
    kept.append(consts[projection.input[1]])
    nodes = [*front, helper.make_node("MatMul", ["heads", projection.input[1]],
                                      ["projected" if o_bias is not None else "out"], name="out_proj/MatMul")]
    if o_bias is not None:
        kept.append(numpy_helper.from_array(o_bias, "out_proj.bias"))
        nodes.append(helper.make_node("Add", ["projected", "out_proj.bias"], ["out"], name="out_proj/Add"))
    graph = helper.make_graph(
        nodes, f"{block.name} cut from {model.graph.name or 'the model'}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "length", d]),
         helper.make_tensor_value_info("attention_bias", TensorProto.FLOAT, ["batch", 1, "length", "length"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "length", d])], initializer=kept)
    cut = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    helper.set_model_props(cut, {"mask_kind": "additive_min", "fully_masked": "uniform", "cut_from_node": block.name})
    onnx.checker.check_model(cut)
    onnx.save(cut, str(out))
    return out


def _packed_front(node: onnx.NodeProto, consts: dict[str, onnx.TensorProto], block: Block,
                  ) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], int]:
    """``Attention``: x -> the node (packed (D, 3D) weights and (3D,) bias) -> heads."""
    weight, bias = (consts.get(name) for name in [*node.input, "", ""][1:3])
    if weight is None or len(weight.dims) != 2 or weight.dims[1] != 3 * weight.dims[0]:
        raise ModelError(f"{block.name} takes its q/k/v weights from {node.input[1]}, not a (D, 3D) initializer")
    if len(node.input) > 4 and any(node.input[4:]):
        extra = ", ".join(i for i in node.input[4:] if i)
        raise ModelError(f"{block.name} takes a past state or an extra bias ({extra}): not cut out yet")
    attention = helper.make_node("Attention", ["x", weight.name, bias.name if bias is not None else "", "", "",
                                               "attention_bias"], ["heads"], name=node.name, domain="com.microsoft")
    attention.attribute.extend(node.attribute)
    return [attention], [weight, *([bias] if bias is not None else [])], int(weight.dims[0])


def _separate_front(model: onnx.ModelProto, node: onnx.NodeProto, consts: dict[str, onnx.TensorProto],
                    block: Block) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], int]:
    """``MultiHeadAttention`` fed by three MatMuls of one input by (D, D) initializers: x -> the three
    (named q_proj, k_proj, v_proj) -> the node (its packed (3D,) bias kept) -> heads."""
    producers = {out: n for n in model.graph.node for out in n.output}
    inputs = [*node.input, "", "", "", "", "", ""]
    matmuls = [producers.get(name) for name in inputs[:3]]
    if any(m is None or m.op_type != "MatMul" or m.input[1] not in consts for m in matmuls):
        raise ModelError(f"{block.name} does not read query, key and value from MatMuls by initializers (packed or "
                         "cross-attention inputs): not cut out yet")
    sources = {m.input[0] for m in matmuls}  # type: ignore[union-attr]
    weights = [consts[m.input[1]] for m in matmuls]  # type: ignore[union-attr]
    d = int(weights[0].dims[0])
    if len(sources) != 1 or any(list(w.dims) != [d, d] for w in weights):
        raise ModelError(f"{block.name} is not self-attention over one input with (D, D) projections: not cut "
                         "out yet")
    extra = ", ".join(i for i in inputs[5:8] if i)  # its key padding mask (input 4) is replaced, as a mask
    if extra:
        raise ModelError(f"{block.name} takes a past state or an attention bias ({extra}): not cut out yet")
    bias = consts.get(inputs[3]) if inputs[3] else None
    if inputs[3] and (bias is None or list(bias.dims) != [3 * d]):
        raise ModelError(f"{block.name} takes its q/k/v bias from {inputs[3]}, not a (3D,) initializer")
    front = [helper.make_node("MatMul", ["x", w.name], [f"{r}_proj"], name=f"{r}_proj/MatMul")
             for r, w in zip("qkv", weights, strict=True)]
    attention = helper.make_node("MultiHeadAttention", ["q_proj", "k_proj", "v_proj", bias.name if bias else "", "",
                                                        "attention_bias"], ["heads"], name=node.name,
                                 domain="com.microsoft")
    attention.attribute.extend(node.attribute)
    return [*front, attention], [*weights, *([bias] if bias is not None else [])], d


def _output_projection(model: onnx.ModelProto, heads: str, consts: dict[str, onnx.TensorProto], d: int
                       ) -> tuple[onnx.NodeProto | None, np.ndarray | None]:
    """The MatMul by a (D, D) initializer that reads ``heads``, and its (D,) bias as an array (an Add's
    constant, or the bias input of the SkipLayerNormalization it feeds), or None."""
    readers = [n for n in model.graph.node if heads in n.input]
    matmul = next((n for n in readers if n.op_type == "MatMul" and n.input[0] == heads and n.input[1] in consts
                   and list(consts[n.input[1]].dims) == [d, d]), None)
    if matmul is None:
        return None, None
    for reader in (n for n in model.graph.node if matmul.output[0] in n.input):
        if reader.op_type == "Add":
            other = next((i for i in reader.input if i != matmul.output[0] and i in consts), None)
            if other is not None and list(consts[other].dims) == [d]:
                return matmul, numpy_helper.to_array(consts[other])
        if reader.op_type == "SkipLayerNormalization" and len(reader.input) > 4 and reader.input[4] in consts:
            return matmul, numpy_helper.to_array(consts[reader.input[4]])
    return matmul, None
