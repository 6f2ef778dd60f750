"""The projection weights of an attention ONNX model, recovered from its initializers, so that the
float64 oracle can be evaluated with the weights the graph computes with."""

from __future__ import annotations

import collections
import os
import re

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
    found: list[tuple[str | None, str | None, np.ndarray, np.ndarray | None]] = []  # (token, input role, w, b)
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
        found.append((token, by_input.get(node.input[0]), weight, bias))
    roles: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
    packed = _packed_qkv(model, consts, d)
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
