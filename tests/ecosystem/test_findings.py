"""True findings of the gate on library layers, each reproduced here with plain torch and the
library alone (no harness code), so that each is a fact about the library, not about us."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from tests.ecosystem import layers

pytestmark = pytest.mark.deep  # the ecosystem findings (tox -e deep, tox -e ecosystem)


def _x(B: int = 2, L: int = 4, D: int = 8, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(B, L, D, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(dtype)


def _fully_masked_row_keep(B: int = 2, L: int = 4) -> torch.Tensor:
    keep = torch.ones(B, 1, L, L, dtype=torch.bool)  # (B, 1, Lq, Lk)
    keep[:, :, 1, :] = False  # query row 1 sees no key
    return keep


def _hf_modeling(model: str) -> Any:
    """transformers' ``models/<model>/modeling_<model>.py``; the test is skipped where transformers
    or that model is not installed."""
    pytest.importorskip("transformers")
    import importlib

    try:
        return importlib.import_module(f"transformers.models.{model}.modeling_{model}")
    except ImportError as exc:
        pytest.skip(f"transformers has no {model} here: {exc}")


def _need_timm() -> None:
    try:
        layers.timm_layers()
    except ImportError as exc:
        pytest.skip(f"timm not installed (tox -e ecosystem): {exc}")


@pytest.mark.serial
def test_timm_unfused_path_gives_nan_on_a_fully_masked_row_where_the_fused_path_gives_b_o() -> None:
    _need_timm()
    torch.manual_seed(0)
    fused = layers.timm_attention(8, 2).eval()
    unfused = layers.timm_attention_unfused(8, 2).eval()
    unfused.load_state_dict(fused.state_dict())
    x, keep = _x(), _fully_masked_row_keep()
    with torch.no_grad():
        a, b = fused(x, attn_mask=keep), unfused(x, attn_mask=keep)
    assert torch.allclose(a[:, 1], fused.proj.bias.expand(2, 8))  # SDPA: zero weights, output b_o
    assert bool(torch.isnan(b[:, 1]).all())  # masked_fill(-inf) + softmax: NaN
    assert torch.allclose(a[:, 0], b[:, 0], atol=1e-6)  # the rows with keys agree


def _hf_sdpa_and_eager(name: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The transformers layer ``name`` with its SDPA and its eager attention, sharing weights."""
    pytest.importorskip("transformers", reason="transformers not installed (tox -e ecosystem)")
    torch.manual_seed(0)
    sdpa = getattr(layers, name)(8, 2).eval()
    eager = getattr(layers, f"{name}_eager")(8, 2).eval()
    eager.load_state_dict(sdpa.state_dict())
    return sdpa, eager


@pytest.mark.serial
def test_bert_eager_gives_nan_with_minus_inf_masks_where_sdpa_gives_0() -> None:
    sdpa, eager = _hf_sdpa_and_eager("bert_self_attention")
    x = _x()
    additive = torch.zeros(2, 1, 4, 4).masked_fill(~_fully_masked_row_keep(), -math.inf)
    with torch.no_grad():
        a, b = sdpa(x, attention_mask=additive)[0], eager(x, attention_mask=additive)[0]
    assert bool((a[:, 1] == 0).all())  # no output projection: zero weights give 0
    assert bool(torch.isnan(b[:, 1]).all())


@pytest.mark.serial
def test_gpt2_sdpa_is_causal_without_a_mask_its_eager_path_is_not() -> None:
    sdpa, eager = _hf_sdpa_and_eager("gpt2_attention")
    x = _x()
    causal = torch.ones(4, 4, dtype=torch.bool).tril().expand(2, 1, 4, 4)
    additive = torch.zeros(2, 1, 4, 4).masked_fill(~causal, torch.finfo(torch.float32).min)
    with torch.no_grad():
        a_none, b_none = sdpa(x)[0], eager(x)[0]
        b_causal = eager(x, attention_mask=additive)[0]
    assert torch.allclose(a_none, b_causal, atol=1e-5)  # SDPA without a mask is causal
    assert not torch.allclose(b_none, b_causal, atol=1e-3)  # eager without a mask is not


@pytest.mark.serial
def test_x_transformers_returns_weights_1_over_lk_on_a_fully_masked_row_while_its_output_is_0() -> None:
    pytest.importorskip("x_transformers", reason="x-transformers not installed (tox -e ecosystem)")
    torch.manual_seed(0)
    attn = layers.x_transformers_attention(8, 2).eval()
    with torch.no_grad():
        out, inter = attn(_x(), attn_mask=_fully_masked_row_keep(), return_intermediates=True)
    assert bool((out[:, 1] == 0).all())
    weights = inter.post_softmax_attn  # (B, H, Lq, Lk)
    assert torch.allclose(weights[:, :, 1], torch.full_like(weights[:, :, 1], 1 / 4))


def _torch_mha_with_random_biases() -> torch.nn.MultiheadAttention:
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
    with torch.no_grad():  # torch initializes biases to 0, where b_o and 0 look alike
        mha.in_proj_bias.normal_()
        mha.out_proj.bias.normal_()
    return mha


@pytest.mark.serial
def test_torch_mha_fast_path_gives_nan_on_a_fully_padded_item() -> None:
    mha = _torch_mha_with_random_biases()
    x = _x()
    padding = torch.zeros(2, 4, dtype=torch.bool)
    padding[1] = True  # item 1: every key padded
    slow = mha(x, x, x, key_padding_mask=padding, need_weights=False)[0].detach()
    with torch.inference_mode():  # q is k is v, batch_first, no grad: the fast path
        fast = mha(x, x, x, key_padding_mask=padding, need_weights=False)[0]
    assert torch.allclose(fast[0], slow[0], atol=1e-6)
    assert torch.allclose(slow[1], mha.out_proj.bias.detach().expand(4, 8))  # eager path: b_o
    assert bool(torch.isnan(fast[1]).all())  # fast path: NaN


@pytest.mark.serial
def test_torch_mha_fast_path_gives_nan_on_a_fully_masked_row_of_attn_mask() -> None:
    mha = _torch_mha_with_random_biases()
    x = _x()
    masked_out = torch.zeros(4, 4, dtype=torch.bool)  # torch's attn_mask: True = not allowed
    masked_out[1] = True  # query row 1 sees no key
    slow = mha(x, x, x, attn_mask=masked_out, need_weights=False)[0].detach()
    with torch.inference_mode():
        fast = mha(x, x, x, attn_mask=masked_out, need_weights=False)[0]
    assert torch.allclose(slow[:, 1], mha.out_proj.bias.detach().expand(2, 8))
    assert bool(torch.isnan(fast[:, 1]).all())
    assert torch.allclose(fast[:, 0], slow[:, 0], atol=1e-6)


@pytest.mark.serial
def test_torch_mha_gives_nan_with_weights_where_it_gives_b_o_without() -> None:
    """The WARN of fully_masked_rows on torch MHA: its two eager paths disagree on a fully masked row."""
    mha = _torch_mha_with_random_biases()
    x = _x()
    masked_out = torch.zeros(4, 4, dtype=torch.bool)
    masked_out[1] = True
    # autograd on (under no_grad the fast path would run): the eager kernels
    without = mha(x, x, x, attn_mask=masked_out, need_weights=False)[0].detach()
    with_weights, weights = (t.detach() for t in mha(x, x, x, attn_mask=masked_out, need_weights=True))
    assert torch.allclose(without[:, 1], mha.out_proj.bias.detach().expand(2, 8))
    assert bool(torch.isnan(with_weights[:, 1]).all())
    assert bool(torch.isnan(weights[:, 1]).all())


@pytest.mark.serial
def test_x_transformers_runs_its_softmax_in_float32_for_float64_inputs() -> None:
    pytest.importorskip("x_transformers", reason="x-transformers not installed (tox -e ecosystem)")
    torch.manual_seed(0)
    attn = layers.x_transformers_attention(8, 2).double().eval()
    with torch.no_grad():
        _, inter = attn(_x(dtype=torch.float64), return_intermediates=True)
    weights = inter.post_softmax_attn  # float64 tensor holding float32 values: gradcheck in float64 fails
    assert weights.dtype == torch.float64
    assert torch.equal(weights, weights.float().double())


@pytest.mark.serial
def test_torch_mha_called_as_m_x_x_x_exports_with_torchscript_for_its_example_sizes_only() -> None:
    """TorchScript traces torch MHA's packed self-attention projection (q is k is v) with the
    example's length fixed in the Reshape of k (``k.view(k.shape[0], ...)``): onnxruntime runs the
    model at (B, L) = (2, 3) and fails at (3, 5). The same layer called with distinct k and v
    exports with dynamic sizes."""
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime not installed")
    import io
    import warnings

    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()

    def session(self_attention: bool) -> Any:
        class Call(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.mha = mha

            def forward(self, x: torch.Tensor) -> torch.Tensor:  # x (B, L, D) -> (B, L, D)
                k, v = (x, x) if self_attention else (x + 0, x + 0)
                return self.mha(x, k, v, need_weights=False)[0]

        buf = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(Call(), (torch.randn(2, 3, 16),), buf, dynamo=False, opset_version=20,
                              input_names=["x"], output_names=["out"],
                              dynamic_axes={"x": {0: "b", 1: "l"}, "out": {0: "b", 1: "l"}})
        return ort.InferenceSession(buf.getvalue(), providers=["CPUExecutionProvider"])

    x_example, x_other = torch.randn(2, 3, 16).numpy(), torch.randn(3, 5, 16).numpy()
    self_session, cross_session = session(True), session(False)
    assert self_session.run(None, {"x": x_example})[0].shape == (2, 3, 16)
    with pytest.raises(Exception, match="Reshape"):
        self_session.run(None, {"x": x_other})
    assert cross_session.run(None, {"x": x_other})[0].shape == (3, 5, 16)


@pytest.mark.serial
def test_cpu_sdpa_without_a_mask_accepts_lk_different_from_lv() -> None:
    """torch's CPU scaled_dot_product_attention with no mask takes keys and values of different
    lengths: with Lk < Lv it reads key rows past the end of k (rows of the storage k is a view of
    change its output), with Lk > Lv it silently attends to the first Lv keys only; the math
    backend refuses both. Found by ``lk_equals_lv`` on a diffusers layer."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gen = torch.Generator().manual_seed(0)
    q, v = torch.randn(1, 1, 3, 4, generator=gen), torch.randn(1, 1, 5, 4, generator=gen)
    storage = torch.randn(1, 1, 5, 4, generator=gen)
    k = storage[:, :, :2]  # Lk = 2 < Lv = 5, a view of the first two rows
    before = F.scaled_dot_product_attention(q, k, v)
    storage[:, :, 2:] = 10 * torch.randn(1, 1, 3, 4, generator=gen)  # rows past k's end
    assert not torch.equal(F.scaled_dot_product_attention(q, k, v), before)  # read memory outside k
    k_long, v_short = torch.randn(1, 1, 5, 4, generator=gen), torch.randn(1, 1, 2, 4, generator=gen)
    first = torch.softmax(q @ k_long[:, :, :2].transpose(-1, -2) / 2.0, dim=-1) @ v_short
    assert torch.allclose(F.scaled_dot_product_attention(q, k_long, v_short), first, atol=1e-6)  # keys dropped
    with sdpa_kernel(SDPBackend.MATH), pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, k, v)


@pytest.mark.serial
def test_gpt2_attention_raises_on_a_transposed_view_of_its_input() -> None:
    """HF's Conv1D calls x.view(-1, D): a (B, L, D) view of (L, B, D) storage raises RuntimeError,
    while a contiguous copy of the same values works (layout_independence's warning)."""
    sdpa, _ = _hf_sdpa_and_eager("gpt2_attention")
    x = _x()
    view = x.transpose(0, 1).contiguous().transpose(0, 1)  # the same values, (L, B, D) storage
    with torch.no_grad():
        out = sdpa(x)[0]
        with pytest.raises(RuntimeError, match="view size is not compatible"):
            sdpa(view)
        assert torch.equal(sdpa(view.contiguous())[0], out)


# T5's attention and the copies of it the sweep failed on fully_masked_rows: (model, its prefix)
T5_FAMILY = [("t5", "T5"), ("mt5", "MT5"), ("pop2piano", "Pop2Piano"), ("switch_transformers", "SwitchTransformers"),
             ("udop", "Udop"), ("umt5", "UMT5")]


@pytest.mark.serial
@pytest.mark.parametrize(("model", "prefix"), T5_FAMILY)
def test_t5_sdpa_gives_uniform_weights_on_a_row_masked_by_a_bool_mask_and_zeros_by_minus_inf(model: str,
                                                                                              prefix: str) -> None:
    module = _hf_modeling(model)
    import transformers

    config = getattr(transformers, f"{prefix}Config")(d_model=8, num_heads=2, d_kv=4)
    config._attn_implementation = "sdpa"
    layer = getattr(module, f"{prefix}Attention")(config).eval()
    import inspect

    name = "mask" if "mask" in inspect.signature(layer.forward).parameters else "attention_mask"  # UMT5's
    x, keep = _x(), _fully_masked_row_keep()
    additive = torch.zeros(keep.shape).masked_fill(~keep, -math.inf)
    with torch.no_grad():
        by_bool = layer(x, **{name: keep})[0]
        by_float = layer(x, **{name: additive})[0]
        values = layer.v(x).view(2, 4, 2, 4).transpose(1, 2)  # (B, H, L, Hd)
        uniform = layer.o(values.mean(dim=2).reshape(2, 8))  # every key weighted 1/Lk
    assert torch.allclose(by_bool[:, 1], uniform, atol=1e-6)  # where(mask, bias, finfo.min): uniform weights
    assert torch.allclose(by_float[:, 1], torch.zeros(2, 8), atol=1e-6)  # -inf: zero weights, o has no bias
    assert torch.allclose(by_bool[:, [0, 2, 3]], by_float[:, [0, 2, 3]], atol=1e-6)  # the other rows agree


@pytest.mark.serial
@pytest.mark.parametrize(("model", "prefix"), [("pp_ocrv5_server_rec", "PPOCRV5ServerRec"),
                                             ("pp_ocrv5_mobile_rec", "PPOCRV5MobileRec"),
                                             ("pp_ocrv6_small_rec", "PPOCRV6SmallRec")])
def test_pp_ocr_rec_attention_takes_an_attention_mask_and_ignores_it(model: str, prefix: str) -> None:
    # "Not used but kept for signature matching": a caller's mask is dropped without a word
    m = _hf_modeling(model)
    config = getattr(m, f"{prefix}Config")()
    config.hidden_size, config.num_attention_heads = 8, 2
    layer = getattr(m, f"{prefix}Attention")(config).eval()
    x, keep = _x(), _fully_masked_row_keep()
    additive = torch.zeros(keep.shape).masked_fill(~keep, -math.inf)
    with torch.no_grad():
        masked, unmasked = layer(x, attention_mask=additive)[0], layer(x)[0]
    assert torch.equal(masked, unmasked)  # row 1 sees no key, yet its output is that of an unmasked row


@pytest.mark.serial
def test_step3p7_vision_rotary_runs_in_float32_for_float64_inputs() -> None:
    pytest.importorskip("transformers")
    from transformers.models.step3p7.modeling_step3p7 import apply_rotary_pos_emb_vision

    q = torch.randn(1, 5, 2, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))  # (B, L, H, Hd)
    angles = torch.linspace(0.1, 2.0, 5 * 4, dtype=torch.float64).reshape(1, 5, 4)
    cos, sin = angles.cos(), angles.sin()
    got, _ = apply_rotary_pos_emb_vision(q, q, cos, sin)
    half = torch.cat((-q[..., 2:], q[..., :2]), dim=-1)
    exact = q * cos[:, :, None] + half * sin[:, :, None]
    assert got.dtype == torch.float64
    assert 1e-9 < float((got - exact).abs().max()) < 1e-6  # float32 rounding, in a float64 result


# every class the QK-norm sweep failed on gradcheck alone (docs/findings.md): its norm's module and class
QK_NORMS_IN_FLOAT32 = [
    ("qwen3", "Qwen3RMSNorm"), ("apertus", "ApertusRMSNorm"), ("diffusion_gemma", "DiffusionGemmaRMSNorm"),
    ("dots1", "Dots1RMSNorm"), ("exaone4", "Exaone4RMSNorm"), ("exaone_moe", "ExaoneMoeRMSNorm"),
    ("flex_olmo", "FlexOlmoRMSNorm"), ("gemma3", "Gemma3RMSNorm"), ("gemma3n", "Gemma3nRMSNorm"),
    ("hy_v3", "HYV3RMSNorm"), ("kolibri1", "Kolibri1RMSNorm"), ("lara_mini", "LaraMiniRMSNorm"),
    ("lfm2", "Lfm2RMSNorm"), ("lfm2_moe", "Lfm2MoeRMSNorm"), ("mellum", "MellumRMSNorm"),
    ("minimax_m2", "MiniMaxM2RMSNorm"), ("minimax_m3_vl", "MiniMaxM3VLRMSNorm"), ("molmo2", "Molmo2RMSNorm"),
    ("olmo2", "Olmo2RMSNorm"), ("olmo_hybrid", "OlmoHybridRMSNorm"), ("qwen3_moe", "Qwen3MoeRMSNorm"),
    ("qwen3_omni_moe", "Qwen3OmniMoeThinkerTextRMSNorm"), ("qwen3_vl", "Qwen3VLTextRMSNorm"),
    ("qwen3_vl_moe", "Qwen3VLMoeTextRMSNorm"),
    ("olmo3", "Olmo3RMSNorm"), ("olmoe", "OlmoeRMSNorm"),
    # and those whose rotary read as Llama's had hidden it (gradcheck alone once it was read right)
    ("apertus1p5", "Apertus1p5TextRMSNorm"), ("nanochat", "NanoChatRMSNorm"), ("pe_audio", "PeAudioEncoderRMSNorm"),
    ("pe_audio_video", "PeAudioVideoEncoderRMSNorm"), ("pe_video", "PeVideoEncoderRMSNorm"),
]


@pytest.mark.serial
@pytest.mark.parametrize(("model", "cls"), QK_NORMS_IN_FLOAT32)
def test_qk_norms_run_in_float32_for_float64_inputs(model: str, cls: str) -> None:
    # HF's RMSNorms "upcast" with hidden_states.to(torch.float32) (or .float()): a float64 input is
    # rounded to float32, so these layers' QK-norm loses float64's precision and gradcheck fails
    import inspect

    norm_cls = getattr(_hf_modeling(model), cls)
    takes_size = len([p for p in inspect.signature(norm_cls).parameters.values() if p.default is p.empty]) > 0
    norm = (norm_cls(8) if takes_size else norm_cls()).double()
    eps = next(float(getattr(norm, a)) for a in ("eps", "variance_epsilon") if hasattr(norm, a))
    x = torch.randn(3, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    exact = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)  # weights at init: w = 1, or 1 + w with w = 0
    with torch.no_grad():
        got = norm(x)
    assert got.dtype == torch.float64
    assert 1e-9 < float((got - exact).abs().max()) < 1e-6  # float32 rounding, in a float64 result


@pytest.mark.serial
@pytest.mark.parametrize(("model", "layout"), [
    ("cohere", "pairs"), ("cohere2", "pairs"), ("cohere2_moe", "pairs"),
    ("ernie4_5", "pairs from halves"), ("ernie4_5_moe", "pairs from halves"), ("evolla", "halves"),
    ("lightglue", "pairs"),
])
def test_rotaries_that_upcast_run_in_float32_for_float64_inputs(model: str, layout: str) -> None:
    # these apply_rotary_pos_emb take q.float() and k.float(): a float64 input is rounded to float32.
    # Cohere rotates neighbouring columns by cos and sin repeated per pair; Ernie 4.5 the same, from
    # cos and sin in HF's halves layout; Evolla rotates halves (Llama's); LightGlue neighbouring
    # columns, its cos and sin repeated per pair by its keypoint encoder
    module = _hf_modeling(model)
    q = torch.randn(1, 2, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))  # (B, H, L, Hd)
    angles = torch.linspace(0.1, 2.0, 5 * 2, dtype=torch.float64).reshape(1, 5, 2)  # (B, L, Hd/2)
    halves = torch.cat((angles, angles), dim=-1)  # HF's layout: each angle for columns i and i + Hd/2
    if layout == "halves":
        given, each, turned = halves, halves, torch.cat((-q[..., 2:], q[..., :2]), dim=-1)
    else:
        paired = angles.repeat_interleave(2, dim=-1)  # each angle for columns 2i and 2i + 1
        turned = torch.stack((-q[..., 1::2], q[..., 0::2]), dim=-1).flatten(-2)
        given, each = (paired if layout == "pairs" else halves), paired
    got, _ = module.apply_rotary_pos_emb(q, q, given.cos(), given.sin())
    exact = q * each.cos()[:, None] + turned * each.sin()[:, None]
    assert got.dtype == torch.float64
    assert 1e-9 < float((got - exact).abs().max()) < 1e-6  # float32 rounding, in a float64 result


@pytest.mark.serial
def test_diffusers_rms_norm_runs_in_float32_for_float64_inputs() -> None:
    # diffusers' RMSNorm takes its variance of hidden_states.to(torch.float32): AnyFlow's QK-norm
    pytest.importorskip("diffusers")
    from diffusers.models.normalization import RMSNorm

    norm = RMSNorm(8, eps=1e-6).double()
    x = torch.randn(3, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    exact = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    with torch.no_grad():
        got = norm(x)
    assert got.dtype == torch.float64
    assert 1e-9 < float((got - exact).abs().max()) < 1e-6


@pytest.mark.serial
@pytest.mark.parametrize(("module", "cls", "size"), [
    ("autoencoders.autoencoder_kl_minimax_h3", "MiniMaxH3VideoAttention", "dim"),
    ("transformers.transformer_flux3", "Flux3Attention", "query_dim"),
])
def test_diffusers_processors_normalize_q_and_k_in_float32_for_float64_inputs(module: str, cls: str,
                                                                              size: str) -> None:
    # their processors call attn.norm_q(query.float()): a float64 layer's QK-norm is rounded to float32
    pytest.importorskip("diffusers")
    import importlib

    import torch.nn.functional as F

    layer_cls = getattr(importlib.import_module(f"diffusers.models.{module}"), cls)
    torch.manual_seed(0)
    attn = layer_cls(**{size: 8}, heads=2, dim_head=4).double().eval()
    x = torch.randn(1, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = attn(x)
        q, k, v = (p(x).unflatten(2, (2, -1)) for p in (attn.to_q, attn.to_k, attn.to_v))  # (B, L, H, Hd)
        q, k = attn.norm_q(q), attn.norm_k(k)  # torch's RMSNorm, in float64
        heads = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        exact = attn.to_out[0](heads.transpose(1, 2).flatten(2))
    assert got.dtype == torch.float64
    assert 1e-9 < float((got - exact).abs().max()) < 1e-5  # float32 rounding, in a float64 result


@pytest.mark.serial
def test_gemma2_eager_attention_runs_its_softmax_in_float32_for_float64_inputs() -> None:
    # eager_attention_forward: softmax(attn_weights, dtype=torch.float32).to(query.dtype), so a float64
    # layer's weights carry float32 rounding: gradcheck fails on Gemma 2 (which runs eager for its soft-cap)
    pytest.importorskip("transformers")
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 4, dtype=torch.float64, generator=g) for _ in range(3))  # (B, H, L, Hd)

    class Owner(torch.nn.Module):  # what eager_attention_forward reads of its layer
        num_key_value_groups = 1
        training = False

    _, weights = eager_attention_forward(Owner(), q, k, v, None, dropout=0.0, scaling=0.5)
    exact = torch.softmax(q @ k.transpose(-2, -1) * 0.5, dim=-1)
    assert weights.dtype == torch.float64
    assert 1e-10 < float((weights - exact).abs().max()) < 1e-6  # float32 rounding, in a float64 result


def _diffusers_heads(attn: Any, x: torch.Tensor, scale: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """diffusers' Attention (query_dim 8, 2 heads of 4) in plain torch: x (B, L, 8) -> (B, L, 8)."""
    q, k, v = (lin(x).unflatten(-1, (2, 4)).transpose(1, 2) for lin in (attn.to_q, attn.to_k, attn.to_v))
    scores = q @ k.transpose(-1, -2) * scale  # (B, H, L, L)
    if mask is not None:
        scores = scores + mask[:, None]
    return attn.to_out[0]((scores.softmax(-1) @ v).transpose(1, 2).flatten(-2))


@pytest.mark.serial
def test_diffusers_attn_processor2_0_ignores_attn_scale_of_a_scale_qk_false_layer() -> None:
    # Attention(scale_qk=False) has attn.scale = 1 and picks the classic AttnProcessor, which applies
    # it; AttnProcessor2_0 set on it (set_processor, a model's set_attn_processor) calls SDPA without
    # scale= ("TODO: add support for attn.scale"), so the layer silently goes back to 1/sqrt(dim_head)
    pytest.importorskip("diffusers")
    from diffusers.models.attention_processor import Attention, AttnProcessor, AttnProcessor2_0

    torch.manual_seed(0)
    attn = Attention(query_dim=8, heads=2, dim_head=4, scale_qk=False).double().eval()
    x = _x(1, 5, 8, torch.float64)
    assert attn.scale == 1.0 and isinstance(attn.processor, AttnProcessor)
    with torch.no_grad():
        torch.testing.assert_close(attn(x), _diffusers_heads(attn, x, 1.0))
        attn.set_processor(AttnProcessor2_0())
        torch.testing.assert_close(attn(x), _diffusers_heads(attn, x, 1 / math.sqrt(4)))
        assert float((attn(x) - _diffusers_heads(attn, x, 1.0)).abs().max()) > 1e-3


@pytest.mark.serial
def test_diffusers_classic_attn_processor_gives_nan_on_a_minus_inf_row_where_2_0_gives_to_out_bias() -> None:
    pytest.importorskip("diffusers")
    from diffusers.models.attention_processor import Attention, AttnProcessor, AttnProcessor2_0

    torch.manual_seed(0)
    attn = Attention(query_dim=8, heads=2, dim_head=4).double().eval()
    x = _x(1, 5, 8, torch.float64)
    mask = torch.zeros(1, 5, 5, dtype=torch.float64)  # additive (B, Lq, Lk)
    mask[0, 0] = float("-inf")  # query row 0 sees no key
    with torch.no_grad():
        assert isinstance(attn.processor, AttnProcessor2_0)
        fused = attn(x, attention_mask=mask)
        attn.set_processor(AttnProcessor())
        classic = attn(x, attention_mask=mask)
        torch.testing.assert_close(fused[0, 0], attn.to_out[0].bias)  # SDPA: 0 on the row, then the bias
        assert bool(classic[0, 0].isnan().all())  # baddbmm + softmax of a row of -inf: NaN
        torch.testing.assert_close(classic[0, 1:], fused[0, 1:])  # the other rows agree


@pytest.mark.serial
@pytest.mark.parametrize("model", ["vit", "git", "align", "clap", "markuplm", "splinter", "t5gemma", "t5gemma2",
                                   "vaultgemma", "videoprism"])
def test_eager_attention_runs_its_softmax_in_float32_for_float64_inputs(model: str) -> None:
    # softmax(attn_weights, dtype=torch.float32).to(query.dtype): ViT's, GIT's, ALIGN's, CLAP's and MarkupLM's
    # eager code (MarkupLM's models declare no sdpa: eager is what they run), and of those built eager
    # because their models refuse sdpa or soft-cap (Splinter, T5Gemma 1 and 2, VaultGemma, VideoPrism)
    from torch import nn

    eager_attention_forward = _hf_modeling(model).eager_attention_forward

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 4, dtype=torch.float64, generator=g) for _ in range(3))  # (B, H, L, Hd)
    module = nn.Module().eval()
    module.num_key_value_groups = 1  # the Gemma family's repeat_kv reads it
    got, _ = eager_attention_forward(module, q, k, v, None, scaling=0.5, dropout=0.0)
    exact = ((q @ k.transpose(-1, -2) * 0.5).softmax(-1) @ v).transpose(1, 2)  # (B, L, H, Hd)
    assert got.dtype == torch.float64
    assert 1e-10 < float((got - exact).abs().max()) < 1e-6  # float32 rounding, in a float64 result


@pytest.mark.serial
@pytest.mark.parametrize(("model", "cls"), [("bart", "BartAttention"), ("whisper", "WhisperAttention")])
def test_bart_and_whisper_attention_built_with_their_default_config_none_raise_on_every_forward(model: str,
                                                                                               cls: str) -> None:
    layer = getattr(_hf_modeling(model), cls)(8, 2)
    assert layer.config is None
    with pytest.raises(AttributeError, match="_attn_implementation"):
        layer(_x(1, 5, 8))


@pytest.mark.serial
def test_ernie_image_attention_takes_encoder_hidden_states_and_ignores_it() -> None:
    # its forward(hidden_states, encoder_hidden_states=None, ...) calls its processor without it
    pytest.importorskip("diffusers")
    from diffusers.models.transformers.transformer_ernie_image import ErnieImageAttention

    torch.manual_seed(0)
    layer = ErnieImageAttention(query_dim=8, heads=2, dim_head=4).eval()
    x, context = _x(1, 5, 8), _x(1, 3, 8) * 10
    with torch.no_grad():
        alone = layer(x)
        with_context = layer(x, encoder_hidden_states=context)
        other_context = layer(x, encoder_hidden_states=-context)
    assert torch.equal(with_context, alone) and torch.equal(other_context, alone)


@pytest.mark.serial
@pytest.mark.parametrize(("model", "prefix"), [("esm", "Esm"), ("megatron_bert", "MegatronBert"), ("tapas", "Tapas")])
def test_cross_attention_that_views_its_keys_with_the_querys_length(model: str, prefix: str) -> None:
    # key = self.key(encoder_hidden_states).view(hidden_shape), hidden_shape from hidden_states: a
    # context of another length than the queries' cannot be attended to (BERT's uses kv_shape)
    module = _hf_modeling(model)
    import transformers

    config = getattr(transformers, f"{prefix}Config")(hidden_size=8, num_attention_heads=2)
    config._attn_implementation = "eager"
    layer = getattr(module, f"{prefix}SelfAttention")(config).eval()
    x = _x(1, 3, 8)
    with torch.no_grad():
        assert layer(x, encoder_hidden_states=_x(1, 3, 8))[0].shape == (1, 3, 8)  # Lk = Lq: runs
        with pytest.raises(RuntimeError, match="invalid for input of size"):
            layer(x, encoder_hidden_states=_x(1, 5, 8))
        with pytest.raises(RuntimeError, match="must match the size"):
            layer(x, encoder_hidden_states=_x(1, 6, 8))  # viewed as 4 heads against the queries' 2


# layers with no is_causal attribute, run by HF's sdpa_attention_forward (which takes a missing one as True)
NO_IS_CAUSAL = [("layoutlm", "LayoutLM")]


@pytest.mark.serial
@pytest.mark.parametrize(("model", "prefix"), NO_IS_CAUSAL)
def test_a_layer_without_is_causal_is_causal_under_sdpa_when_called_without_a_mask(model: str, prefix: str) -> None:
    # the layer alone: its model always passes a mask (ones where none is given), so a model is not hit
    module = _hf_modeling(model)
    import transformers

    config = getattr(transformers, f"{prefix}Config")(hidden_size=8, num_attention_heads=2)
    config._attn_implementation = "sdpa"
    layer = getattr(module, f"{prefix}SelfAttention")(config).eval()
    assert not hasattr(layer, "is_causal")
    x = _x()
    with torch.no_grad():
        without = layer(x)[0]
        with_ones = layer(x, attention_mask=torch.ones(2, 1, 4, 4, dtype=torch.bool))[0]
        causal = layer(x, attention_mask=torch.ones(4, 4, dtype=torch.bool).tril().expand(2, 1, 4, 4))[0]
    assert torch.allclose(without, causal, atol=1e-6)  # no mask: query 0 sees key 0 alone
    assert float((without[:, 0] - with_ones[:, 0]).abs().max()) > 1e-2


@pytest.mark.serial
def test_xglm_attention_cannot_take_a_mask_in_float64() -> None:
    # torch.max(scores, torch.full((), finfo(scores.dtype).min)): the full() is float32 by default,
    # and float64's min does not fit it
    layer = _hf_modeling("xglm").XGLMAttention(8, 2).double().eval()
    x = _x(dtype=torch.float64)
    with torch.no_grad():
        assert layer(x)[0].dtype == torch.float64  # no mask: runs
        with pytest.raises(RuntimeError, match="cannot be converted to type float without overflow"):
            layer(x, attention_mask=torch.zeros(2, 1, 4, 4, dtype=torch.float64))


@pytest.mark.serial
@pytest.mark.parametrize(("model", "prefix"), [("sam2", "Sam2"), ("edgetam", "EdgeTam"),
                                             ("sam3_tracker", "Sam3Tracker")])
def test_sam_attention_takes_keys_and_values_of_different_lengths(model: str, prefix: str) -> None:
    # its sdpa call inherits CPU SDPA's acceptance of Lk != Lv without a mask
    # (test_cpu_sdpa_without_a_mask_accepts_lk_different_from_lv)
    m = _hf_modeling(model)
    config = getattr(m, f"{prefix}MaskDecoderConfig")(hidden_size=8, num_attention_heads=2)
    config._attn_implementation = "sdpa"
    layer = getattr(m, f"{prefix}Attention")(config, downsample_rate=1).eval()
    q, k, v = _x(1, 3, 8)[:, None], _x(1, 2, 8)[:, None], _x(1, 5, 8)[:, None]  # (B, points, L, D)
    with torch.no_grad():
        assert layer(q, k, v)[0].shape == (1, 1, 3, 8)  # no error for Lk = 2, Lv = 5


@pytest.mark.serial
def test_kosmos2_5_vision_attention_runs_eager_whatever_its_attn_implementation() -> None:
    # getattr(ALL_ATTENTION_FUNCTIONS, "sdpa", eager_attention_forward): the registry is a mapping with no
    # such attribute, so the default runs; its text attention uses ALL_ATTENTION_FUNCTIONS.get_interface
    m = _hf_modeling("kosmos2_5")  # skipped where transformers is not installed
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    assert getattr(ALL_ATTENTION_FUNCTIONS, "sdpa", None) is None and "sdpa" in ALL_ATTENTION_FUNCTIONS
    config = m.Kosmos2_5VisionConfig(hidden_size=8, num_attention_heads=2, head_dim=4)
    config._attn_implementation = "sdpa"
    layer = m.Kosmos2_5VisionAttention(config).eval()
    x = _x()
    with torch.no_grad():
        unmasked = layer(x)[0]
        # a bool mask, as transformers' sdpa masks are, removes every key under SDPA; here it is added, +0
        dropped = layer(x, attention_mask=torch.zeros(2, 1, 4, 4, dtype=torch.bool))[0]
    assert torch.equal(dropped, unmasked)
    assert layer(x, attention_mask=torch.zeros(2, 1, 4, 4))[1] is not None  # eager returns its weights


@pytest.mark.serial
def test_unlimited_ocr_text_attention_eager_path_raises_with_grouped_query_heads() -> None:
    """Its forward dispatches to its module's ``eager_attention_forward``, written for the vision encoder:
    it never repeats the key/value heads, so with fewer of them than query heads the eager path (the
    one transformers takes for output_attentions=True) raises; sdpa repeats them (enable_gqa)."""
    modeling = _hf_modeling("unlimited_ocr")
    from transformers.models.unlimited_ocr.configuration_unlimited_ocr import UnlimitedOcrTextConfig

    config = UnlimitedOcrTextConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    x = _x(1, 5, 32)
    cos_sin = (torch.ones(1, 5, 8), torch.zeros(1, 5, 8))  # a rotation by 0: the bug is not the rotary's
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    sdpa = modeling.UnlimitedOcrTextAttention(config, layer_idx=0).eval()
    with torch.no_grad():
        assert sdpa(hidden_states=x, position_embeddings=cos_sin, attention_mask=None)[0].shape == (1, 5, 32)
    config._attn_implementation = "eager"
    with torch.no_grad(), pytest.raises(RuntimeError, match="must match the size of tensor b"):
        sdpa(hidden_states=x, position_embeddings=cos_sin, attention_mask=None)


@pytest.mark.serial
def test_vjepa2_pooler_self_attention_eager_path_drops_its_attention_mask() -> None:
    """VJEPA2's ``eager_attention_forward`` never adds ``attention_mask``: the sdpa path masks, the eager
    path (output_attentions=True) attends to every key."""
    modeling = _hf_modeling("vjepa2")
    from transformers import VJEPA2Config

    config = VJEPA2Config(hidden_size=8, num_attention_heads=2)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    layer = modeling.VJEPA2PoolerSelfAttention(config).eval()
    x = _x()
    additive = torch.zeros(2, 1, 4, 4)
    additive[..., 0] = torch.finfo(torch.float32).min  # key 0 hidden from every query
    with torch.no_grad():
        unmasked = layer(x, attention_mask=None)[0]
        masked_sdpa = layer(x, attention_mask=additive)[0]
        config._attn_implementation = "eager"
        masked_eager = layer(x, attention_mask=additive)[0]
    assert not torch.allclose(masked_sdpa, unmasked, atol=1e-4)  # sdpa applies the mask
    assert torch.allclose(masked_eager, unmasked, atol=1e-6)  # eager ignores it
