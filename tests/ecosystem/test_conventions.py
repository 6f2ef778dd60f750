"""transformers layers whose scores go beyond q k^T / sqrt(Hd), verified with zero user code: the
conventions are read from each layer (QK-norm, soft-cap, position bias, GPT-NeoX's per-head
fused projection) and the oracle applies
them (``mha/scoring.py``); skipped with the reason when transformers is not installed."""

from __future__ import annotations

import pytest

from mha_verify.properties.engine.profiles import PROFILES
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.targets.eager import load_target

pytestmark = pytest.mark.deep  # the ecosystem libraries (tox -e deep, tox -e ecosystem)

HF = "transformers.models.{0}.modeling_{0}:{1}"


@pytest.mark.serial
@pytest.mark.parametrize(("model", "cls", "reads"), [
    ("qwen3", "Qwen3Attention", "q RMSNorm per head, eps 1e-06"),
    ("olmo2", "Olmo2Attention", "q RMSNorm over all heads"),
    ("gemma3", "Gemma3Attention", "q RMSNorm per head, x (1 + w)"),
    ("chameleon", "ChameleonAttention", "q LayerNorm per head"),
    ("gemma2", "Gemma2Attention", "logits soft-capped at 50 (its attn_logit_softcapping)"),
    ("t5", "T5Attention", "position bias from T5Attention.compute_bias"),
    ("gpt_neox", "GPTNeoXAttention", "rotary base 10000, halves, 0.25 of each head; adapter fused_qkv"),
    ("diffusion_gemma", "DiffusionGemmaEncoderTextAttention", "v RMSNorm per head"),
    ("nanochat", "NanoChatAttention", "rotary base 10000, halves, turning the other way"),
    ("pe_audio", "PeAudioEncoderAttention", "rotary base 20000, interleaved pairs"),
    ("cohere", "CohereAttention", "rotary base 500000, interleaved pairs"),
    ("dinov3_vit", "DINOv3ViTAttention", "rotary base 100, halves"),  # cos and sin (L, r), no batch axis
])
def test_a_layers_own_scoring_is_read_and_verified(model: str, cls: str, reads: str) -> None:
    pytest.importorskip("transformers")
    target = load_target(HF.format(model, cls))
    assert reads in target.build(32, 4).conventions.describe()
    result = run_property(all_properties()["oracle_agreement"], target, settings=PROFILES["quick"], seed=0)
    assert result.verdict == "pass" and result.examples >= 10, result


@pytest.mark.serial
@pytest.mark.parametrize(("model", "cls", "rows"), [
    ("t5", "T5Attention", "uniform"),  # sdpa_attention_forward: where(mask, its position bias, finfo.min)
    ("layoutlmv3", "LayoutLMv3SelfAttention", "zeros"),  # takes position_bias from its model: None alone
    ("imagegpt", "ImageGPTAttention", "uniform_visible"),  # its own causal finfo.min, plus the mask's: -inf
    ("gemma2", "Gemma2Attention", "uniform"),  # causal through the mask HF builds: finfo.min on every key
])
def test_fully_masked_rows_follow_whether_the_layer_computes_its_position_bias(model: str, cls: str,
                                                                                rows: str) -> None:
    pytest.importorskip("transformers")
    target = load_target(HF.format(model, cls))
    assert f"fully masked rows -> {rows}" in target.build(32, 4).conventions.describe()
    if model == "t5":  # T5 fails the property itself: a true finding (test_findings.py)
        return
    result = run_property(all_properties()["fully_masked_rows"], target, settings=PROFILES["quick"], seed=0)
    assert result.verdict == ("pass" if rows == "zeros" else "declared") and result.examples >= 5, result


@pytest.mark.serial
@pytest.mark.parametrize(("model", "cls"), [("gemma2", "Gemma2Attention"),
                                          ("switch_transformers", "SwitchTransformersAttention")])
def test_an_eager_hf_layer_has_its_attention_weights_verified(model: str, cls: str) -> None:
    # Gemma 2 runs its eager code (sdpa refuses its soft-cap), which returns (output, weights);
    # SwitchTransformers' models refuse sdpa, and it returns (output, position_bias, weights)
    pytest.importorskip("transformers")
    target = load_target(HF.format(model, cls))
    assert target.build(32, 4).conventions.weights
    for name in ("mask_zeroes_weights", "rows_sum_to_one"):
        result = run_property(all_properties()[name], target, settings=PROFILES["quick"], seed=0)
        assert result.verdict == "pass" and result.examples >= 5, result


@pytest.mark.serial
@pytest.mark.parametrize(("cls", "verdict"), [("UnscaledAttention", "pass"),
                                             ("UnscaledAttentionFusedProcessor", "fail")])
def test_the_gate_finds_diffusers_fused_processor_ignoring_attn_scale(cls: str, verdict: str) -> None:
    pytest.importorskip("diffusers")
    target = load_target("tests/ecosystem/diffusers_scale.py:" + cls)
    assert "scale 1" in target.build(8, 2).conventions.describe()
    result = run_property(all_properties()["oracle_agreement"], target, settings=PROFILES["quick"], seed=0)
    assert result.verdict == verdict and result.examples >= 5, result
    assert verdict == "pass" or "output vs float64 oracle" in str(result.reason), result  # its values, not a raise


@pytest.mark.serial
@pytest.mark.parametrize(("model", "cls"), [("mllama", "MllamaVisionAttention"), ("layoutlm", "LayoutLMSelfAttention")])
def test_an_sdpa_layer_without_is_causal_is_called_with_a_mask_as_its_model_calls_it(model: str, cls: str) -> None:
    # HF's sdpa makes such a layer causal without a mask (test_findings.py); its models always pass one
    pytest.importorskip("transformers")
    target = load_target(HF.format(model, cls))
    assert "called with an all-keep mask where an example has none" in target.build(32, 4).conventions.describe()
    for name in ("oracle_agreement", "query_permutation"):
        result = run_property(all_properties()[name], target, settings=PROFILES["quick"], seed=0)
        assert result.verdict == "pass" and result.examples >= 10, result


@pytest.mark.serial
@pytest.mark.parametrize(("model", "cls"), [("kosmos2_5", "Kosmos2_5VisionAttention"),
                                            ("pix2struct", "Pix2StructVisionAttention")])
def test_a_layer_is_called_the_way_its_forward_dispatches_and_read_with_its_output(model: str, cls: str) -> None:
    # query/key/value with an `output` projection: by_shape reads all four (qkv_no_output took it for BERT's
    # projection-less layer and refused the output weight); Kosmos-2.5's vision layer runs eager whatever
    # its config says (test_findings.py), so it gets eager's additive masks
    pytest.importorskip("transformers")
    target = load_target(HF.format(model, cls))
    described = target.build(8, 2).conventions.describe()
    assert "query, key, value and output projections (query, key, value, output)" in described
    assert ("so it is called as eager" in described) == (model == "kosmos2_5")
    for name in ("oracle_agreement", "masked_kv_invariance"):
        result = run_property(all_properties()[name], target, settings=PROFILES["quick"], seed=0)
        assert result.verdict == "pass" and result.examples >= 10, result
