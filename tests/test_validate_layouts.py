"""``validate`` on the models deployment scripts write: torch MHA seq-first with a key padding mask,
torch's (B*H, Lq, Lk) and bool (Lq, Lk) masks, timm's self-attention on x (B, N, C), a bare ONNX
``Attention`` operator. Each feed is held against the eager module itself (independent of the
reading under test), and what the file cannot say is a usage error naming the flag."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import onnx
import pytest
import torch
from onnx import TensorProto
from onnx import helper as oh
from torch import nn

from mha_verify.mha import MultiHeadAttention
from mha_verify.properties.engine import profiles
from mha_verify.properties.onnx.interface import read_interface
from mha_verify.properties.onnx.ort_target import OrtInstance, make_session, params_from_graph
from mha_verify.properties.onnx.probe import probe_mask
from mha_verify.properties.targets.eager import load_target
from mha_verify.validation import validate_model

D, H, B, LQ, LK = 16, 4, 2, 3, 5


class _Mha(nn.Module):
    """torch MHA as users export it: ``key_padding_mask`` or ``attn_mask``, no weights returned."""

    def __init__(self, batch_first: bool, padding: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.m = nn.MultiheadAttention(D, H, batch_first=batch_first)
        self.padding = padding

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.padding:
            return self.m(q, k, v, key_padding_mask=mask, need_weights=False)[0]
        return self.m(q, k, v, attn_mask=mask, need_weights=False)[0]


def _export(module: nn.Module, path: Path, args: tuple, names: list[str], dynamic: dict) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), args, str(path), input_names=names, output_names=["out"],  # type: ignore[attr-defined]
                          dynamo=False, dynamic_axes=dynamic, opset_version=17)
    return path


SEQ = {"query": {0: "lq", 1: "b"}, "key": {0: "lk", 1: "b"}, "value": {0: "lk", 1: "b"}, "out": {0: "lq", 1: "b"}}
BATCH = {"query": {0: "b", 1: "lq"}, "key": {0: "b", 1: "lk"}, "value": {0: "b", 1: "lk"}, "out": {0: "b", 1: "lq"}}


def _instance(path: Path, module: _Mha, **declared: str) -> OrtInstance:
    info = read_interface(path, n_head=H, declared=declared)
    params = load_target("torch.nn:MultiheadAttention").build(D, H)
    params.module.load_state_dict(module.m.state_dict())  # type: ignore[attr-defined]
    return OrtInstance(info, make_session(path), params.params())


def test_seq_first_with_a_key_padding_mask_is_fed_as_torch_reads_it(tmp_path: Path) -> None:
    module = _Mha(batch_first=False, padding=True)
    q, k = torch.randn(LQ, B, D), torch.randn(LK, B, D)
    path = _export(module, tmp_path / "sf.onnx", (q, k, k, torch.zeros(B, LK, dtype=torch.bool)),
                   ["query", "key", "value", "key_padding_mask"], {**SEQ, "key_padding_mask": {0: "b", 1: "lk"}})
    instance = _instance(path, module)
    assert instance.info.reading.layout == "seq-first" and instance.info.reading.mask_axes == ("B", "Lk")
    assert instance.info.reading.mask_kind == "drop"
    keep = torch.ones(B, 1, 1, LK, dtype=torch.bool)
    keep[0, ..., -2:] = False  # ours: True = may attend, broadcasting to (B, H, Lq, Lk)
    qb, kb = torch.randn(B, 4, D), torch.randn(B, 6, D)
    keep = torch.ones(B, 1, 1, 6, dtype=torch.bool)
    keep[0, ..., -2:] = False
    with torch.no_grad():  # torch's own module on its own layout and polarity
        expected = module(qb.transpose(0, 1), kb.transpose(0, 1), kb.transpose(0, 1), ~keep[:, 0, 0, :]).transpose(0, 1)
    torch.testing.assert_close(instance(qb, kb, kb, keep), expected, rtol=1e-5, atol=1e-5)
    found = probe_mask(instance)
    assert found is not None and found.matches == ("drop",) and not found.contradicted


def test_a_b_times_h_float_mask_is_fed_item_major(tmp_path: Path) -> None:
    module = _Mha(batch_first=True, padding=False)
    q, k = torch.randn(B, LQ, D), torch.randn(B, LK, D)
    path = _export(module, tmp_path / "bh.onnx", (q, k, k, torch.zeros(B * H, LQ, LK)),
                   ["query", "key", "value", "attn_mask"], {**BATCH, "attn_mask": {0: "4*b", 1: "lq", 2: "lk"}})
    instance = _instance(path, module)
    assert instance.info.reading.mask_axes == ("B*H", "Lq", "Lk")
    bias = torch.randn(B, H, LQ, LK)
    bias[1, 2, 0, :3] = float("-inf")
    with torch.no_grad():
        expected = module(q, k, k, bias.reshape(B * H, LQ, LK))
    torch.testing.assert_close(instance(q, k, k, bias), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.integration
def test_torch_bool_attn_mask_polarity_is_asked_of_the_model(tmp_path: Path) -> None:
    module = _Mha(batch_first=True, padding=False)
    q, k = torch.randn(B, LQ, D), torch.randn(B, LK, D)
    path = _export(module, tmp_path / "bool.onnx", (q, k, k, torch.zeros(LQ, LK, dtype=torch.bool)),
                   ["query", "key", "value", "attn_mask"], {**BATCH, "attn_mask": {0: "lq", 1: "lk"}})
    found = probe_mask(_instance(path, module))
    assert found is not None and found.read == "keep" and found.matches == ("drop",) and found.contradicted
    weights = tmp_path / "w.pt"
    torch.save(module.m.state_dict(), weights)
    cli = [sys.executable, "-m", "mha_verify.cli", "validate", str(path), "--n-head", str(H), "--target",
           "torch.nn:MultiheadAttention", "--weights", str(weights), "--profile", "quick"]
    undeclared = subprocess.run(cli, capture_output=True, text=True, timeout=300)
    assert undeclared.returncode == 2, undeclared.stderr
    assert "computes it as drop" in undeclared.stderr and "pass --mask-kind drop" in undeclared.stderr
    assert "Traceback" not in undeclared.stderr and len(undeclared.stderr.strip().splitlines()) == 1


@pytest.mark.integration
def test_an_unnamed_layout_is_a_usage_error_naming_the_flag(tmp_path: Path) -> None:
    module = _Mha(batch_first=False, padding=True)
    q, k = torch.randn(LQ, B, D), torch.randn(LK, B, D)
    path = _export(module, tmp_path / "un.onnx", (q, k, k, torch.zeros(B, LK, dtype=torch.bool)),
                   ["query", "key", "value", "key_padding_mask"],
                   {"query": [0, 1], "key": [0, 1], "value": [0, 1], "key_padding_mask": [0, 1], "out": [0, 1]})
    run = subprocess.run([sys.executable, "-m", "mha_verify.cli", "validate", str(path), "--n-head", str(H)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "pass --layout batch-first" in run.stderr, run.stderr
    assert read_interface(path, n_head=H, declared={"layout": "seq-first"}).reading.layout == "seq-first"


class _TimmAttention(nn.Module):
    """timm's self-attention on x (B, N, C), N the sequence: the reference layer on one input."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.attn = MultiHeadAttention(D, H, dropout=0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, x, x)


def test_timm_axis_names_b_n_read_as_batch_first(tmp_path: Path) -> None:
    path = _export(_TimmAttention(), tmp_path / "timm.onnx", (torch.randn(B, LQ, D),), ["x"],
                   {"x": {0: "b", 1: "n"}, "out": {0: "b", 1: "n"}})
    # the graph's own weights: agreement with the oracle holds only if x is fed as (B, L, D)
    results = validate_model(path, settings=profiles.PROFILES["quick"], opt_levels=("opt-all",),
                             checks=("oracle_agreement",), n_head=H)
    assert results[0].details["inputs"] == {"x": ["b", "n", D]}
    assert results[1].verdict == "pass" and results[1].examples > 0, results[1]


def _attention_op(path: Path, *, causal: int = 0) -> Path:
    ins = [oh.make_tensor_value_info(n, TensorProto.FLOAT, ["b", n_len, D]) for n, n_len in
           (("q", "lq"), ("k", "lk"), ("v", "lk"))]
    ins.append(oh.make_tensor_value_info("attn_mask", TensorProto.BOOL, ["b", 1, "lq", "lk"]))
    node = oh.make_node("Attention", [i.name for i in ins], ["out"], q_num_heads=H, kv_num_heads=H, is_causal=causal)
    out = oh.make_tensor_value_info("out", TensorProto.FLOAT, ["b", "lq", D])
    graph = oh.make_graph([node], "attention", ins, [out])
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 23)]), str(path))
    return path


def test_a_bare_attention_operator_is_read_from_its_attributes(tmp_path: Path) -> None:
    info = read_interface(_attention_op(tmp_path / "a.onnx"))
    assert (info.n_head, info.n_head_source) == (H, "Attention.q_num_heads")
    params = params_from_graph(info)
    assert torch.equal(params.w_q, torch.eye(D)) and params.b_q is None  # it projects nothing
    results = validate_model(info.path, settings=profiles.PROFILES["quick"], opt_levels=("opt-all",),
                             checks=("oracle_agreement",))
    assert results[1].verdict == "pass" and results[1].examples > 0, results[1]
    causal = read_interface(_attention_op(tmp_path / "c.onnx", causal=1))
    assert causal.conventions["causal"] == ("true", "the attention operator")
