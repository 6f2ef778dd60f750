"""Zero-config recognition by structure and parameter names, user adapters, parameter
redrawing, dropout control, and the layers written the way timm, nanoGPT and HF Llama write
theirs (each passes the gate; a one-bug twin of each fails)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mha_verify.properties.adapters.registry import find_adapter
from mha_verify.properties.engine import profiles
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.protocol import TargetError
from mha_verify.properties.targets.eager import Target, load_target
from tests.conftest import assert_verdict

ROOT = Path(__file__).resolve().parent.parent
FIX = "tests/fixtures/"
SETTINGS = profiles.PROFILES["ci"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mha_verify.cli", "--no-export", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize(("spec", "adapter", "causal", "mask", "cross"), [
    pytest.param(FIX + "nanogpt_attn.py:CausalSelfAttention", "fused_qkv", "top_left", frozenset(), False,
                 id="nanogpt"),
    pytest.param(FIX + "nanogpt_attn.py:SlowCausalSelfAttention", "fused_qkv", "top_left", frozenset(), False,
                 id="nanogpt-slow"),
    pytest.param(FIX + "timm_attn.py:Attention", "fused_qkv", False, frozenset({"bool", "float"}), False, id="timm"),
    pytest.param(FIX + "llama_attn.py:LlamaAttention", "separate_qkv", "top_left", frozenset({"bool", "float"}),
                 False, id="llama"),
    pytest.param(FIX + "odd_layers.py:KeywordMask", "separate_qkv", False, frozenset({"bool", "float"}), False,
                 id="keyword-mask"),
    pytest.param("torch.nn:MultiheadAttention", "torch_mha", False, frozenset({"bool", "float"}), True, id="torch"),
    pytest.param("mha_verify.mha:MultiHeadAttention", "w_qkvo", False, frozenset({"bool", "float"}), True,
                 id="reference"),
])
def test_recognized_by_structure_and_names(spec: str, adapter: str, causal: bool | str, mask: frozenset[str],
                                           cross: bool) -> None:
    bound = load_target(spec).build(8, 2)
    conv = bound.conventions
    assert (bound.adapter.name, conv.causal, conv.mask, conv.cross_attention) == (adapter, causal, mask, cross)
    assert conv.notes, "the report prints the conventions used"


def test_llama_style_gqa_weights_have_fewer_kv_rows() -> None:
    p = load_target(FIX + "llama_attn.py:LlamaAttention").build(16, 4).params()
    assert p.w_q.shape == (16, 16) and p.w_k.shape == (8, 16) and p.w_v.shape == (8, 16)


def test_every_parameter_is_redrawn_biases_included() -> None:
    bound = load_target("torch.nn:MultiheadAttention").build(8, 2, seed=3)
    assert bool((bound.module.in_proj_bias != 0).all()) and bool((bound.module.out_proj.bias != 0).all())
    again = load_target("torch.nn:MultiheadAttention").build(8, 2, seed=3)
    assert torch.equal(bound.module.in_proj_weight, again.module.in_proj_weight)  # from the seed


@pytest.mark.serial
@pytest.mark.deep
def test_a_bias_swap_hides_behind_zero_biases_and_is_found_once_they_are_redrawn() -> None:
    target = load_target(FIX + "odd_layers.py:BiasSwap")
    prop = all_properties()["oracle_agreement"]
    quick = profiles.PROFILES["quick"]
    hidden = Target(target.spec, target.factory, randomize=False)
    assert run_property(prop, hidden, settings=quick, seed=0).verdict == "pass"
    assert run_property(prop, target, settings=quick, seed=0).verdict == "fail"


def test_float_dropout_attribute_is_controlled() -> None:
    bound = load_target(FIX + "odd_layers.py:FloatDropout").build(8, 2)
    assert bound.conventions.dropout
    assert bound.adapter.set_dropout(bound.module, 0.0) and bound.module.dropout == 0.0


@pytest.mark.deep
@pytest.mark.parametrize(("spec", "verdict"), [
    pytest.param(FIX + "odd_layers.py:LeakyCausal", "fail", id="leaky"),
    pytest.param(FIX + "nanogpt_attn.py:CausalSelfAttention", "pass", id="nanogpt"),
    pytest.param("mha_verify.mha:MultiHeadAttention", "pass", id="reference-under-causal-mask"),
])
def test_no_future_leak(spec: str, verdict: str) -> None:
    result = run_property(all_properties()["no_future_leak"], load_target(spec), settings=profiles.PROFILES["quick"],
                          seed=0)
    assert result.verdict == verdict, result


def test_user_adapter_by_spec_verifies_an_unusual_layer() -> None:
    target = load_target(FIX + "odd_layers.py:Unusual", adapter=FIX + "user_adapter.py:UnusualAdapter")
    for name in ("oracle_agreement", "masked_kv_invariance"):
        assert run_property(all_properties()[name], target, settings=profiles.PROFILES["quick"]).verdict == "pass"


def test_user_adapter_with_an_unknown_convention_key_is_a_usage_error() -> None:
    with pytest.raises(TargetError, match="unknown convention 'polarity'"):
        load_target(FIX + "odd_layers.py:Unusual", adapter=FIX + "user_adapter.py:BadDeclaration")


def test_unknown_layer_names_the_adapters() -> None:
    with pytest.raises(ValueError, match="fused_qkv"):
        find_adapter(torch.nn.Linear(2, 2))


def test_a_file_target_imports_its_siblings() -> None:
    assert load_target(FIX + "nanogpt_attn_twin.py:CausalSelfAttention").build(8, 2).adapter.name == "fused_qkv"


LAYERS = ["nanogpt_attn.py:CausalSelfAttention", "timm_attn.py:Attention", "llama_attn.py:LlamaAttention"]
TWINS = ["nanogpt_attn_twin.py:CausalSelfAttention", "timm_attn_twin.py:Attention",
         "llama_attn_twin.py:LlamaAttention"]


@pytest.mark.serial
@pytest.mark.deep
@pytest.mark.parametrize("spec", LAYERS, ids=["nanogpt", "timm", "llama"])
def test_library_style_layer_passes_the_gate_with_no_user_file(spec: str) -> None:
    proc = _cli("--target", FIX + spec, "--max-examples", "30")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


@pytest.mark.serial
@pytest.mark.deep
@pytest.mark.parametrize("spec", TWINS, ids=["nanogpt", "timm", "llama"])
def test_one_bug_twin_fails_the_gate(spec: str) -> None:
    proc = _cli("--target", FIX + spec, "--max-examples", "30", "--only", "oracle_agreement,head_split")
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "FAIL" in proc.stdout


@pytest.mark.serial
@pytest.mark.deep
@pytest.mark.parametrize(("spec", "bug"), [*((s, False) for s in LAYERS), *((s, True) for s in TWINS)],
                         ids=[f"{n}{t}" for t in ("", "-twin") for n in ("nanogpt", "timm", "llama")])
def test_library_style_layer_across_the_export_boundary(spec: str, bug: bool, tmp_path: Path) -> None:
    """Exported (TorchScript, with one input for self-attention) and run in onnxruntime, each
    layer's graph computes what its eager module does; a twin's graph carries its bug, and the
    float64 oracle finds it there too."""
    from hypothesis import settings as Settings

    from mha_verify.export.onnx_export import export_onnx
    from mha_verify.validation import validate_model

    bound = load_target(FIX + spec).build(16, 4, seed=0)
    export_onnx(bound, tmp_path / "m.onnx", exporter="torchscript")
    fast = Settings(max_examples=30, derandomize=True, deadline=None, database=None)
    results = {r.name.rsplit("/", 1)[-1]: r for r in validate_model(
        tmp_path / "m.onnx", eager=bound, settings=fast, opt_levels=("opt-all",),
        checks=("oracle_agreement", "ort_vs_eager"))}
    assert results["ort_vs_eager"].verdict == "pass", results["ort_vs_eager"]
    assert results["oracle_agreement"].verdict == ("fail" if bug else "pass"), results["oracle_agreement"]
    if bug:
        assert "output vs float64 oracle" in (results["oracle_agreement"].reason or "")


@pytest.mark.deep
@pytest.mark.parametrize(("layer", "verdict"), [("PerHeadFused", "pass"), ("PerHeadFusedChunkedAsBlocks", "fail")])
def test_a_fused_projection_grouped_per_head_is_split_per_head(layer: str, verdict: str) -> None:
    # GPT-NeoX's query_key_value: q, k, v rows of each head in turn (zero user code)
    target = load_target("tests/fixtures/per_head_fused.py:" + layer)
    result = run_property(all_properties()["oracle_agreement"], target, settings=profiles.PROFILES["quick"], seed=0)
    assert_verdict(result, verdict, 2)


def test_a_dropout_on_the_layers_output_is_set_with_the_others() -> None:
    result = run_property(all_properties()["train_mode_agreement"], load_target(FIX + "odd_layers.py:ResidualDropout"),
                          settings=profiles.PROFILES["quick"], seed=0)
    assert result.verdict == "pass" and result.examples >= 10, result
