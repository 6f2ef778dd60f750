"""Facts read from a traced call (properties/graph): the scale between the q·kᵀ product and the softmax,
however the code writes it, the softmax's axis, and SDPA's scale and causal flag, each quoting the layer's
source line; a step that leaves the scale unread says which op it is."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mha_verify.properties.graph import facts
from mha_verify.properties.graph.trace import Trace, trace_call
from mha_verify.properties.targets.eager import load_target


class _Heads(nn.Module):
    """q, k, v projections into 2 heads of 4; ``scores`` says how the attention is written."""

    def __init__(self, scores: str) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.scores = scores

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        q, k, v = (p(x).view(B, L, 2, 4).transpose(1, 2) for p in (self.q, self.k, self.v))
        if self.scores == "divided":
            w = (q @ k.transpose(-2, -1)) / math.sqrt(4)
        elif self.scores == "operands":  # a quarter power on each side, as some layers split the scale
            w = (q * 4 ** -0.25) @ (k * 4 ** -0.25).transpose(-2, -1)
        elif self.scores == "baddbmm":
            w = torch.baddbmm(torch.zeros(B * 2, L, L), q.reshape(B * 2, L, 4), k.reshape(B * 2, L, 4).transpose(1, 2),
                              beta=0.0, alpha=0.125).view(B, 2, L, L)
        elif self.scores == "masked":
            w = (q @ k.transpose(-2, -1)).masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), -1e9) * 0.25
        elif self.scores == "softcap":
            w = 30.0 * torch.tanh((q @ k.transpose(-2, -1)) * 0.5 / 30.0)
        elif self.scores == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3).transpose(1, 2).reshape(B, L, 8)
        else:
            raise ValueError(self.scores)
        return (w.softmax(-1) @ v).transpose(1, 2).reshape(B, L, 8)


def _trace(scores: str) -> Trace:
    layer = _Heads(scores).eval()
    return trace_call(layer, (torch.randn(2, 5, 8),), owner=layer)


@pytest.mark.parametrize(("scores", "scale", "line"), [
    ("divided", 0.5, "w = (q @ k.transpose(-2, -1)) / math.sqrt(4)"),
    ("operands", 0.5, "w = (q * 4 ** -0.25) @ (k * 4 ** -0.25).transpose(-2, -1)"),
    ("baddbmm", 0.125, "w = torch.baddbmm("),
    ("masked", 0.25, "masked_fill("),
])
def test_the_scale_is_read_however_the_code_writes_it(scores: str, scale: float, line: str) -> None:
    trace = _trace(scores)
    (softmax,) = facts.softmaxes(trace)
    fact = facts.score_scale(softmax)
    assert fact.value == pytest.approx(scale), fact
    assert any(line in said for said in fact.evidence), fact.evidence
    assert facts.softmax_axis(softmax).value == -1


def test_a_step_between_the_product_and_the_softmax_leaves_the_scale_unread_naming_it() -> None:
    (softmax,) = facts.softmaxes(_trace("softcap"))
    fact = facts.score_scale(softmax)
    assert fact.value is None and "tanh" in fact.evidence[0] and "torch.tanh" in fact.evidence[0], fact


def test_sdpa_says_its_scale_and_its_causal_flag() -> None:
    (call,) = facts.sdpa_calls(_trace("sdpa"))
    assert facts.sdpa_scale(call).value == pytest.approx(0.3)
    assert facts.sdpa_causal(call).value is True
    assert "scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)" in facts.sdpa_causal(call).evidence[0]


@pytest.mark.parametrize(("spec", "axis"), [("tests/fixtures/block_named_layers.py:SABlock", -1),
                                            ("tests/fixtures/block_named_layers.py:SABlockQueryAxis", -2)])
def test_a_softmax_over_the_queries_is_read_from_the_graph(spec: str, axis: int) -> None:
    bound = load_target(spec).build(8, 2)
    x = torch.randn(2, 5, 8)
    trace = trace_call(lambda q, k, v: bound(q, k, v, None), (x, x, x), owner=bound.module)
    (softmax,) = facts.softmaxes(trace)
    assert facts.softmax_axis(softmax).value == axis
    assert facts.score_scale(softmax).value == pytest.approx(0.5)


def test_the_reference_and_torchs_own_module_scale_by_one_over_root_head_width() -> None:
    for spec in ("mha_verify.mha:MultiHeadAttention", "torch.nn:MultiheadAttention"):
        bound = load_target(spec).build(8, 2)
        x = torch.randn(2, 5, 8)
        trace = trace_call(lambda q, k, v, b=bound: b(q, k, v, None), (x, x, x), owner=bound.module)
        assert [f.value for f in facts.attention_scales(trace)] == [pytest.approx(0.5)], spec


def test_a_call_neither_tracer_can_take_is_a_runtime_error_naming_both() -> None:
    def data_dependent(x: torch.Tensor) -> torch.Tensor:
        return x * 2 if bool(torch.equal(x, x.clone())) and x.sum().item() > -1e9 else x

    with pytest.raises(RuntimeError, match=r"torch\.export: .*make_fx: "):
        trace_call(data_dependent, (torch.randn(3),))
