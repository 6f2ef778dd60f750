"""The dynamo exporter (slow: ~5 s an export): our export validated over generated shapes,
and pitfalls (a) and (b) reproduced with torch directly and caught by validation."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
import torch
import torch.nn.functional as F
from hypothesis import settings
from torch import nn

from mha_verify.export.onnx_export import export_onnx
from mha_verify.export.opsets import newest_opset
from mha_verify.export.wrapper import ExportWrapper
from mha_verify.properties.onnx.checks import interface_problems
from mha_verify.properties.onnx.interface import read_interface
from mha_verify.properties.targets.eager import load_target
from mha_verify.validation import validate_model

pytestmark = pytest.mark.deep  # dynamo exports (tox -e deep)
CI = settings(max_examples=40, derandomize=True, deadline=None, database=None)
NAMES = {"input_names": ["q", "k", "v", "mask"], "output_names": ["out"]}


@pytest.mark.serial
def test_dynamo_export_at_the_newest_opset_uses_attention_and_validates(tmp_path: Path) -> None:
    bound = load_target().build(16, 4, seed=0)
    path = tmp_path / "m.onnx"
    info = export_onnx(bound, path, exporter="dynamo")
    assert info.opset == newest_opset("dynamo")
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    assert any(n.op_type == "Attention" for n in model.graph.node) == (info.opset >= 23)
    results = validate_model(path, eager=bound, settings=CI)
    assert not [str(r) for r in results if r.failed]
    assert sum(r.examples for r in results) >= 200


@pytest.mark.serial
def test_pitfall_a_same_example_tensor_for_k_and_v_is_caught(tmp_path: Path) -> None:
    bound = load_target().build(16, 4, seed=0)
    q, kv, mask = torch.randn(2, 3, 16), torch.randn(2, 5, 16), torch.ones(2, 4, 3, 5, dtype=torch.bool)
    batch, lq, lk = torch.export.Dim("batch"), torch.export.Dim("lq"), torch.export.Dim("lk")
    shapes = {"q": {0: batch, 1: lq}, "k": {0: batch, 1: lk}, "v": {0: batch, 1: lk}, "mask": {0: batch, 2: lq, 3: lk}}
    program = torch.onnx.export(ExportWrapper(bound), (q, kv, kv, mask), None, dynamo=True,
                                dynamic_shapes=shapes, **NAMES)
    assert program is not None
    path = tmp_path / "kv.onnx"
    program.save(str(path))
    problems = interface_problems(read_interface(path))
    assert problems and "'k' is not read by any node" in problems[0], problems  # keys are projected from v
    results = validate_model(path, eager=bound, settings=CI, opt_levels=("opt-all",), checks=("oracle_agreement",))
    assert results[0].failed and results[1].failed  # interface, and the numbers


class _ShapeBranch(nn.Module):
    """A layer whose code compares Lq with Lk (a 'self-attention' branch): with equal example
    sizes the exporter takes the branch and merges the two dims."""

    def __init__(self) -> None:
        super().__init__()
        self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(16, 16) for _ in range(4))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if q.shape[1] == k.shape[1]:
            k = k * 1.0
        split = [x.unflatten(-1, (4, 4)).transpose(1, 2) for x in (self.w_q(q), self.w_k(k), self.w_v(v))]
        return self.w_o(F.scaled_dot_product_attention(*split, attn_mask=mask).transpose(1, 2).flatten(-2))


@pytest.mark.serial
def test_pitfall_b_equal_example_sizes_merge_lq_and_lk_and_are_caught(tmp_path: Path) -> None:
    from mha_verify.export.onnx_export import as_bound

    module = _ShapeBranch().eval()
    q, k, v, mask = torch.randn(2, 4, 16), torch.randn(2, 4, 16), torch.randn(2, 4, 16), torch.ones(2, 4, 4, 4) > 0
    axes = {"q": {0: "batch", 1: "lq"}, "k": {0: "batch", 1: "lk"}, "v": {0: "batch", 1: "lk"},
            "mask": {0: "batch", 2: "lq", 3: "lk"}}
    program = torch.onnx.export(module, (q, k, v, mask), None, dynamo=True, dynamic_axes=axes, **NAMES)
    assert program is not None
    path = tmp_path / "merged.onnx"
    program.save(str(path))
    problems = interface_problems(read_interface(path))
    assert any("Lq and Lk are one dimension" in p for p in problems)
    results = validate_model(path, eager=as_bound(module, d_model=16, n_head=4), settings=CI, opt_levels=("opt-all",),
                             checks=("oracle_agreement",))
    assert results[0].failed and results[1].failed and results[1].counterexample is not None


@pytest.mark.serial
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_layer_with_one_mask_for_all_heads_exports_and_validates(tmp_path: Path, exporter: str) -> None:
    """Broadcasting its mask to H heads made the adapter test whether the heads agree
    (torch.equal, untraceable by dynamo) or refuse the per-head example mask (TorchScript):
    the graph's mask input keeps a head axis of 1, and validation feeds it shared masks."""
    bound = load_target("tests/fixtures/odd_layers.py:SharedHeadMask").build(16, 4, seed=0)
    path = tmp_path / "m.onnx"
    export_onnx(bound, path, exporter=exporter)
    mask = next(i for i in onnx.load(path).graph.input if i.name == "mask")
    assert [d.dim_value or d.dim_param for d in mask.type.tensor_type.shape.dim][:2] == ["mask_batch", 1]
    results = validate_model(path, eager=bound, settings=settings(CI, max_examples=10))
    assert not [str(r) for r in results if r.failed]
    assert any(r.name.endswith("/ort_vs_eager") and r.verdict == "pass" for r in results)


@pytest.mark.serial
def test_torch_mha_self_attention_exports_with_torchscript_even_under_no_grad(tmp_path: Path) -> None:
    """Traced under no_grad, torch MHA called as m(x, x, x) takes its fast path, which the
    TorchScript exporter cannot export (aten::_native_multi_head_attention); a plain
    torch.onnx.export with autograd on exports it, and so must we."""
    mha = nn.MultiheadAttention(16, 4, batch_first=True)
    mha.mha_verify_conventions = {"self_attention": True}  # type: ignore[assignment]
    with torch.no_grad():
        export_onnx(mha, tmp_path / "m.onnx", exporter="torchscript")
    assert [i.name for i in onnx.load(tmp_path / "m.onnx").graph.input] == ["x", "mask"]
