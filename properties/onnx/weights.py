"""The projection weights of an attention ONNX model, recovered from its initializers, so that the
float64 oracle can be evaluated with the weights the graph computes with."""

from __future__ import annotations

import collections
import itertools
import os
import re
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from mha_verify.properties.adapters.recognition import initializer_tokens
from mha_verify.properties.onnx.heads import ATTENTION_OPS
from mha_verify.properties.onnx.interface import Interface
from mha_verify.properties.onnx.model_file import load_model

_TOKENS = {role: "|".join(map(re.escape, names)) for role, names in initializer_tokens().items()}


def _token_role(text: str) -> str | None:
    parts = [p for p in re.split(r"[^a-z0-9_]+|(?<=[a-z0-9])_(?=(?:weight|bias)$)", text.lower()) if p]
    for role, pattern in _TOKENS.items():
        if any(re.fullmatch(pattern, p) for p in parts):
            return role
    return None


def projection_weights(path: str | os.PathLike[str], info: Interface, *,
                       max_external_bytes: int | None = None) -> dict[str, np.ndarray] | None:
    """The four projections from the graph's initializers, in nn.Linear's (out, in) layout.

    Returns {"w_q", "b_q", "w_k", "b_k", "w_v", "b_v", "w_o", "b_o"} (biases may be absent)
    or None when they cannot be told apart. Each ``MatMul``/``Gemm`` with a (D, D) initializer
    is a projection; its role comes from the names around it (``q_proj.bias``, ``/k_proj/MatMul``)
    or, failing that, from the graph input it reads (q, k, v) or from being last (the output
    projection). A bias is a (D,) initializer added to its output.
    """
    d = info.d_model
    if d is None:
        return None
    model = load_model(path, max_external_bytes=max_external_bytes)
    consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = collections.defaultdict(list)
    for node in model.graph.node:
        for name in node.input:
            consumers[name].append(node)
    by_input = {spec.name: role for role, spec in info.roles.items() if role != "mask"}
    # (token, input role, w, b, the tensor it projects)
    found: list[tuple[str | None, str | None, np.ndarray, np.ndarray | None, str]] = []
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2 or node.input[1] not in consts:
            continue
        w = consts[node.input[1]]
        if w.shape != (d, d):
            continue
        trans_b = any(a.name == "transB" and a.i for a in node.attribute)
        weight = w if (node.op_type == "Gemm" and trans_b) else w.T  # -> (out, in)
        bias = consts.get(node.input[2]) if node.op_type == "Gemm" and len(node.input) > 2 else None
        names = [node.name, node.input[1]]
        if bias is None:
            add = next((n for n in consumers[node.output[0]] if n.op_type == "Add"), None)
            if add is not None:
                other = next((i for i in add.input if i != node.output[0] and i in consts), None)
                if other is not None and consts[other].shape == (d,):
                    bias = consts[other]
                    names += [add.name, other]
        token = next((t for t in (_token_role(n) for n in names) if t is not None), None)
        found.append((token, by_input.get(node.input[0]), weight, bias, node.input[0]))
    roles: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
    grouped = _gqa_qkv(model, consts, d)
    if grouped is not None:  # GroupQueryAttention: key/value projections (Hkv * Hd, D); the output reads its heads
        qkv, heads = grouped
        out = [f for f in found if f[4] == heads]
        return _flat({**qkv, "o": (out[0][2], out[0][3])}) if len(out) == 1 else None
    packed = _packed_qkv(model, consts, d) or _split_qkv(model, consts, d)
    if packed is not None and len(found) == 1:  # onnxruntime's fused Attention, then the output projection
        return _flat({**packed, "o": (found[0][2], found[0][3])})
    if not found and _reads_inputs_directly(model, info):
        eye = np.eye(d, dtype=np.float32)
        return _flat({r: (eye, None) for r in ("q", "k", "v", "o")})
    if len(found) != 4:
        return None
    tokens = [f[0] for f in found]
    if sorted(t for t in tokens if t) == ["k", "o", "q", "v"]:
        roles = {f[0]: (f[2], f[3]) for f in found if f[0]}
    else:
        inputs = [f[1] for f in found]
        if info.self_attention or sorted(i for i in inputs[:3] if i) != ["k", "q", "v"]:
            if not info.self_attention:
                return None
            order: tuple[str, ...] = ("q", "k", "v", "o")  # graph order, as torch writes a forward's statements
        else:
            order = (*(i or "" for i in inputs[:3]), "o")
        roles = {r: (f[2], f[3]) for r, f in zip(order, found, strict=True)}
    for role, bias in (_mha_bias(model, consts, d) or {}).items():
        if roles[role][1] is None:  # onnxruntime's MultiHeadAttention adds them itself, from one (3D,) input
            roles[role] = (roles[role][0], bias)
    return _flat(roles)


def _flat(roles: dict[str, tuple[np.ndarray, np.ndarray | None]]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for r in ("q", "k", "v", "o"):
        w, b = roles[r]
        out[f"w_{r}"] = np.ascontiguousarray(w)
        if b is not None:
            out[f"b_{r}"] = b
    return out


def _packed_qkv(model: onnx.ModelProto, consts: dict[str, np.ndarray],
                d: int) -> dict[str, tuple[np.ndarray, np.ndarray | None]] | None:
    """q, k, v projections (out, in) from a ``com.microsoft.Attention`` node's packed (D, 3D) weights
    and (3D,) bias, as onnxruntime's transformer optimizer writes them; None if there is none."""
    for node in model.graph.node:
        if (node.domain, node.op_type) != ("com.microsoft", "Attention") or len(node.input) < 2:
            continue
        w = consts.get(node.input[1])
        b = consts.get(node.input[2]) if len(node.input) > 2 else None
        if w is None or w.shape != (d, 3 * d) or (b is not None and b.shape != (3 * d,)):
            return None
        return {r: (w[:, i * d:(i + 1) * d].T, None if b is None else b[i * d:(i + 1) * d])  # x @ W -> (out, in)
                for i, r in enumerate(("q", "k", "v"))}
    return None


def input_projection(model: onnx.ModelProto, name: str, consts: Mapping[str, np.ndarray]
                     ) -> tuple[str, str, np.ndarray, str | None, np.ndarray | None] | None:
    """How ``name`` is made from a tensor by a linear projection: (that tensor, the weight's name, the
    weight (in, out), the bias's name, the bias), from a MatMul by an initializer with or without an
    ``Add`` of a (out,) initializer; None otherwise."""
    producers = {out: n for n in model.graph.node for out in n.output}
    node = producers.get(name)
    bias_name: str | None = None
    if node is not None and node.op_type == "Add" and len(node.input) == 2:
        bias_name = next((i for i in node.input if i in consts), None)
        made = next((i for i in node.input if i != bias_name), "")
        node = producers.get(made) if bias_name is not None else None
    if node is None or node.op_type != "MatMul" or node.input[1] not in consts:
        return None
    w = consts[node.input[1]]
    b = consts[bias_name] if bias_name is not None else None
    if w.ndim != 2 or (b is not None and b.shape != (w.shape[1],)):
        return None
    return node.input[0], node.input[1], w, bias_name, b


def _gqa_qkv(model: onnx.ModelProto, consts: dict[str, np.ndarray], d: int
             ) -> tuple[dict[str, tuple[np.ndarray, np.ndarray | None]], str] | None:
    """q, k, v projections (out, in) of a ``com.microsoft.GroupQueryAttention`` node, packed into its
    query input ((D, D + 2 Hkv Hd), as onnxruntime-genai's builder writes them) or one per input, and
    the name of its output; None where there is no such node or they are not projections of one tensor."""
    for node in model.graph.node:
        if (node.domain, node.op_type) != ("com.microsoft", "GroupQueryAttention"):
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        heads, kv = int(attrs.get("num_heads", 0)), int(attrs.get("kv_num_heads", 0))
        if heads <= 0 or kv <= 0 or d % heads:
            return None
        widths = (d, kv * (d // heads), kv * (d // heads))
        inputs = [*node.input, "", ""][:3]
        if inputs[1] or inputs[2]:
            found = [input_projection(model, name, consts) if name else None for name in inputs]
        else:
            packed = input_projection(model, inputs[0], consts)
            if packed is None or packed[2].shape != (d, sum(widths)):
                return None
            at = np.cumsum((0, *widths))
            found = [(packed[0], packed[1], packed[2][:, a:b], None, None if packed[4] is None else packed[4][a:b])
                     for a, b in itertools.pairwise(at)]
        if any(f is None for f in found) or len({f[0] for f in found if f}) != 1:
            return None
        if any(f is None or f[2].shape != (d, w) for f, w in zip(found, widths, strict=True)):
            return None
        return {r: (f[2].T, f[4]) for r, f in zip("qkv", found, strict=True) if f is not None}, node.output[0]
    return None


def _split_qkv(model: onnx.ModelProto, consts: dict[str, np.ndarray],
               d: int) -> dict[str, tuple[np.ndarray, np.ndarray | None]] | None:
    """q, k, v projections (out, in) from one MatMul by a (D, 3D) initializer (its (3D,) bias added or
    not) split along the features into three (D,) parts, in that order: torch.onnx's form of a packed
    ``Linear(D, 3D)`` chunked into q, k, v. None if there is none."""
    readers: dict[str, list[onnx.NodeProto]] = collections.defaultdict(list)
    for node in model.graph.node:
        for name in node.input:
            readers[name].append(node)
    for node in model.graph.node:
        w = consts.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if w is None or w.shape != (d, 3 * d):
            continue
        out, b = node.output[0], None
        add = next((n for n in readers[out] if n.op_type == "Add"), None)
        if add is not None:
            b = next((consts[i] for i in add.input if i in consts and consts[i].shape == (3 * d,)), None)
            out = add.output[0] if b is not None else out
        split = next((n for n in readers[out] if n.op_type == "Split" and len(n.output) == 3), None)
        axis = next((a.i for a in split.attribute if a.name == "axis"), 0) if split is not None else None
        sizes = consts.get(split.input[1]) if split is not None and len(split.input) > 1 and split.input[1] else None
        if axis not in (-1, 2) or (sizes is not None and list(sizes) != [d, d, d]):
            return None
        return {r: (w[:, i * d:(i + 1) * d].T, None if b is None else b[i * d:(i + 1) * d])
                for i, r in enumerate(("q", "k", "v"))}
    return None


def _mha_bias(model: onnx.ModelProto, consts: dict[str, np.ndarray], d: int) -> dict[str, np.ndarray] | None:
    """The q, k, v biases a ``com.microsoft.MultiHeadAttention`` node adds from its packed (3D,) bias
    input (the optimizer moves the projections' biases there); None if there is none."""
    for node in model.graph.node:
        if (node.domain, node.op_type) != ("com.microsoft", "MultiHeadAttention") or len(node.input) < 4:
            continue
        b = consts.get(node.input[3])
        if b is None or b.shape != (3 * d,):
            return None
        return {r: b[i * d:(i + 1) * d] for i, r in enumerate(("q", "k", "v"))}
    return None


def _reads_inputs_directly(model: onnx.ModelProto, info: Interface) -> bool:
    """The graph is one attention operator on q, k, v (or x) themselves, writing the output: no
    projections, so they are the identity."""
    wanted = [info.roles[r].name for r in (("x", "x", "x") if info.self_attention else ("q", "k", "v"))]
    return any((n.domain, n.op_type) in ATTENTION_OPS and list(n.input[:3]) == wanted and info.output in n.output
               for n in model.graph.node)
