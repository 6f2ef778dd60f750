"""The head count and the attributes of an attention ONNX model, read from its graph without
running it: an attention operator's attribute, else the head split of a ``Reshape`` (a constant
``[..., H, Hd]``, ``[..., H, -1]`` or ``[..., -1, Hd]`` with H * Hd = D), by majority; and the
conventions its attention operators state (:func:`op_conventions`)."""

from __future__ import annotations

import collections
import itertools

import numpy as np
import onnx
from onnx import numpy_helper


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The graph's constants held in the file itself: the shape constants of a head split are small
    and embedded; tensors stored as external data (weights) are not read here."""
    out = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer
           if i.data_location != onnx.TensorProto.EXTERNAL}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value":
                    out[node.output[0]] = numpy_helper.to_array(a.t)
                elif a.name == "value_ints":
                    out[node.output[0]] = np.array(list(a.ints), dtype=np.int64)
    return out


def _shape_pieces(name: str, producers: dict[str, onnx.NodeProto], consts: dict[str, np.ndarray]) -> list[int | None]:
    """A shape tensor as a list of known ints and unknowns (None); [] if its length is unknown."""
    if name in consts:
        return [int(x) for x in np.asarray(consts[name]).reshape(-1)]
    node = producers.get(name)
    if node is None or node.op_type != "Concat":
        return []
    pieces: list[int | None] = []
    for part in node.input:
        if part in consts:
            pieces += [int(x) for x in np.asarray(consts[part]).reshape(-1)]
        else:
            pieces.append(None)  # a dynamic size read from a shape: one entry in practice
    return pieces


def n_head_from_graph(model: onnx.ModelProto, d_model: int | None) -> tuple[int | None, str]:
    """(n_head, where it was read) or (None, "unknown")."""
    for node in model.graph.node:
        for a in node.attribute:
            if (node.op_type, a.name) in (("Attention", "q_num_heads"), ("Attention", "num_heads"),
                                          ("MultiHeadAttention", "num_heads"),
                                          ("GroupQueryAttention", "num_heads")) and a.i > 0:
                return int(a.i), f"{node.op_type}.{a.name}"
    if d_model is None:
        return None, "unknown"
    consts = _constants(model)
    producers = {o: n for n in model.graph.node for o in n.output}
    votes: collections.Counter[int] = collections.Counter()
    for node in model.graph.node:
        if node.op_type != "Reshape" or len(node.input) < 2:
            continue
        pieces = _shape_pieces(node.input[1], producers, consts)
        for a, b in itertools.pairwise(pieces):
            h = None
            if a is not None and a > 1 and (b == -1 or (b is not None and b > 0 and a * b == d_model)):
                h = a  # [..., H, Hd] or [..., H, -1]
            elif a == -1 and b is not None and 0 < b < d_model:
                h = d_model // b  # [..., -1, Hd]
            if h is not None and d_model % h:
                h = None
            if h is not None:
                votes[h] += 1
    if votes:
        return votes.most_common(1)[0][0], "head split of a Reshape"
    return None, "unknown"


#: (domain, op type) of the fused attention operators whose attributes state conventions
ATTENTION_OPS = {("", "Attention"), ("ai.onnx", "Attention"), ("com.microsoft", "Attention"),
                 ("com.microsoft", "MultiHeadAttention"), ("com.microsoft", "GroupQueryAttention")}


def op_conventions(model: onnx.ModelProto) -> tuple[dict[str, str], dict[str, float], list[str]]:
    """What the model's fused attention operators state: (conventions, numbers, notes).

    conventions: ``causal`` "true" where an operator is causal (ONNX ``is_causal``, contrib
    ``unidirectional``), "bottom_right" for ``GroupQueryAttention`` (causal by definition, its
    queries aligned to the end of past + new keys). Contrib operators add the finite ``mask_filter_value`` (default
    -10000) to masked scores, so a fully masked row attends to every key as if unmasked: no
    convention of ours, so none is stated and ``fully_masked_rows`` judges it. numbers: ``scale``
    (ONNX and contrib ``scale``, when set and not 0),
    ``kv_num_heads``, ``mask_filter_value``. Two operators that disagree: the first one's,
    and a note saying so.
    """
    conventions: dict[str, str] = {}
    numbers: dict[str, float] = {}
    notes: list[str] = []
    for node in model.graph.node:
        if (node.domain, node.op_type) not in ATTENTION_OPS:
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        found: dict[str, str] = {}
        if attrs.get("is_causal") == 1 or attrs.get("unidirectional") == 1:
            found["causal"] = "true"
        elif node.op_type == "GroupQueryAttention":  # always causal, its queries the last of the total length
            found["causal"] = "bottom_right"
        for key in ("scale", "kv_num_heads", "mask_filter_value"):
            value = attrs.get(key)
            if isinstance(value, (int, float)) and value != 0 and key not in numbers:
                numbers[key] = float(value)
        for key, value in found.items():
            if conventions.setdefault(key, value) != value:
                notes.append(f"operators disagree on {key}: {conventions[key]} and {value}")
        notes.append(f"{node.domain or 'ai.onnx'}.{node.op_type} {node.name!r}"
                     + (f" ({', '.join(f'{k}={v}' for k, v in sorted(attrs.items()) if isinstance(v, (int, float)))})"
                        if attrs else ""))
    return conventions, numbers, notes
