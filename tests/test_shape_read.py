"""Layers no naming row names, recognized by their projections' shapes and the order their forward
names them, their masks read from their source; steps the oracle does not model refused by name
(``tests/fixtures/shape_read_layers.py``)."""

from __future__ import annotations

import pytest
import torch

from mha_verify.properties.adapters.by_shape import ByShapeAdapter, read_projections
from mha_verify.properties.engine.profiles import PROFILES
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.targets.eager import load_target

FIXTURE = "tests/fixtures/shape_read_layers.py:"
QUICK = PROFILES["quick"]


def _verdicts(name: str, checks: tuple[str, ...]) -> dict[str, str]:
    target = load_target(FIXTURE + name)
    return {c: run_property(all_properties()[c], target, settings=QUICK, seed=0).verdict for c in checks}


@pytest.mark.parametrize(("name", "layout"), [("SpeechStyle", "q_k_v"), ("PerceiverStyle", "q_kv"),
                                              ("VisionStyle", "qkv")])
def test_projections_are_read_from_their_shapes(name: str, layout: str) -> None:
    bound = load_target(FIXTURE + name).build(8, 2)
    assert isinstance(bound.adapter, ByShapeAdapter)
    reading = read_projections(bound.module)
    assert reading is not None and reading.layout == layout
    assert any("read from their shapes" in n for n in bound.conventions.notes), bound.conventions.notes


@pytest.mark.deep
def test_a_mask_read_only_as_a_switch_is_said_so_and_the_rest_is_verified() -> None:
    conv = load_target(FIXTURE + "SpeechStyle").build(8, 2).conventions
    assert not conv.mask and conv.cross_attention
    assert conv.mask_ignored is not None and "is_causal=mask is not None" in conv.mask_ignored
    assert set(_verdicts("SpeechStyle", ("oracle_agreement", "head_split", "key_permutation")).values()) == {"pass"}
    assert _verdicts("SpeechStyleKeyBiasOnValues", ("oracle_agreement",)) == {"oracle_agreement": "fail"}


@pytest.mark.deep
def test_a_key_padding_keep_mask_is_read_from_the_source() -> None:
    conv = load_target(FIXTURE + "PerceiverStyle").build(8, 2).conventions
    assert conv.mask == frozenset({"bool"}) and conv.fully_masked == "uniform"
    assert conv.mask_forms and all(form.endswith("L") for form in conv.mask_forms)
    checks = ("oracle_agreement", "masked_kv_invariance", "batch_independence", "fully_masked_rows")
    # a fully masked row gives uniform weights, as its -finfo.max fill says: "declared", not a failure
    assert _verdicts("PerceiverStyle", checks) == {**dict.fromkeys(checks[:3], "pass"), "fully_masked_rows": "declared"}
    assert _verdicts("PerceiverStyleSwappedKV", ("oracle_agreement",)) == {"oracle_agreement": "fail"}
    assert _verdicts("PerceiverStyleMaskFirstItem", ("batch_independence",)) == {"batch_independence": "fail"}


@pytest.mark.deep
def test_a_fused_projection_read_by_shape_is_verified_and_its_twin_fails() -> None:
    assert set(_verdicts("VisionStyle", ("oracle_agreement", "head_split")).values()) == {"pass"}
    assert _verdicts("VisionStyleHeadsMixed", ("oracle_agreement",)) == {"oracle_agreement": "fail"}


@pytest.mark.deep
def test_a_pre_norm_inside_a_self_attention_layer_is_applied_by_the_oracle_and_its_twin_fails() -> None:
    conv = load_target(FIXTURE + "PreNormed").build(8, 2).conventions
    assert conv.input_norm is not None and conv.input_norm.kind == "layer"
    assert any("its input normalized first by norm" in n for n in conv.notes), conv.notes
    checks = ("oracle_agreement", "head_split", "grad_agreement", "batch_independence")
    assert set(_verdicts("PreNormed", checks).values()) == {"pass"}
    assert _verdicts("PreNormedRawValues", ("oracle_agreement",)) == {"oracle_agreement": "fail"}


def test_a_zero_initialized_table_stays_zero_when_the_weights_are_redrawn() -> None:
    from torch import nn

    from mha_verify.properties.targets.eager import randomize_parameters

    layer = nn.Module()
    layer.proj = nn.Linear(4, 4)
    nn.init.zeros_(layer.proj.bias)
    layer.u = nn.Parameter(torch.zeros(2, 2))  # Transformer-XL's content bias, zero at init
    randomize_parameters(layer, seed=0)
    assert bool(layer.proj.bias.ne(0).any()), "a zero bias is drawn: a bug that drops it must show"
    assert not bool(layer.u.ne(0).any()), "a zero table is a step the layer does not take at init"


def test_a_layer_norm_over_one_feature_is_calibrated_by_torchs_own_layer_norm() -> None:
    """At D = 1 a LayerNorm's output is its bias and d out / d x is exactly 0; torch's float32 kernel
    gives a rounding of the order of eps / sqrt(eps_norm) instead (a false FAIL of grad_agreement on
    vit-pytorch's simple_vit_with_register_tokens). The same-precision kernel draw runs the norm
    through torch's layer_norm, so its error is the layer's; the plain formula's is 0."""
    from mha_verify.properties.invariants import grad
    from mha_verify.properties.strategies.examples import make_example
    from mha_verify.properties.strategies.masks import MaskSpec
    from mha_verify.properties.strategies.size_cases import Sizes

    bound = load_target(FIXTURE + "PreNormed").build(1, 1)
    ex = make_example(Sizes(2, 64, 64, 1, 1), MaskSpec("none", "BHLL", "bool", 0), (1e-3, 1.0), 3)
    ex = ex._replace(k=ex.q, v=ex.q)
    g = torch.randn(ex.q.shape, generator=torch.Generator().manual_seed(ex.seed), dtype=torch.float64)
    oracle = grad._reference(ex, bound, torch.float64, g)[0]
    x = ex.q.detach().clone().requires_grad_(True)
    layer_error = (torch.autograd.grad(bound(x, x, x, None), x, g.float())[0].double() - oracle).abs().max()
    plain = (grad._reference(ex, bound, torch.float32, g)[0].double() - oracle).abs().max()
    kernel = (grad._reference(ex, bound, torch.float32, g, kernel=True)[0].double() - oracle).abs().max()
    assert float(plain) == 0.0 and float(layer_error) > 0.0
    assert float(kernel) >= float(layer_error)
