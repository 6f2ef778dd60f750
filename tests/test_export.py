"""ONNX export and onnxruntime validation with the TorchScript exporter (fast): interface,
metadata, a session that loads without warnings, dynamic shapes, fully masked rows, atomic
writes, validation through the property registry, bundles, isolation, and pitfall (c), a
shape frozen by tracing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from hypothesis import settings

from mha_verify.cli import main
from mha_verify.export import onnx_export
from mha_verify.export.onnx_export import ExportError, as_bound, export_onnx, session_warnings
from mha_verify.export.opsets import ATTENTION_OP_OPSET, check_opset, newest_opset, supported_opsets
from mha_verify.export_stage import export_stage
from mha_verify.mha.reference import multi_head
from mha_verify.mha.tolerance import compare
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.onnx.checks import interface_problems
from mha_verify.properties.onnx.interface import read_interface
from mha_verify.properties.onnx.ort_target import available_providers
from mha_verify.properties.targets.eager import Target, load_target
from mha_verify.validation import validate_model

FAST = settings(max_examples=30, derandomize=True, deadline=None, database=None)

# A naive layer in our calling convention whose shapes become Python ints (pitfall c).
FROZEN_SRC = '''
import torch
from torch import nn


class Frozen(nn.Module):
    def __init__(self, d_model, n_head):
        super().__init__()
        self.d_model, self.n_head = d_model, n_head
        self.w_q, self.w_k = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.w_v, self.w_o = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)

    def forward(self, q, k, v, mask=None):
        B, Lq, Lk = int(q.size(0)), int(q.size(1)), int(k.size(1))  # int(): frozen by tracing
        H, Hd = self.n_head, self.d_model // self.n_head
        qh = self.w_q(q).view(B, Lq, H, Hd).transpose(1, 2)
        kh = self.w_k(k).view(B, Lk, H, Hd).transpose(1, 2)
        vh = self.w_v(v).view(B, Lk, H, Hd).transpose(1, 2)
        heads = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)
        has_key = mask.any(dim=-1, keepdim=True) if mask is not None else None
        if has_key is not None:
            heads = torch.where(has_key, heads, torch.zeros_like(heads))
        return self.w_o(heads.transpose(1, 2).reshape(B, Lq, self.d_model))
'''


@pytest.fixture(scope="module")
def ts_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ts") / "ref.onnx"
    export_onnx(load_target().build(16, 4, seed=0), path, exporter="torchscript")
    return path


@pytest.fixture
def frozen_spec(tmp_path: Path) -> str:
    src = tmp_path / "frozen_mha.py"
    src.write_text(FROZEN_SRC)
    return f"{src}:Frozen"


def test_opset_range_spans_17_to_the_common_newest() -> None:
    assert supported_opsets("torchscript").start == 17
    assert supported_opsets("dynamo").start == 18  # torch writes 18 when asked for 17
    assert newest_opset("dynamo") >= ATTENTION_OP_OPSET  # torch 2.13, onnx 1.23, onnxruntime 1.32
    with pytest.raises(ValueError, match="opset=16 is not supported"):
        check_opset("torchscript", 16)
    with pytest.raises(ValueError, match="exporter must be one of"):
        check_opset("tracing", None)


def test_model_interface_metadata_and_checker(ts_model: Path) -> None:
    model = onnx.load(ts_model)
    onnx.checker.check_model(model, full_check=True)
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    assert [i.name for i in model.graph.input] == ["q", "k", "v", "mask"]
    assert model.graph.output[0].name == "out"
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["d_model"] == "16" and meta["n_head"] == "4"
    assert meta["exporter"] == "torchscript" and meta["opset"] == str(newest_opset("torchscript"))
    assert meta["torch_version"] == torch.__version__ and "True = may attend" in meta["mask_convention"]
    assert meta["mha_verify_version"] and meta["graph"] == "standard"
    assert "fully masked rows -> zeros" in meta["conventions"]
    assert not model.graph.initializer or "mask" not in {i.name for i in model.graph.initializer}
    info = read_interface(ts_model)
    assert info.roles["q"].dims == ("batch", "lq", 16) and info.roles["k"].dims == ("batch", "lk", 16)
    assert info.mask_forms == {"BHLL", "B1LL", "11LL", "LL", "B11L"}
    assert interface_problems(info) == []
    # a deployment-grade graph: every binding sees the mask, and a session loads it silently
    session = ort.InferenceSession(str(ts_model), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["q", "k", "v", "mask"]
    assert session_warnings(ts_model) == []


def test_mask_free_graph_has_three_inputs(tmp_path: Path) -> None:
    path = tmp_path / "free.onnx"
    export_onnx(load_target().build(16, 4, seed=0), path, exporter="torchscript", mask_input=False)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["q", "k", "v"]
    assert session_warnings(path) == []
    assert read_interface(path).mask is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["float32", "float16"])
def test_dynamic_shapes_broadcast_masks_and_fully_masked_rows_in_ort(tmp_path: Path, dtype: torch.dtype) -> None:
    bound = load_target().build(16, 4, seed=1, dtype=dtype)
    path = tmp_path / "m.onnx"
    export_onnx(bound, path, exporter="torchscript", opset=17, dtype=dtype)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    gen = torch.Generator().manual_seed(0)
    # B, Lq, Lk other than the example's (2, 3, 5), 1 included; masks broadcast along each axis
    for B, Lq, Lk, mshape in [(1, 1, 1, None), (3, 7, 2, (1, 1, 1, 2)), (4, 2, 6, (4, 1, 2, 6)),
                              (1, 5, 5, (1, 4, 5, 5)), (2, 4, 1, (1, 1, 4, 1))]:
        q, k, v = (torch.randn(B, L, 16, generator=gen).to(dtype) for L in (Lq, Lk, Lk))
        feed = {"q": q.numpy(), "k": k.numpy(), "v": v.numpy(), "mask": np.ones((1, 1, 1, 1), dtype=np.bool_)}
        mask = None
        if mshape is not None:
            mask = torch.rand(mshape, generator=gen) < 0.6
            mask[..., 0, :] = False  # query row 0 sees no key: a fully masked row
            feed["mask"] = mask.numpy()
        out = torch.from_numpy(session.run(["out"], feed)[0])
        assert out.shape == (B, Lq, 16)
        params = bound.params()
        oracle, _ = multi_head(q, k, v, params, 4, mask)
        same, _ = multi_head(q, k, v, params, 4, mask, dtype=dtype)
        result = compare(out, oracle, same, dtype)
        assert result.ok, f"B={B} Lq={Lq} Lk={Lk} mask={mshape}: {result}"
        if mask is not None:
            assert torch.isfinite(out).all()
            assert torch.equal(out[:, 0], bound.module.w_o.bias.detach().expand(B, 16)), "fully masked row != w_o.bias"


def test_atomic_write_failure_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dest = tmp_path / "m.onnx"
    dest.write_bytes(b"old")

    def broken_save(model: onnx.ModelProto, path: object) -> None:
        Path(str(path)).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(onnx_export.onnx, "save_model", broken_save)
    with pytest.raises(OSError, match="disk full"):
        export_onnx(load_target().build(16, 4), dest, exporter="torchscript")
    assert dest.read_bytes() == b"old"  # untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]  # no temp file left
    monkeypatch.undo()
    fresh = tmp_path / "new.onnx"
    monkeypatch.setattr(onnx_export, "refresh_shapes", lambda m: (_ for _ in ()).throw(ValueError("bad graph")))
    with pytest.raises(ExportError, match="bad graph"):
        export_onnx(load_target().build(16, 4), fresh, exporter="torchscript")
    assert not fresh.exists()


@pytest.mark.deep
def test_validation_runs_the_property_registry_on_each_session(ts_model: Path) -> None:
    results = validate_model(ts_model, eager=load_target().build(16, 4, seed=0), settings=FAST)
    assert results[0].name.endswith("/interface") and results[0].verdict == "pass"
    names = [r.name.rsplit("/", 1)[-1] for r in results[1:]]
    assert names == [*all_properties(), "ort_vs_eager"] * 2
    assert not [str(r) for r in results if r.failed]
    assert {r.name.split("/")[2] for r in results[1:]} == {"opt-none", "opt-all"}
    verdict = {r.name.rsplit("/", 1)[-1]: r for r in results[1:]}
    for declared_na in ("gradcheck", "masked_grad_zero", "dropout_off_in_eval"):
        assert verdict[declared_na].verdict == "n/a", verdict[declared_na]
    for ran in ("oracle_agreement", "fully_masked_rows", "masked_kv_invariance", "mask_broadcast", "ort_vs_eager"):
        assert verdict[ran].verdict == "pass" and verdict[ran].examples > 0, verdict[ran]
    assert all(r.stage == "export" for r in results)


@pytest.mark.integration
def test_wrong_weights_fail_with_a_replayable_bundle(ts_model: Path, tmp_path: Path) -> None:
    other = load_target().build(16, 4, seed=5)  # not the weights the model was exported with
    results = validate_model(ts_model, eager=other, settings=FAST, checks=("oracle_agreement", "ort_vs_eager"),
                             opt_levels=("opt-all",), bundle_dir=tmp_path / "bundles")
    failed = [r for r in results if r.failed]
    assert [r.name.rsplit("/", 1)[-1] for r in failed] == ["oracle_agreement", "ort_vs_eager"]
    assert "onnxruntime strays" in (failed[1].reason or "")
    folder = tmp_path / "bundles" / "torchscript-opset20-float32_cpu_opt-all_oracle_agreement"
    assert {p.name for p in folder.iterdir()} >= {"model.onnx", "inputs.npz", "expected.npy", "actual.npy", "replay.py"}
    assert failed[0].replay == f"python {folder / 'replay.py'}"
    proc = subprocess.run([sys.executable, str(folder / "replay.py")], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "max error" in proc.stdout


@pytest.mark.serial
@pytest.mark.deep
def test_pitfall_c_traced_ints_freeze_the_batch_and_validation_catches_it(tmp_path: Path, frozen_spec: str) -> None:
    # Reproduce with torch directly: trace a layer that turns sizes into Python ints.
    bound = load_target(frozen_spec).build(16, 4, seed=0)
    path = tmp_path / "frozen.onnx"
    q, k, v = torch.randn(2, 3, 16), torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    mask = torch.ones(2, 4, 3, 5, dtype=torch.bool)
    torch.onnx.export(bound.module, (q, k, v, mask), str(path), dynamo=False, input_names=["q", "k", "v", "mask"],
                      output_names=["out"], dynamic_axes={"q": {0: "batch", 1: "lq"}, "k": {0: "batch", 1: "lk"},
                                                          "v": {0: "batch", 1: "lk"},
                                                          "mask": {0: "batch", 2: "lq", 3: "lk"}})
    assert interface_problems(read_interface(path)) == []  # the declared interface looks dynamic...
    results = validate_model(path, eager=bound, settings=FAST, opt_levels=("opt-all",),
                             checks=("oracle_agreement", "batch_independence"))
    oracle = next(r for r in results if r.name.endswith("/oracle_agreement"))
    assert oracle.failed and "the target raised" in (oracle.reason or "")  # ...but any other size fails
    assert oracle.counterexample is not None
    # and the export stage of `mha-verify check` catches the same module
    few = settings(FAST, max_examples=5)  # every check fails here; shrinking dominates the time
    stage = export_stage(load_target(frozen_spec), settings=few, exporters=("torchscript",))
    assert stage[0].verdict == "pass" and stage[0].name.endswith("/export")
    assert any(r.failed for r in stage)


@pytest.mark.serial
@pytest.mark.deep
def test_isolated_validation_turns_a_crash_into_a_failed_result(tmp_path: Path, ts_model: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    crash = tmp_path / "crash_mha.py"
    # it aborts past 3 positions: the one call at load (length 3) passes, the checks meet the abort
    crash.write_text("import os\nfrom mha import MultiHeadAttention\n\n\nclass Crash(MultiHeadAttention):\n"
                     "    def forward(self, q, k, v, mask=None, need_weights=False):\n"
                     "        if q.shape[1] <= 3:\n            return super().forward(q, k, v, mask, need_weights)\n"
                     "        os.abort()\n")
    assert main(["validate", str(ts_model), "--target", f"{crash}:Crash", "--profile", "quick"]) == 1
    out = capsys.readouterr().out
    assert "killed by SIGABRT" in out  # the eager side of ort_vs_eager crashed the worker: that check failed
    assert "oracle_agreement" in out  # and the checks after it ran in a new worker


def test_as_bound_names_what_it_cannot_tell() -> None:
    with pytest.raises(ValueError, match="pass d_model= and n_head="):
        as_bound(torch.nn.Module())
    bound = as_bound(torch.nn.MultiheadAttention(8, 2, batch_first=True))
    assert (bound.d_model, bound.n_head) == (8, 2)


@pytest.mark.gpu
def test_cuda_provider_matches_the_oracle(ts_model: Path) -> None:
    if "cuda" not in available_providers():
        pytest.skip(f"onnxruntime has no CUDAExecutionProvider here (available: {available_providers()})")
    results = validate_model(ts_model, eager=load_target().build(16, 4, seed=0), settings=FAST, providers=("cuda",))
    assert not [str(r) for r in results if r.failed]


def test_target_objects_are_what_the_stage_takes() -> None:
    assert isinstance(load_target(), Target)


@pytest.mark.serial
@pytest.mark.deep
def test_contrib_graph_is_labelled_and_validated_like_any_other(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m.onnx"
    assert main(["export", "--d-model", "16", "--n-head", "4", "--graph", "ort-contrib", "--profile", "ci",
                 "-o", str(out)]) == 0
    written = tmp_path / "m.ort-contrib.onnx"
    assert written.is_file() and not out.exists()
    model = onnx.load(written)
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["graph"] == "ort-contrib" and meta["graph_operator"] == "com.microsoft.MultiHeadAttention"
    assert any(n.domain == "com.microsoft" for n in model.graph.node)
    assert session_warnings(written) == []
    results = validate_model(written, eager=load_target().build(16, 4, seed=0), settings=FAST, opt_levels=("opt-all",))
    assert not [str(r) for r in results if r.failed]
    # a target whose code is not the formula: the graph (built from its parameters) is held to it
    mutant = tmp_path / "scaled.py"
    mutant.write_text("from mha import MultiHeadAttention\n\n\nclass Scaled(MultiHeadAttention):\n"
                      "    def forward(self, q, k, v, mask=None, need_weights=False):\n"
                      "        return super().forward(q * 1.01, k, v, mask)\n")
    bad = validate_model(written, eager=load_target(f"{mutant}:Scaled").build(16, 4, seed=0), settings=FAST,
                         opt_levels=("opt-all",), checks=("ort_vs_eager",))
    assert bad[-1].failed and "eager off the oracle" in (bad[-1].reason or ""), bad[-1]


def test_an_ort_session_is_a_target_with_declared_conventions(ts_model: Path) -> None:
    from mha_verify.properties.onnx.ort_target import ort_targets
    from mha_verify.properties.protocol import TargetError

    targets = ort_targets(ts_model, opt_levels=("opt-none", "opt-all"))
    assert [t.spec for t in targets] == [f"{ts_model.name}[cpu,opt-none]", f"{ts_model.name}[cpu,opt-all]"]
    target = targets[1]
    assert target.probe_sizes == (16, 4)
    bound = target.build(16, 4)
    assert target.build(16, 4, seed=9) is bound  # one session, the model's own weights
    conv = bound.conventions
    assert (conv.grads, conv.dropout, conv.weights, conv.sizes, conv.dtype) == (False, False, False, (16, 4),
                                                                               torch.float32)
    assert conv.mask == {"bool"} and conv.cross_attention
    with pytest.raises(TargetError, match=r"fixed to \(d_model, n_head\)=\(16, 4\)"):
        target.build(8, 2)
    # the parameters read from the graph are the exported module's
    ref = load_target().build(16, 4, seed=0).params()
    assert all(torch.equal(a.detach(), b.detach()) for a, b in zip(bound.params(), ref, strict=True))
