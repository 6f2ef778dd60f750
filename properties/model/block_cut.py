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
finding.

A ``MultiHeadAttention`` node is cut the same way with the three MatMuls that feed it. A
``GroupQueryAttention`` node (onnxruntime-genai's builder: packed q/k/v of Hkv < H key/value heads,
rotary from cos/sin caches, causal by definition, the mask as ``seqlens_k``) is cut as a prompt with
no past, its mask through its additive ``attention_bias``, and its RoPE (the eager config's, else
the one its caches hold) stated in the file (``rotary`` metadata) for the oracle. An ONNX
``Attention`` op is extracted from the graph with what surrounds it
(:mod:`~mha_verify.properties.model.block_extract`). What a node does beyond these (a past state,
soft-cap, a local window, a bias of its own) is not cut yet: :func:`cut_block` says so by name.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mha_verify.mha.rotary import Rotary
from mha_verify.properties.model.block_extract import extract_attention
from mha_verify.properties.model.eager import AttentionDims
from mha_verify.properties.model.graph_blocks import Block
from mha_verify.properties.onnx.model_file import ModelError
from mha_verify.properties.onnx.weights import input_projection


class Cut(NamedTuple):
    """A block's attention layer file, and what the cut found departing from the eager model's config
    (said beside the block's verdict)."""

    path: Path
    notes: tuple[str, ...] = ()


def cut_block(model: onnx.ModelProto, block: Block, out: Path, dims: AttentionDims | None = None) -> Cut:
    """``block`` of ``model`` written to ``out`` as an attention layer file; ModelError naming why a
    block cannot be cut. ``dims``: the eager model's config, whose RoPE a rotary block is held to
    (without it, the RoPE its caches hold)."""
    notes: tuple[str, ...] = ()
    node = next((n for n in model.graph.node if n.name == block.name), None)
    if node is not None and node.domain in ("", "ai.onnx") and node.op_type == "Attention":
        extracted, metadata = extract_attention(model, node, block)
        helper.set_model_props(extracted, metadata)
        onnx.checker.check_model(extracted)
        onnx.save(extracted, str(out))
        return Cut(out)
    consts = {i.name: i for i in model.graph.initializer}
    said = {"mask_kind": "additive_min", "fully_masked": "uniform", "cut_from_node": block.name}
    if node is not None and (node.domain, node.op_type) == ("com.microsoft", "Attention"):
        front, kept, d = _packed_front(node, consts, block)
    elif node is not None and (node.domain, node.op_type) == ("com.microsoft", "MultiHeadAttention"):
        front, kept, d = _separate_front(model, node, consts, block)
    elif node is not None and (node.domain, node.op_type) == ("com.microsoft", "GroupQueryAttention"):
        front, kept, d, rotary, notes = _grouped_front(model, node, consts, block, dims)
        said.update(fully_masked="uniform_visible", rows_unspecified="true")  # see _grouped_front
        said.update({"rotary": rotary.text()} if rotary is not None else {})
    else:
        raise ModelError(f"{block.name} ({block.op}) is not cut out yet: only com.microsoft.Attention, "
                         "MultiHeadAttention, GroupQueryAttention and ONNX Attention blocks are")
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
    helper.set_model_props(cut, said)
    onnx.checker.check_model(cut)
    onnx.save(cut, str(out))
    return Cut(out, notes)


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


def _grouped_front(model: onnx.ModelProto, node: onnx.NodeProto, consts: dict[str, onnx.TensorProto], block: Block,
                   dims: AttentionDims | None,
                   ) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], int, Rotary | None, tuple[str, ...]]:
    """``GroupQueryAttention`` as onnxruntime-genai's builder writes it: x -> its q/k/v projections
    (packed (D, D + 2 Hkv Hd) or one each, biases kept) -> the node, over a prompt of the whole length
    (no past: ``seqlens_k`` L - 1 and ``total_sequence_length`` L for every item) -> heads. The mask
    goes through the node's additive ``attention_bias``. Its rotary (``do_rotary``) is the eager
    config's RoPE (the caches kept as the node has them, so a cache that departs from it fails the
    block), else the RoPE base its cos/sin caches hold; either is stated in the file, and rows the
    registry's lengths need past the model's own are written from it.

    A row whose every key is masked is outside what the model feeds (``seqlens_k`` keeps a real token
    in each item, causality the diagonal) and onnxruntime's operator documentation gives it no value,
    so the file states such rows unspecified: finite is required, and what they give (its CPU kernel:
    zeros from L = 2, the one key's value at L = 1) is a finding of that kind, said, not failed."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    unmodelled = [f"{k} {attrs[k]}" for k, off in (("softcap", 0.0), ("local_window_size", -1), ("smooth_softmax", 0),
                                                    ("qk_output", 0)) if k in attrs and attrs[k] != off]
    inputs = [*node.input, *[""] * 12][:12]
    unmodelled += [f"{what} {inputs[i]}" for i, what in ((9, "position_ids"), (10, "attention_bias"),
                                                          (11, "head_sink")) if inputs[i]]
    if unmodelled:
        raise ModelError(f"{block.name} takes {', '.join(unmodelled)}: not cut out yet")
    arrays = _Arrays(consts)
    heads, kv = int(attrs.get("num_heads", 0)), int(attrs.get("kv_num_heads", 0))
    sources = [input_projection(model, name, arrays) if name else None for name in inputs[:3]]
    if sources[0] is None or ((inputs[1] or inputs[2]) and any(f is None for f in sources)):
        raise ModelError(f"{block.name} does not read its query, key and value from projections (MatMul by an "
                         "initializer, bias optional): not cut out yet")
    d = int(sources[0][2].shape[0])
    if heads <= 0 or kv <= 0 or d % heads or heads % kv or len({f[0] for f in sources if f is not None}) != 1:
        raise ModelError(f"{block.name} is not self-attention over one input with num_heads {heads} and "
                         f"kv_num_heads {kv} dividing it: not cut out yet")
    front: list[onnx.NodeProto] = []
    kept: list[onnx.TensorProto] = []
    fed = []
    for role, found in zip(("qkv" if not (inputs[1] or inputs[2]) else "q", "k", "v"), sources, strict=True):
        if found is None:
            fed.append("")
            continue
        _, weight, _, bias, _ = found
        front.append(helper.make_node("MatMul", ["x", weight], [f"{role}_proj"], name=f"{role}_proj/MatMul"))
        kept.append(consts[weight])
        if bias is not None:
            front.append(helper.make_node("Add", [f"{role}_proj", bias], [f"{role}_proj_b"], name=f"{role}_proj/Add"))
            kept.append(consts[bias])
        fed.append(f"{role}_proj_b" if bias is not None else f"{role}_proj")
    rotary, caches = None, ["", ""]
    notes: tuple[str, ...] = ()
    if attrs.get("do_rotary", 0):
        cos, sin = (consts.get(name) for name in inputs[7:9])
        if cos is None or sin is None:
            raise ModelError(f"{block.name} rotates by cos/sin caches that are not initializers: not cut out yet")
        rotary, tables, notes = _rope(numpy_helper.to_array(cos), numpy_helper.to_array(sin), d // heads,
                                      bool(attrs.get("rotary_interleaved", 0)), block, dims)
        kept += [numpy_helper.from_array(t, name) for t, name in zip(tables, ("cos_cache", "sin_cache"), strict=True)]
        caches = ["cos_cache", "sin_cache"]
    one, zero, axis = (numpy_helper.from_array(np.array(v, dtype=np.int64), n)
                       for v, n in ((1, "one"), (0, "zero"), ([0], "axis0")))
    kept += [one, zero, axis]
    front += [  # every item a prompt of the whole length: seqlens_k = L - 1, total_sequence_length = L
        helper.make_node("Shape", ["x"], ["x_shape"], name="lengths/Shape"),
        helper.make_node("Gather", ["x_shape", "one"], ["length"], name="lengths/Length"),
        helper.make_node("Gather", ["x_shape", "zero"], ["batch"], name="lengths/Batch"),
        helper.make_node("Sub", ["length", "one"], ["last"], name="lengths/Sub"),
        helper.make_node("Unsqueeze", ["batch", "axis0"], ["batch_1d"], name="lengths/Unsqueeze"),
        helper.make_node("Expand", ["last", "batch_1d"], ["last_each"], name="lengths/Expand"),
        helper.make_node("Cast", ["last_each"], ["seqlens_k"], name="lengths/seqlens_k", to=TensorProto.INT32),
        helper.make_node("Cast", ["length"], ["total_sequence_length"], name="lengths/total", to=TensorProto.INT32),
    ]
    attention = helper.make_node("GroupQueryAttention", [*fed, "", "", "seqlens_k", "total_sequence_length", *caches,
                                                         "", "attention_bias"],
                                 ["heads", "present_key", "present_value"], name=node.name, domain="com.microsoft")
    attention.attribute.extend(node.attribute)
    return [*front, attention], kept, d, rotary, notes


#: positions the cut's cos/sin caches cover at least: past the registry's longest rows (257)
_ROPE_ROWS = 1024


def _rope(cos: np.ndarray, sin: np.ndarray, head_dim: int, interleaved: bool, block: Block,
          dims: AttentionDims | None) -> tuple[Rotary, tuple[np.ndarray, np.ndarray], tuple[str, ...]]:
    """The RoPE a block rotates by, cos/sin caches (positions, r/2) extended to :data:`_ROPE_ROWS`
    positions from it, and a note where the caches depart from it. It is the eager config's
    (``dims.rope_base``; a scaled rope_type is ModelError), else the base read from position 1's
    second angle that every row the model has fits (else ModelError naming where it departs)."""
    if cos.ndim != 2 or cos.shape != sin.shape or cos.shape[0] < 2 or not 2 <= 2 * cos.shape[1] <= head_dim:
        raise ModelError(f"{block.name}'s cos/sin caches have shapes {list(cos.shape)} and {list(sin.shape)}, not "
                         f"(positions, r/2) with r <= head_dim {head_dim}: not cut out yet")
    if dims is not None and dims.rope_type not in ("", "default"):
        raise ModelError(f"{block.name} rotates by the eager config's {dims.rope_type!r} rotary (frequencies scaled): "
                         "only plain RoPE is cut out yet")
    half, have = cos.shape[1], cos.shape[0]
    rows = max(_ROPE_ROWS, have)
    angles = np.arctan2(sin[1].astype(np.float64), cos[1].astype(np.float64))  # position 1: the frequencies
    reverse = bool(angles[0] < 0)
    tolerance = 1e-5 * (1.0 + np.arange(have)[:, None])  # float32 angles round by ~position * eps

    def departure(base: float) -> tuple[np.ndarray, np.ndarray]:
        inv = 1.0 / base ** (np.arange(0, 2 * half, 2, dtype=np.float64) / (2 * half))
        ideal = np.arange(rows, dtype=np.float64)[:, None] * inv * (-1.0 if reverse else 1.0)  # (rows, r/2)
        departs = np.maximum(np.abs(np.cos(ideal[:have]) - cos), np.abs(np.sin(ideal[:have]) - sin))
        return ideal, departs - tolerance

    def where(over: np.ndarray) -> str:
        p, i = np.unravel_index(int(np.argmax(over)), over.shape)
        return f"position {p}, column {i} departs by {float(over[p, i] + tolerance[p, 0]):.3g}"

    notes: tuple[str, ...] = ()
    if dims is not None and dims.rope_base is not None:
        base = dims.rope_base
        ideal, over = departure(base)
        if (over > 0).any():
            notes = (f"its cos/sin caches are not the eager config's RoPE of base {base:g} ({where(over)})",)
    else:
        if half < 2 or not 0 < abs(angles[1]) < abs(angles[0]):
            raise ModelError(f"{block.name}'s cos/sin caches rotate {2 * half} columns: no RoPE base can be read")
        read = float(abs(angles[1]) ** (-half))  # angle_i = base^(-2i/r), r = 2 * half
        # the base as a config writes it (10000, 500000) where that fits the caches as well: position 1's
        # float32 cosine reads 10000.0013
        for base in (*(float(f"{read:.{digits}g}") for digits in (3, 4, 5, 6)), read):
            ideal, over = departure(base)
            if not (over > 0).any():
                break
        else:
            raise ModelError(f"{block.name}'s cos/sin caches are not one RoPE base's (base {read:.6g} read from "
                             f"position 1; {where(over)}): a scaled rotary is not cut out yet")
    try:
        rotary = Rotary(base, interleaved, 2 * half / head_dim, reverse)
    except ValueError as exc:
        raise ModelError(f"{block.name}'s cos/sin caches: {exc}") from None
    extended = [np.concatenate([own, f(ideal[have:]).astype(own.dtype)]) for own, f in ((cos, np.cos), (sin, np.sin))]
    return rotary, (extended[0], extended[1]), notes


class _Arrays(Mapping[str, np.ndarray]):
    """Initializers read as arrays when asked: a whole model's weights are not all converted."""

    def __init__(self, consts: dict[str, onnx.TensorProto]) -> None:
        self._consts = consts

    def __getitem__(self, name: str) -> np.ndarray:
        return numpy_helper.to_array(self._consts[name])

    def __contains__(self, name: object) -> bool:
        return name in self._consts

    def __iter__(self) -> Iterator[str]:
        return iter(self._consts)

    def __len__(self) -> int:
        return len(self._consts)


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
