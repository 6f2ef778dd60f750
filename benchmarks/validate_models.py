"""The models deployment pipelines write, each checked against its eager module in onnxruntime
before ``validate`` judges it: the table of docs/onnx.md, "What validate reads: measured models".

    python -m benchmarks.validate_models OUT [--profile quick] [--only NAME,...]

Builds every model into OUT (plain ``torch.onnx.export``, ``onnx.helper`` for bare operators,
onnxruntime's float16 converter and transformer optimizer), prints how far each is from its
eager module on the export's own inputs, then runs ``mha-verify validate`` once per row of
:data:`ROWS` and prints a markdown table: model, what validate read, the arguments, the exit
code and the summary line. Rows whose models need ``transformers`` are left out, with the
reason, where it is not installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn.functional as F
from onnx import TensorProto
from onnx import helper as oh
from torch import nn

D, H, B, LQ, LK = 16, 4, 2, 3, 5
SEQ = {"query": {0: "lq", 1: "b"}, "key": {0: "lk", 1: "b"}, "value": {0: "lk", 1: "b"}, "out": {0: "lq", 1: "b"}}
BATCH = {"query": {0: "b", 1: "lq"}, "key": {0: "b", 1: "lk"}, "value": {0: "b", 1: "lk"}, "out": {0: "b", 1: "lq"}}
QKV = ["query", "key", "value"]
T = "--n-head 4 --target torch.nn:MultiheadAttention --weights mha.pt"

TS_NAN = "1: ort_vs_eager only: onnxruntime NaN where eager torch MHA gives b_o (TorchScript's export)"
#: (model file, validate arguments, what is right)
ROWS: list[tuple[str, str, str]] = [
    ("mha_seqfirst.onnx", "--n-head 4", "0"),
    ("mha_seqfirst_kpm.onnx", T, TS_NAN),
    ("mha_seqfirst_kpm.onnx", "--n-head 4", "1: NaN on fully padded items against the contract"),
    ("mha_seqfirst_unnamed.onnx", "--n-head 4", "2: --layout"),
    ("mha_seqfirst_unnamed.onnx", "--n-head 4 --layout seq-first", "0"),
    ("mha_bf_float_LL.onnx", T, TS_NAN),
    ("mha_bf_float_BHLL.onnx", T, TS_NAN),
    ("mha_bf_bool_LL.onnx", T, "2: --mask-kind drop"),
    ("mha_bf_bool_LL.onnx", T + " --mask-kind drop", TS_NAN),
    ("sdpa_inverted.onnx", "--mask-kind keep", "1: interface, mask kind"),
    ("sdpa_inverted.onnx", "", "2: --mask-kind drop"),
    ("mha_bf_float_LL_fp16.onnx", T, "1: onnxruntime crashes at opt-all"),
    ("mha_bf_static_b2.onnx", T, "0, a warning for B"),
    ("attn_op.onnx", "", "0"),
    ("attn_op_causal.onnx", "", "0, causal read"),
    ("attn_op_scale1.onnx", "", "0, scale 1 read and applied"),
    ("attn_op_scale1.onnx", "--conventions scale=0.5", "1: oracle_agreement (the wrong scale declared)"),
    ("bert_eager.onnx", "", "1: fully masked rows (contract), with a hint"),
    ("bert_eager.onnx", "--mask-kind additive_min --conventions fully_masked=uniform", "0"),
    ("bert_sdpa.onnx", "--mask-kind additive_min --conventions fully_masked=uniform", "0"),
    ("bert_optimizer_attention.onnx", "", "1: padded items attend to every key"),
]


def _export(module: nn.Module, args: tuple[torch.Tensor, ...], names: list[str], axes: dict, path: Path,
            opset: int = 17) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), args, str(path), input_names=names, output_names=["out"],
                          dynamo=False, dynamic_axes=axes, opset_version=opset)


def _agreement(path: Path, module: Callable[..., torch.Tensor], args: tuple[torch.Tensor, ...]) -> float:
    """max |onnxruntime - eager| on the export's own inputs."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        want = module(*args)
    feed = {i.name: a.numpy() for i, a in zip(session.get_inputs(), args, strict=True)}
    return float(np.abs(session.run(None, feed)[0].astype(np.float64) - want.numpy()).max())


class _Mha(nn.Module):
    """torch MHA called as users export it: ``key_padding_mask`` or ``attn_mask``, no weights returned."""

    def __init__(self, base: nn.MultiheadAttention, batch_first: bool, padding: bool = False) -> None:
        super().__init__()
        self.m = nn.MultiheadAttention(D, H, batch_first=batch_first)
        self.m.load_state_dict(base.state_dict())
        self.padding = padding

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.padding:
            return self.m(q, k, v, key_padding_mask=mask, need_weights=False)[0]
        return self.m(q, k, v, attn_mask=mask, need_weights=False)[0]


class _SdpaInverted(nn.Module):
    """A user's SDPA layer documented as True = may attend, which inverts its mask (the defect)."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attn_mask: torch.Tensor) -> torch.Tensor:
        def split(t: torch.Tensor) -> torch.Tensor:  # (B, L, D) -> (B, H, L, Hd)
            return t.unflatten(-1, (H, -1)).transpose(1, 2)

        heads = F.scaled_dot_product_attention(split(self.q(query)), split(self.k(key)), split(self.v(value)),
                                               attn_mask=~attn_mask)  # (B, H, Lq, Hd)
        return self.o(heads.transpose(1, 2).flatten(-2))


def _attention_op(path: Path, *, mask: bool, causal: int = 0, scale: float | None = None) -> None:
    """A graph that is one ONNX ``Attention`` (opset 23) on q, k, v: no projections."""
    ins = [oh.make_tensor_value_info(n, TensorProto.FLOAT, ["b", length, D]) for n, length in
           (("q", "lq"), ("k", "lk"), ("v", "lk"))]
    if mask:
        ins.append(oh.make_tensor_value_info("attn_mask", TensorProto.BOOL, ["b", 1, "lq", "lk"]))
    attrs: dict[str, float | int] = dict(q_num_heads=H, kv_num_heads=H, is_causal=causal)
    if scale is not None:
        attrs["scale"] = scale
    node = oh.make_node("Attention", [i.name for i in ins], ["out"])
    node.attribute.extend(oh.make_attribute(key, value) for key, value in attrs.items())
    out = oh.make_tensor_value_info("out", TensorProto.FLOAT, ["b", "lq", D])
    graph = oh.make_graph([node], "attention", ins, [out])
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 23)]), str(path))


def build_torch(out: Path) -> dict[str, float]:
    """torch MHA in both layouts and its masks, an inverted SDPA layer, fp16, static batch, bare operators."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    torch.manual_seed(0)
    base = nn.MultiheadAttention(D, H).eval()
    torch.save(base.state_dict(), out / "mha.pt")
    far: dict[str, float] = {}
    qs, ks = torch.randn(LQ, B, D), torch.randn(LK, B, D)
    padding = torch.zeros(B, LK, dtype=torch.bool)
    padding[0, -1] = True
    qb, kb = torch.randn(B, LQ, D), torch.randn(B, LK, D)
    float_ll = torch.randn(LQ, LK)
    float_ll[0, 1] = float("-inf")
    float_bh = torch.randn(B * H, LQ, LK)
    float_bh[1, 0, 2] = float("-inf")
    bool_ll = torch.zeros(LQ, LK, dtype=torch.bool)
    bool_ll[0, 1:] = True
    keep = torch.ones(B, 1, LQ, LK, dtype=torch.bool)
    keep[..., -1] = False
    builds: list[tuple[str, nn.Module, tuple[torch.Tensor, ...], list[str], dict]] = [
        ("mha_seqfirst.onnx", _Mha(base, False), (qs, ks, ks), QKV, SEQ),
        ("mha_seqfirst_kpm.onnx", _Mha(base, False, True), (qs, ks, ks, padding), [*QKV, "key_padding_mask"],
         {**SEQ, "key_padding_mask": {0: "b", 1: "lk"}}),
        ("mha_seqfirst_unnamed.onnx", _Mha(base, False), (qs, ks, ks), QKV,
         {"query": [0, 1], "key": [0, 1], "value": [0, 1], "out": [0, 1]}),
        ("mha_bf_float_LL.onnx", _Mha(base, True), (qb, kb, kb, float_ll), [*QKV, "attn_mask"],
         {**BATCH, "attn_mask": {0: "lq", 1: "lk"}}),
        ("mha_bf_float_BHLL.onnx", _Mha(base, True), (qb, kb, kb, float_bh), [*QKV, "attn_mask"],
         {**BATCH, "attn_mask": {0: "4*b", 1: "lq", 2: "lk"}}),
        ("mha_bf_bool_LL.onnx", _Mha(base, True), (qb, kb, kb, bool_ll), [*QKV, "attn_mask"],
         {**BATCH, "attn_mask": {0: "lq", 1: "lk"}}),
        ("mha_bf_static_b2.onnx", _Mha(base, True), (qb, kb, kb), QKV,
         {"query": {1: "lq"}, "key": {1: "lk"}, "value": {1: "lk"}, "out": {1: "lq"}}),
        ("sdpa_inverted.onnx", _SdpaInverted(), (qb, kb, kb, keep), [*QKV, "attn_mask"],
         {**BATCH, "attn_mask": {0: "b", 2: "lq", 3: "lk"}}),
    ]
    for name, module, args, names, axes in builds:
        _export(module, args, names, axes, out / name)
        far[name] = _agreement(out / name, module, args)
    fp16 = convert_float_to_float16(onnx.load(str(out / "mha_bf_float_LL.onnx")), keep_io_types=False)
    onnx.save(fp16, str(out / "mha_bf_float_LL_fp16.onnx"))
    _attention_op(out / "attn_op.onnx", mask=True)
    _attention_op(out / "attn_op_causal.onnx", mask=False, causal=1)
    _attention_op(out / "attn_op_scale1.onnx", mask=False, scale=1.0)
    return far


def build_hf(out: Path) -> dict[str, float]:
    """HF BERT self-attention + its dense projection (eager, sdpa) with HF's (B, 1, 1, L) finfo.min
    mask, and the Attention node onnxruntime's optimizer fuses from a one-layer BertModel."""
    from onnxruntime.transformers.optimizer import optimize_model
    from transformers import BertConfig, BertModel  # type: ignore[import-not-found]

    def config(impl: str) -> BertConfig:
        cfg = BertConfig(hidden_size=D, num_attention_heads=H, num_hidden_layers=1, intermediate_size=32,
                         vocab_size=50, max_position_embeddings=32, attention_probs_dropout_prob=0.0,
                         hidden_dropout_prob=0.0)
        cfg._attn_implementation = impl
        return cfg

    class SelfAttention(nn.Module):
        def __init__(self, bert: BertModel) -> None:
            super().__init__()
            self.att = bert.encoder.layer[0].attention

        def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.att.output.dense(self.att.self(hidden_states, attention_mask)[0])

    torch.manual_seed(0)
    eager = BertModel(config("eager")).eval()
    far: dict[str, float] = {}
    x = torch.randn(B, LK, D)
    hf_mask = torch.zeros(B, 1, 1, LK)
    hf_mask[0, ..., -2:] = torch.finfo(torch.float32).min
    axes = {"hidden_states": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 3: "seq"},
            "out": {0: "batch", 1: "seq"}}
    for impl in ("eager", "sdpa"):
        bert = BertModel(config(impl)).eval()
        bert.load_state_dict(eager.state_dict())
        name = f"bert_{impl}.onnx"
        _export(SelfAttention(bert), (x, hf_mask), ["hidden_states", "attention_mask"], axes, out / name)
        far[name] = _agreement(out / name, SelfAttention(bert), (x, hf_mask))

    class Ids(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = eager

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    ids = torch.randint(0, 50, (B, LK))
    _export(Ids(), (ids, torch.ones(B, LK, dtype=torch.int64)), ["input_ids", "attention_mask"],
            {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}, out / "bert_model.onnx")
    optimize_model(str(out / "bert_model.onnx"), model_type="bert", num_heads=H, hidden_size=D).save_model_to_file(
        str(out / "bert_model_optimized.onnx"))
    graph = onnx.load(str(out / "bert_model_optimized.onnx")).graph
    inits = {i.name: i for i in graph.initializer}
    fused = next(n for n in graph.node if (n.domain, n.op_type) == ("com.microsoft", "Attention"))
    proj = next(n for n in graph.node if n.op_type == "MatMul" and n.input[0] == fused.output[0])
    skip = next(n for n in graph.node if n.op_type == "SkipLayerNormalization" and proj.output[0] in n.input)
    # the optimizer's Attention node and output projection cut out: the embeddings and a raw 0/1 int32
    # mask in (its mask_index form), the dense projection (bias from SkipLayerNormalization) out
    nodes = [oh.make_node("Attention", ["x", fused.input[1], fused.input[2], "mask_index"], ["ctx"],
                          domain="com.microsoft", **{a.name: oh.get_attribute_value(a) for a in fused.attribute}),
             oh.make_node("MatMul", ["ctx", proj.input[1]], ["proj"]),
             oh.make_node("Add", ["proj", skip.input[4]], ["out"])]
    inputs = [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", D]),
              oh.make_tensor_value_info("mask_index", TensorProto.INT32, ["batch", "seq"])]
    cut = oh.make_graph(nodes, "optimizer_attention", inputs,
                        [oh.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "seq", D])],
                        [inits[n] for n in (fused.input[1], fused.input[2], proj.input[1], skip.input[4])])
    path = out / "bert_optimizer_attention.onnx"
    onnx.save(oh.make_model(cut, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("com.microsoft", 1)]),
              str(path))
    raw = torch.ones(B, LK, dtype=torch.int32)
    raw[0, -2:] = 0
    with torch.no_grad():
        hidden = eager.embeddings(input_ids=ids)
        extended = (1.0 - raw[:, None, None, :].float()) * torch.finfo(torch.float32).min
        want = SelfAttention(eager)(hidden, extended).numpy()
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"x": hidden.numpy(), "mask_index": raw.numpy()})[0]
    far[path.name] = float(np.abs(got - want).max())
    return far


def _reading(text: str) -> str:
    keep = ("  layout", "  mask axes", "  fully_masked", "  causal", "  scale", "  operator")
    return "; ".join(line.strip() for line in text.splitlines() if line.startswith(keep))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--profile", default="quick", choices=("quick", "ci", "thorough"))
    parser.add_argument("--only", default="", help="comma-separated model files (default: every row)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    far = build_torch(args.out)
    hf = importlib.util.find_spec("transformers") is not None
    if hf:
        far.update(build_hf(args.out))
    for name, err in far.items():
        print(f"{name:32} max |onnxruntime - eager| {err:.2e}")
    only = {n for n in args.only.split(",") if n}
    print("\n| model | read | args | exit (summary) | expected |\n|---|---|---|---|---|")
    for model, extra, expected in ROWS:
        if only and model not in only:
            continue
        if not (args.out / model).exists():
            print(f"| {model} | not built: transformers is not installed | | | {expected} |")
            continue
        cmd = [sys.executable, "-m", "mha_verify.cli", "validate", model, *extra.split(), "--profile", args.profile]
        run = subprocess.run(cmd, cwd=args.out, capture_output=True, text=True, timeout=1800)
        lines = (run.stdout + run.stderr).strip().splitlines()
        summary = next((line for line in reversed(lines) if "passed" in line or "error" in line), "")
        print(f"| {model} | {_reading(run.stdout) or '-'} | `{extra}` | {run.returncode} ({summary}) | {expected} |")


if __name__ == "__main__":
    main()
