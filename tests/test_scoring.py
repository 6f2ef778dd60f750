"""Scores beyond q k^T / sqrt(Hd) (``mha.scoring``): QK-norm, soft-capping, ALiBi, a layer's own
position-bias table and sliding windows, applied by the oracle, each read or declared; each
convention's one-bug twin fails (``tests/fixtures/scored_layers.py``, plain torch)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mha_verify.mha.reference import MHAParams, multi_head, per_head
from mha_verify.mha.scoring import Norm, PositionBias, Scoring, alibi_slopes
from mha_verify.properties.adapters.qk_norm import read_norm
from mha_verify.properties.engine.profiles import PROFILES
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.protocol import Conventions, TargetError
from mha_verify.properties.targets.eager import load_target
from tests.conftest import assert_verdict
from tests.fixtures import scored_layers

FIXTURE = "tests/fixtures/scored_layers.py:"
QUICK = PROFILES["quick"]


def test_norms_are_torchs_rmsnorm_and_layernorm() -> None:
    x = torch.randn(2, 3, 4, 8, dtype=torch.float64)
    w, b = torch.rand(8, dtype=torch.float64) + 0.5, torch.randn(8, dtype=torch.float64)
    rms = nn.RMSNorm(8, eps=1e-6, dtype=torch.float64)
    with torch.no_grad():
        rms.weight.copy_(w)
    assert torch.allclose(Norm("rms", "head", 1e-6, w).apply(x), rms(x))
    assert torch.allclose(Norm("layer", "head", 1e-5, w, b).apply(x), F.layer_norm(x, (8,), w, b, eps=1e-5))
    assert torch.allclose(Norm("rms", "head", 1e-6, w, offset=1.0).apply(x), rms(x) / w * (1 + w))
    assert torch.allclose(Norm("l2", "head", 0.0).apply(x), F.normalize(x, dim=-1))  # nGPT's unit sphere
    rows = torch.randn(4, 8, dtype=torch.float64)  # one row of weights per head: (H, Hd) on (B, H, L, Hd)
    heads = x.transpose(1, 2)  # (2, 4 heads, 3, 8)
    per_row = Norm("rms", "head", 0.0, rows).apply(heads)[:, 2]
    assert torch.allclose(per_row, Norm("rms", "head", 0.0, rows[2]).apply(heads[:, 2]))
    assert torch.allclose(per_row, Norm("rms", "head", 0.0, rows).apply(heads[:, 2], head=2))
    with pytest.raises(ValueError, match="norm kind must be one of"):
        Norm("batch", "head", 1e-6)


def test_alibi_slopes_are_the_papers_and_blooms() -> None:
    assert alibi_slopes(8) == [2.0 ** -i for i in range(1, 9)]
    for n in range(1, 20):  # against the fixture's own transcription (power-of-two start, interleaving)
        assert torch.allclose(torch.tensor(alibi_slopes(n), dtype=torch.float64), scored_layers._slopes(n).double()), n
    bias = PositionBias(alibi=True).heads(2, 3, 4, torch.float64)  # (H, Lq, Lk): slope * (j - i)
    assert bias[0, 2, 0] == -2 * 2.0 ** -4 and bias[1, 0, 3] == 3 * 2.0 ** -8


def test_windows_are_hfs_sliding_window_overlays() -> None:
    keep = Scoring(window=3).keep(6, 6, causal=True)
    assert keep is not None
    for i in range(6):
        assert [j for j in range(6) if keep[i, j]] == [j for j in range(6) if i - 3 < j <= i]
    both = Scoring(window=2).keep(4, 5, causal=False)
    assert both is not None and both.tolist()[1] == [True, True, True, False, False]


def test_softcap_and_window_change_the_oracle_as_written() -> None:
    torch.manual_seed(0)
    d, h = 8, 2
    p = [torch.randn(d, d, dtype=torch.float64) for _ in range(4)]
    params = MHAParams(p[0], None, p[1], None, p[2], None, p[3], None)
    x = torch.randn(1, 5, d, dtype=torch.float64) * 3
    _, w = multi_head(x, x, x, params, h, scoring=Scoring(softcap=0.5))
    q = (x @ p[0].T).view(1, 5, h, 4).transpose(1, 2)
    k = (x @ p[1].T).view(1, 5, h, 4).transpose(1, 2)
    capped = torch.tanh(q @ k.transpose(-2, -1) / 2 / 0.5) * 0.5
    assert torch.allclose(w, capped.softmax(-1))
    _, windowed = multi_head(x, x, x, params, h, causal=True, scoring=Scoring(window=2))
    assert bool((windowed[..., 4, :3] == 0).all()) and bool((windowed[..., 4, 3:] > 0).all())
    # the per-head formulation agrees under every per-head convention at once
    scoring = Scoring(softcap=2.0, window=3, bias=PositionBias(alibi=True),
                      q_norm=Norm("rms", "head", 1e-6, torch.rand(4, dtype=torch.float64)))
    whole, _ = multi_head(x, x, x, params, h, causal=True, scoring=scoring)
    assert torch.allclose(whole, per_head(x, x, x, params, h, causal=True, scoring=scoring))
    with pytest.raises(ValueError, match="normalized over all heads"):
        per_head(x, x, x, params, h, scoring=Scoring(q_norm=Norm("rms", "all", 1e-6)))


def test_conventions_declare_softcap_window_alibi_and_refuse_bad_values() -> None:
    conv = Conventions().declare({"softcap": 30, "window": 4, "alibi": True})
    assert conv.softcap == 30.0 and conv.window == 4 and conv.position_bias is not None
    assert "logits soft-capped at 30; ALiBi position bias; sliding window of 4 keys" in conv.describe()
    for key, bad in (("softcap", -1.0), ("softcap", math.inf), ("window", 0), ("alibi", "yes")):
        with pytest.raises(ValueError, match=key):
            Conventions().declare({key: bad})


def test_a_norm_of_another_form_is_refused_naming_it() -> None:
    class Halved(nn.Module):  # x / 2: neither RMSNorm nor LayerNorm
        eps = 1e-6

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x / 2

    with pytest.raises(ValueError, match=r"Layer.q_norm \(Halved\) computes neither RMSNorm, LayerNorm nor an L2"):
        read_norm(Halved(), "Layer.q_norm", 2, 4)
    with pytest.raises(ValueError, match=r"has a weight of shape \(6,\): neither one head \(4\) nor all 2 heads \(8\)"):
        read_norm(nn.RMSNorm(6), "Layer.q_norm", 2, 4)


@pytest.mark.parametrize(("layer", "reads"), [
    ("QKNormPerHead", "q RMSNorm per head, eps 1e-06; k RMSNorm per head"),
    ("QKNormAllHeads", "q LayerNorm over all heads, eps 1e-05"),
    ("GemmaQKNorm", "q RMSNorm per head, x (1 + w)"),
    ("ValueNormed", "v RMSNorm per head, eps 1e-06"),
    ("RelativeBias", "position bias from RelativeBias.compute_bias"),
])
def test_qk_norms_and_bias_tables_are_read_from_the_layer(layer: str, reads: str) -> None:
    assert reads in load_target(FIXTURE + layer).build(8, 2).conventions.describe()


@pytest.mark.deep
@pytest.mark.parametrize(("layer", "verdict"), [
    ("QKNormPerHead", "pass"), ("QKNormKeyNormSkipped", "fail"),
    ("QKNormAllHeads", "pass"), ("QKNormAllHeadsSplitFirst", "fail"),
    ("GemmaQKNorm", "pass"), ("ValueNormed", "pass"), ("ValueNormSkipped", "fail"),
    ("SoftCapped", "pass"), ("SoftCapBeforeScale", "fail"),
    ("Alibi", "pass"), ("AlibiSignFlipped", "fail"),
    ("RelativeBias", "pass"), ("RelativeBiasShifted", "fail"),
    ("Windowed", "pass"), ("WindowOffByOne", "fail"),
])
def test_each_convention_is_verified_and_its_one_bug_twin_fails(layer: str, verdict: str) -> None:
    result = run_property(all_properties()["oracle_agreement"], load_target(FIXTURE + layer), settings=QUICK, seed=0)
    assert_verdict(result, verdict, 2)


@pytest.mark.deep
@pytest.mark.parametrize(("layer", "verdict"), [("Windowed", "pass"), ("WindowOffByOne", "fail")])
def test_window_locality_sees_a_window_one_key_too_wide(layer: str, verdict: str) -> None:
    result = run_property(all_properties()["window_locality"], load_target(FIXTURE + layer), settings=QUICK, seed=0)
    assert_verdict(result, verdict, 2)
    if verdict == "fail":
        assert "rows outside key" in str(result.reason)


def test_window_locality_is_na_without_a_window_and_heads_coupled_by_a_norm_skip_head_split() -> None:
    result = run_property(all_properties()["window_locality"], load_target(FIXTURE + "Alibi"), settings=QUICK)
    assert result.verdict == "n/a" and "no sliding window" in str(result.reason)
    result = run_property(all_properties()["head_split"], load_target(FIXTURE + "QKNormAllHeads"), settings=QUICK)
    assert result.verdict == "n/a" and "normalized over all heads" in str(result.reason)
    result = run_property(all_properties()["key_permutation"], load_target(FIXTURE + "Alibi"), settings=QUICK)
    assert result.verdict == "n/a" and "position biases make the scores depend on positions" in str(result.reason)


@pytest.mark.deep
def test_a_layer_with_a_norm_it_never_applies_fails_instead_of_being_refused() -> None:
    # kv_layers.QKNormed holds a q_norm its forward ignores: the oracle applies it, the layer does not
    target = load_target("tests/fixtures/kv_layers.py:QKNormed")
    assert "q LayerNorm per head" in target.build(8, 2).conventions.describe()
    result = run_property(all_properties()["oracle_agreement"], target, settings=QUICK, seed=0)
    assert result.verdict == "fail", result


def test_a_softcapped_layers_grad_and_head_split_agree() -> None:
    for name in ("grad_agreement", "head_split"):
        result = run_property(all_properties()[name], load_target(FIXTURE + "SoftCapped"), settings=QUICK, seed=0)
        assert result.verdict == "pass" and result.examples >= 5, result


def test_a_qk_norm_layer_missing_a_form_is_a_usage_error() -> None:
    with pytest.raises(TargetError, match="computes neither RMSNorm, LayerNorm nor an L2 norm"):
        load_target("tests/fixtures/scored_layers.py:UnknownNorm")
