"""A graph for onnxruntime's fused attention kernel: ``com.microsoft.MultiHeadAttention``.

**Not standard ONNX**: the ``com.microsoft`` domain runs in onnxruntime only. It is written
only when asked for (``mha-verify export --graph ort-contrib``), its file name carries
``.ort-contrib`` and its metadata ``graph = ort-contrib`` (with the operator named), and it
is validated like any other model.

Why it exists: onnxruntime's CPU kernel of the standard ``Attention`` operator (opset 23)
materializes the (B, H, Lq, Lk) scores and was 1.14-1.28x slower than eager PyTorch at the
benchmark sizes (BENCHMARKS.md); the contrib kernel is fused and was 0.4-0.96x of eager.

What it computes: the reference formula with the target's *parameters* (``adapter.params``),
written by hand, not traced from the target's code:

    q (B, Lq, D), k (B, Lk, D), v (B, Lk, D)
    -> MatMul by W_q^T, W_k^T, W_v^T (biases go into the kernel's ``bias`` input)
    -> MultiHeadAttention(num_heads=H), additive ``attention_bias`` (B|1, H|1, Lq, Lk) made
       from the bool keep-mask (expanded to full Lq, Lk: the kernel wants them) by one
       ``Where`` (0 kept, -1e30 removed: finite, so a fully masked row is a uniform average,
       never NaN)
    -> fully masked rows zeroed: heads (B, Lq, D) -> (B, Lq, H, Hd) times "row keeps a key"
       (B|1, Lq, H|1, 1) -> (B, Lq, D); so such a row's output is ``w_o.bias`` (our contract)
    -> MatMul by W_o^T, Add b_o -> out (B, Lq, D)

A target whose code differs from the formula (a defect, or another convention) is therefore
not reproduced by this graph; the validation's ``ort_vs_eager`` check holds the graph to the
eager module on identical inputs, so such a target fails there.
"""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from mha_verify.mha.reference import MHAParams

GRAPH_LABEL = "ort-contrib"
OPERATOR = "com.microsoft.MultiHeadAttention"
_ELEM = {torch.float32: TensorProto.FLOAT, torch.float16: TensorProto.FLOAT16}
_NP = {torch.float32: np.float32, torch.float16: np.float16}
_MASKED = -1e30  # the additive bias of a removed key; float16: its lowest finite value


def contrib_file_name(name: str) -> str:
    """``model.onnx`` -> ``model.ort-contrib.onnx`` (unchanged if already labelled)."""
    if f".{GRAPH_LABEL}." in name:
        return name
    stem, dot, ext = name.rpartition(".")
    return f"{stem}.{GRAPH_LABEL}.{ext}" if dot else f"{name}.{GRAPH_LABEL}.onnx"


def contrib_model(params: MHAParams, d_model: int, n_head: int, *, dtype: torch.dtype = torch.float32,
                  mask_input: bool = True) -> onnx.ModelProto:
    """The graph above for (d_model, n_head) with ``params`` (nn.Linear (out, in) layout), in ``dtype``.

    Inputs q, k, v and (``mask_input``) a bool keep-mask ``mask`` of rank 4 whose axes are each
    1 or (B, H, Lq, Lk); output ``out``. Missing biases are zeros.
    """
    if dtype not in _ELEM:
        raise TypeError(f"dtype must be torch.float32 or torch.float16, got dtype={dtype}")
    if d_model % n_head:
        raise ValueError(f"d_model must be divisible by n_head, got d_model={d_model}, n_head={n_head}")
    npdt = _NP[dtype]
    zeros = np.zeros(d_model)
    p = {k: (zeros if v is None else v.detach().double().cpu().numpy()) for k, v in params._asdict().items()}
    inits: list[onnx.TensorProto] = []

    def init(name: str, arr: np.ndarray, dt: type = npdt) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(np.asarray(arr).astype(dt)), name))
        return name

    nodes = [helper.make_node("MatMul", [r, init(f"w_{r}_t", p[f"w_{r}"].T)], [f"{r}_proj"]) for r in "qkv"]
    init("b_qkv", np.concatenate([p["b_q"], p["b_k"], p["b_v"]]))
    attn_inputs = ["q_proj", "k_proj", "v_proj", "b_qkv"]
    elem = _ELEM[dtype]
    inputs = [helper.make_tensor_value_info("q", elem, ["batch", "lq", d_model]),
              helper.make_tensor_value_info("k", elem, ["batch", "lk", d_model]),
              helper.make_tensor_value_info("v", elem, ["batch", "lk", d_model])]
    heads = "heads"
    if mask_input:
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.BOOL,
                                                    ["mask_batch", "mask_heads", "mask_lq", "mask_lk"]))
        masked = float(np.finfo(np.float16).min) if dtype == torch.float16 else _MASKED
        # the kernel wants the bias's Lq and Lk axes in full: (B|1, H|1, Lq|1, Lk|1) -> (B|1, H|1, Lq, Lk)
        nodes += [helper.make_node("Shape", ["q"], ["lq"], start=1, end=2),
                  helper.make_node("Shape", ["k"], ["lk"], start=1, end=2),
                  helper.make_node("Concat", [init("ones_2", np.array([1, 1]), np.int64), "lq", "lk"], ["mask_shape"],
                                   axis=0),
                  helper.make_node("Expand", ["mask", "mask_shape"], ["mask_full"])]
        bias_of = ["mask_full", init("kept", np.zeros(())), init("removed", np.array(masked))]
        nodes.append(helper.make_node("Where", bias_of, ["attention_bias"]))
        attn_inputs += ["", "attention_bias"]  # no key_padding_mask
    nodes.append(helper.make_node("MultiHeadAttention", attn_inputs, ["heads_all"], domain="com.microsoft",
                                  num_heads=n_head))
    if mask_input:
        # rows that keep a key: (B|1, H|1, Lq, Lk) -> (B|1, H|1, Lq, 1) -> (B|1, Lq, H|1, 1)
        nodes += [
            helper.make_node("Cast", ["mask_full"], ["mask_f"], to=elem),
            helper.make_node("ReduceMax", ["mask_f", init("last_axis", np.array([-1]), np.int64)], ["has_key"],
                             keepdims=1),
            helper.make_node("Transpose", ["has_key"], ["has_key_t"], perm=[0, 2, 1, 3]),
            # (B, Lq, D) -> (B, Lq, H, Hd), zero fully masked rows, -> (B, Lq, D)
            helper.make_node("Reshape", ["heads_all", init("split", np.array([0, 0, n_head, d_model // n_head]),
                                                           np.int64)], ["heads_split"]),
            helper.make_node("Mul", ["heads_split", "has_key_t"], ["heads_kept"]),
            helper.make_node("Reshape", ["heads_kept", init("merge", np.array([0, 0, d_model]), np.int64)],
                             [heads]),
        ]
    else:
        heads = "heads_all"
    nodes += [helper.make_node("MatMul", [heads, init("w_o_t", p["w_o"].T)], ["out_proj"]),
              helper.make_node("Add", ["out_proj", init("b_o", p["b_o"])], ["out"])]
    graph = helper.make_graph(nodes, "mha_ort_contrib", inputs,
                              [helper.make_tensor_value_info("out", elem, ["batch", "lq", d_model])], inits)
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, producer_name="mha-verify")
