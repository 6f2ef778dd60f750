"""True findings of issue 19's models, each checked against eager torch (or the operator's own
definition) before ``validate`` is asked, and each a failure ``validate`` reports for its real
reason (docs/onnx.md, "What validate reads: measured models"; docs/findings.md).

* onnxruntime's CPU ``Attention`` kernel (opset 23) refuses a (B, 1, 1, Lk) mask when Lq > 1;
* torch.onnx (TorchScript, opset 20) gives NaN on a fully padded item of torch MHA, where eager
  torch MHA gives ``out_proj.bias``;
* onnxruntime's fused ``com.microsoft.Attention`` (as its transformer optimizer writes BERT) adds
  a finite -10000 to masked scores, so a fully padded item attends to every key as if unmasked;
* onnxruntime 1.32 crashes (SIGSEGV) creating an ``ORT_ENABLE_ALL`` session on torch MHA converted
  to float16 by its own ``float16.convert_float_to_float16``; lower levels load it.
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, numpy_helper
from onnx import helper as oh
from torch import nn

from mha_verify.properties.engine import profiles
from mha_verify.properties.targets.eager import load_target
from mha_verify.validation import validate_model

D, H, B = 16, 4, 2
QUICK = profiles.PROFILES["quick"]


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.skipif(not ort.__version__.startswith("1.32."), reason=f"recorded on onnxruntime 1.32, "
                    f"this is {ort.__version__}")
def test_onnxruntime_cpu_attention_refuses_a_key_mask_for_several_queries(tmp_path: Path) -> None:
    ins = [oh.make_tensor_value_info(n, TensorProto.FLOAT, ["b", n_len, D]) for n, n_len in
           (("q", "lq"), ("k", "lk"), ("v", "lk"))]
    ins.append(oh.make_tensor_value_info("attn_mask", TensorProto.BOOL, ["b", 1, 1, "lk"]))
    node = oh.make_node("Attention", [i.name for i in ins], ["out"], q_num_heads=H, kv_num_heads=H)
    graph = oh.make_graph([node], "a", ins, [oh.make_tensor_value_info("out", TensorProto.FLOAT, ["b", "lq", D])])
    path = tmp_path / "a.onnx"
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 23)]), str(path))
    session = _session(path)
    rng = np.random.default_rng(0)

    def feed(lq: int) -> dict[str, np.ndarray]:
        return {"q": rng.standard_normal((B, lq, D), dtype=np.float32),
                "k": rng.standard_normal((B, 5, D), dtype=np.float32),
                "v": rng.standard_normal((B, 5, D), dtype=np.float32), "attn_mask": np.ones((B, 1, 1, 5), bool)}

    assert session.run(None, feed(1))[0].shape == (B, 1, D)  # one query: runs
    with pytest.raises(Exception, match=r"(?i)mask|shape|broadcast"):  # onnxruntime's own error types
        session.run(None, feed(3))  # ONNX allows the broadcast; the kernel refuses it


class _Padded(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.m = nn.MultiheadAttention(D, H, batch_first=True)
        nn.init.normal_(self.m.out_proj.bias)  # a bias to tell from zeros

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        return self.m(q, k, v, key_padding_mask=padding, need_weights=False)[0]


def test_torchscript_opset_20_gives_nan_where_eager_torch_mha_gives_the_bias(tmp_path: Path) -> None:
    module = _Padded().eval()
    q, k = torch.randn(B, 3, D), torch.randn(B, 5, D)
    padded = torch.zeros(B, 5, dtype=torch.bool)
    padded[0] = True  # item 0: every key padded
    path = tmp_path / "kpm.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        names = ["query", "key", "value", "key_padding_mask"]
        axes = {"query": {0: "b", 1: "lq"}, "key": {0: "b", 1: "lk"}, "value": {0: "b", 1: "lk"},
                "key_padding_mask": {0: "b", 1: "lk"}, "out": {0: "b", 1: "lq"}}
        torch.onnx.export(module, (q, k, k, padded), str(path), input_names=names,  # type: ignore[attr-defined]
                          output_names=["out"], dynamo=False, opset_version=20, dynamic_axes=axes)
    with torch.no_grad():
        eager = module(q, k, k, padded)
    torch.testing.assert_close(eager[0], module.m.out_proj.bias.detach().expand(3, D))  # eager: the bias
    got = _session(path).run(None, {"query": q.numpy(), "key": k.numpy(), "value": k.numpy(),
                                    "key_padding_mask": padded.numpy()})[0]
    assert np.isnan(got[0]).all() and np.isfinite(got[1]).all()  # onnxruntime: NaN on the padded item only
    eager = load_target("torch.nn:MultiheadAttention").build(D, H)
    eager.module.load_state_dict(module.m.state_dict())  # type: ignore[attr-defined]
    # seeded: the quick profile draws at random, and a fully padded item must be among its 25 examples
    results = validate_model(path, settings=QUICK, opt_levels=("opt-all",), checks=("ort_vs_eager",),
                             eager=eager, n_head=H, seed=0)
    # torch MHA declares NaN for fully masked rows (its need_weights=True path), and the model adopts the
    # eager target's declaration: the two sides of the one layer must still agree there
    assert results[1].failed, results[1]
    assert "onnxruntime gives NaN where eager gives finite values" in (results[1].reason or ""), results[1]


def test_fused_contrib_attention_lets_a_padded_item_attend_to_every_key(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    w = [rng.standard_normal(s).astype(np.float32) * 0.3 for s in ((D, 3 * D), (3 * D,), (D, D), (D,))]
    init = [numpy_helper.from_array(a, n) for a, n in zip(w, ("qkv_w", "qkv_b", "o_w", "o_b"), strict=True)]
    nodes = [oh.make_node("Attention", ["x", "qkv_w", "qkv_b", "mask_index"], ["ctx"], domain="com.microsoft",
                          num_heads=H),
             oh.make_node("MatMul", ["ctx", "o_w"], ["proj"]), oh.make_node("Add", ["proj", "o_b"], ["out"])]
    inputs = [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", D]),
              oh.make_tensor_value_info("mask_index", TensorProto.INT32, ["batch", "seq"])]
    graph = oh.make_graph(nodes, "fused", inputs,
                          [oh.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "seq", D])], init)
    path = tmp_path / "fused.onnx"
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("com.microsoft", 1)]),
              str(path))
    x = rng.standard_normal((B, 4, D)).astype(np.float32)
    session = _session(path)
    masked = session.run(None, {"x": x, "mask_index": np.array([[0] * 4, [1] * 4], np.int32)})[0]
    unmasked = session.run(None, {"x": x, "mask_index": np.ones((B, 4), np.int32)})[0]
    np.testing.assert_allclose(masked[0], unmasked[0], atol=2e-3)  # item 0, wholly padded, attends to every key (up to
    # the rounding of scores shifted by -10000 in float32)
    assert not np.allclose(masked[0], w[3], atol=1e-2)  # not the bias (our contract), not NaN
    results = validate_model(path, settings=QUICK, opt_levels=("opt-all",), checks=("fully_masked_rows",))
    assert results[1].failed and "fully masked row" in (results[1].reason or ""), results[1]


@pytest.mark.skipif(not ort.__version__.startswith("1.32."), reason=f"recorded on onnxruntime 1.32, "
                    f"this is {ort.__version__}")
def test_onnxruntime_crashes_on_an_fp16_converted_torch_mha_at_its_highest_level(tmp_path: Path) -> None:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    module = nn.MultiheadAttention(D, H, batch_first=True).eval()

    class _Masked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = module

        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return self.m(q, k, v, attn_mask=mask, need_weights=False)[0]

    q, k = torch.randn(B, 3, D), torch.randn(B, 5, D)
    path32, path16 = tmp_path / "m32.onnx", tmp_path / "m16.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_Masked(), (q, k, k, torch.zeros(3, 5)), str(path32),  # type: ignore[attr-defined]
                          input_names=["query", "key", "value", "attn_mask"], output_names=["out"], dynamo=False,
                          opset_version=17, dynamic_axes={"query": {0: "b", 1: "lq"}, "key": {0: "b", 1: "lk"},
                                                          "value": {0: "b", 1: "lk"}, "attn_mask": {0: "lq", 1: "lk"}})
    onnx.save(convert_float_to_float16(onnx.load(str(path32)), keep_io_types=False), str(path16))

    def load(level: str) -> int:  # a crash must end a child, not this test run
        code = ("import onnxruntime as ort, sys; so = ort.SessionOptions(); "
                f"so.graph_optimization_level = ort.GraphOptimizationLevel.{level}; "
                "ort.InferenceSession(sys.argv[1], so, providers=['CPUExecutionProvider'])")
        return subprocess.run([sys.executable, "-c", code, str(path16)], capture_output=True, timeout=120).returncode

    assert load("ORT_ENABLE_EXTENDED") == 0
    assert load("ORT_ENABLE_ALL") == -11  # SIGSEGV
