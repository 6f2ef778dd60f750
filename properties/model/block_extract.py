"""An ONNX ``Attention`` node (opset 23: what torch.onnx writes for ``scaled_dot_product_attention``)
extracted from a whole model with its projections, as an attention layer file.

torch.onnx writes each of q, k, v as MatMul -> Add (bias) -> Reshape (B, L, H, Hd) -> Transpose (a packed
projection as one MatMul -> Add -> Split into three), the node
with its boolean or additive ``attn_mask``, then Transpose -> Reshape -> MatMul -> Add (the output
projection). The cut is :class:`onnx.utils.Extractor`'s subgraph from the projections' input and the
node's mask to the output projection's result:

    x (B, L, D) float, attn_mask (the node's own mask input, its shape kept) -> out (B, L, D)

The node and every step around it are kept as the model has them. Reshapes whose sizes the exporter
took from another graph input's shape (``Shape(input_ids)``: (batch, sequence)) read them from x,
where that input's axes are named as x's are; anything else the subgraph would need from outside (a
rotary computed from ``position_ids``, a past state) is not cut yet, said by name.
"""

from __future__ import annotations

import onnx
from onnx import helper
from onnx.utils import Extractor

from mha_verify.properties.model.graph_blocks import Block
from mha_verify.properties.onnx.model_file import ModelError

#: the steps between a projection's MatMul and the node, and between the node and the output MatMul
_BETWEEN = ("Add", "Reshape", "Transpose", "Split")  # Split: one packed projection chunked into q, k, v


def extract_attention(model: onnx.ModelProto, node: onnx.NodeProto, block: Block) -> tuple[onnx.ModelProto,
                                                                                            dict[str, str]]:
    """The cut model and its metadata (mask kind); ModelError naming why ``block`` cannot be cut."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    inputs = [*node.input, *[""] * 7][:7]
    unmodelled = [f"{k} {attrs[k]}" for k, off in (("softcap", 0.0), ("qk_matmul_output_mode", 0))
                  if k in attrs and attrs[k] != off]
    unmodelled += [f"{what} {inputs[i]}" for i, what in ((4, "past_key"), (5, "past_value"), (6, "nonpad_kv_seqlen"))
                   if inputs[i]]
    if unmodelled:
        raise ModelError(f"{block.name} takes {', '.join(unmodelled)}: not cut out yet")
    producers = {out: n for n in model.graph.node for out in n.output}
    consts = {i.name: i for i in model.graph.initializer}
    sources = {_projected_from(name, producers, consts) for name in inputs[:3]}
    if len(sources) != 1 or None in sources:
        raise ModelError(f"{block.name} does not read q, k and v as projections of one tensor (MatMul by an "
                         "initializer, then Add, Split, Reshape, Transpose): not cut out yet")
    (x,) = sources
    assert x is not None
    out = _projected_output(model, node.output[0], consts)
    if out is None:
        raise ModelError(f"{block.name}'s output does not reach a projection (Transpose, Reshape, then MatMul by an "
                         "initializer)")
    mask = inputs[3]
    cut = Extractor(model).extract_model([x, *([mask] if mask else [])], [out])
    _shapes_from_x(cut, model, x, block)
    renamed = {x: "x", out: "out", **({mask: "attn_mask"} if mask else {})}
    for n in cut.graph.node:
        n.input[:] = [renamed.get(i, i) for i in n.input]
        n.output[:] = [renamed.get(o, o) for o in n.output]
    for value in (*cut.graph.input, *cut.graph.output):
        value.name = renamed.get(value.name, value.name)
    said = {"cut_from_node": block.name}
    heads = _heads_of(model, inputs[0])
    if heads is not None:  # the node's own q (B, H, L, Hd): a Reshape elsewhere in the graph may vote otherwise
        said["n_head"] = str(heads)
    if mask:
        kind = next(i.type.tensor_type.elem_type for i in cut.graph.input if i.name == "attn_mask")
        said["mask_kind"] = "keep" if kind == onnx.TensorProto.BOOL else "additive"
    return cut, said


def _heads_of(model: onnx.ModelProto, q: str) -> int | None:
    """H of the node's 4-D query input (B, H, L, Hd) where the graph's shape information gives it."""
    for value in model.graph.value_info:
        if value.name == q:
            dims = value.type.tensor_type.shape.dim
            return int(dims[1].dim_value) if len(dims) == 4 and dims[1].dim_value > 0 else None
    return None


def _projected_from(name: str, producers: dict[str, onnx.NodeProto], consts: dict[str, onnx.TensorProto],
                    ) -> str | None:
    """The tensor ``name`` is a projection of: through Transpose / Reshape / Add back to a MatMul by a
    2-D initializer; None where another step comes between."""
    node = producers.get(name)
    while node is not None and node.op_type in _BETWEEN:
        node = producers.get(node.input[0])
    if node is None or node.op_type != "MatMul" or node.input[1] not in consts or len(consts[node.input[1]].dims) != 2:
        return None
    return node.input[0]


def _projected_output(model: onnx.ModelProto, heads: str, consts: dict[str, onnx.TensorProto]) -> str | None:
    """The tensor the output projection makes of ``heads``: through Transpose / Reshape to a MatMul by a
    2-D initializer, and the Add of its bias where one follows."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    name = heads
    while len(readers.get(name, [])) == 1 and readers[name][0].op_type in ("Transpose", "Reshape"):
        name = readers[name][0].output[0]
    matmul = next((n for n in readers.get(name, []) if n.op_type == "MatMul" and n.input[0] == name
                   and n.input[1] in consts and len(consts[n.input[1]].dims) == 2), None)
    if matmul is None:
        return None
    add = next((n for n in readers.get(matmul.output[0], []) if n.op_type == "Add"
                and any(i in consts and len(consts[i].dims) == 1 for i in n.input)), None)
    return add.output[0] if add is not None else matmul.output[0]


def _shapes_from_x(cut: onnx.ModelProto, model: onnx.ModelProto, x: str, block: Block) -> None:
    """Point each ``Shape`` of another graph input at x where that input's axes are x's leading axes by
    name (token ids (batch, sequence) beside hidden states (batch, sequence, D)); ModelError naming an
    input the cut still needs."""
    dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
            for i in [*model.graph.input, *model.graph.value_info]}
    x_dims = next(([d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
                   for i in cut.graph.input if i.name == x), [])
    made = {o for n in cut.graph.node for o in n.output} | {i.name for i in cut.graph.input} | {
        i.name for i in cut.graph.initializer}
    for n in cut.graph.node:
        outside = [i for i in n.input if i and i not in made]
        if not outside:
            continue
        source = dims.get(outside[0], [])
        leading = bool(source) and len(source) <= len(x_dims) and all(
            isinstance(a, str) and a == b for a, b in zip(source, x_dims, strict=False))
        if n.op_type != "Shape" or not leading:
            raise ModelError(f"{block.name}'s projections read {', '.join(outside)} from outside them (node "
                             f"{n.name or n.op_type}): not cut out yet")
        attrs = {a.name: a.i for a in n.attribute}
        rank = len(source)
        start, end = attrs.get("start", 0), attrs.get("end", rank)
        start, end = (v + rank if v < 0 else min(v, rank) for v in (start, end))
        n.input[0] = x
        del n.attribute[:]
        n.attribute.extend([helper.make_attribute("start", start), helper.make_attribute("end", end)])
