"""A bug is never a convention: a transformers layer is held to the scale its library declares (its config
and its family's documented scale, adapters/spec.py), not to the one its own code states. A regression put
into the library's own class (its __init__ stating another scale, as an edited modeling file would) fails
the oracle naming both; the class as shipped passes. Skipped with the reason without transformers."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import pytest
from torch import nn

from mha_verify.properties.engine.profiles import PROFILES
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.targets.eager import load_target
from tests.conftest import assert_verdict

pytestmark = pytest.mark.deep  # the ecosystem libraries (tox -e deep, tox -e ecosystem)

HF = "transformers.models.{0}.modeling_{0}:{1}"


def _stating(cls: type[nn.Module], scaling: Callable[[nn.Module], float]) -> Callable[..., None]:
    """``cls.__init__``, then ``self.scaling = scaling(self)``: the one-line regression."""
    init = cls.__init__

    def regressed(self: nn.Module, *args: object, **kwargs: object) -> None:
        init(self, *args, **kwargs)
        self.scaling = scaling(self)

    return regressed


@pytest.mark.parametrize(("model", "cls", "scaling", "says"), [
    # head_dim ** -1 for head_dim ** -0.5: a scale read from its attribute passed as "its convention"
    ("llama", "LlamaAttention", lambda m: m.head_dim ** -1,
     "its code scales scores by 0.125 (softmax scale 0.125 from its scaling attribute) where its spec says "
     "1/sqrt(head_dim 8) = 0.353553"),
    # Gemma 2's query_pre_attn_scalar ignored: 1/sqrt(head_dim) where its config says 1/sqrt(256)
    ("gemma2", "Gemma2Attention", lambda m: m.head_dim ** -0.5,
     "where its spec says 1/sqrt(256) = 0.0625 from its config's query_pre_attn_scalar"),
    # T5 scaling after all: its family's scores are unscaled
    ("t5", "T5Attention", lambda m: m.key_value_proj_dim ** -0.5,
     "where its spec says 1, its family's documented scale"),
])
def test_a_scale_its_code_states_against_its_spec_fails_naming_both(
        monkeypatch: pytest.MonkeyPatch, model: str, cls: str, scaling: Callable[[nn.Module], float],
        says: str) -> None:
    pytest.importorskip("transformers")
    klass = getattr(importlib.import_module(f"transformers.models.{model}.modeling_{model}"), cls)
    shipped = load_target(HF.format(model, cls))
    assert "departs from its spec" not in shipped.build(32, 4).conventions.describe()
    monkeypatch.setattr(klass, "__init__", _stating(klass, scaling))
    regressed = load_target(HF.format(model, cls))
    assert says in regressed.build(32, 4).conventions.describe()
    result = run_property(all_properties()["oracle_agreement"], regressed, settings=PROFILES["quick"], seed=0)
    assert_verdict(result, "fail", 1)
    assert result.reason is not None and "its code departs from its spec: its code scales scores by" in result.reason


@pytest.mark.parametrize(("model", "cls"), [("llama", "LlamaAttention"), ("gemma2", "Gemma2Attention")])
def test_the_shipped_class_agrees_with_its_spec_and_passes(model: str, cls: str) -> None:
    pytest.importorskip("transformers")
    target = load_target(HF.format(model, cls))
    assert "departs from its spec" not in target.build(32, 4).conventions.describe()
    result = run_property(all_properties()["oracle_agreement"], target, settings=PROFILES["quick"], seed=0)
    assert_verdict(result, "pass", 10)


def test_the_traced_graph_shows_the_departure_the_spec_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the regressed layer computes, read from a trace of one call (properties/graph), is the scale
    its code states, not its spec's: the departure is in the computation, not only in an attribute."""
    pytest.importorskip("transformers")
    import torch

    from mha_verify.properties.graph import facts
    from mha_verify.properties.graph.trace import trace_call

    klass = importlib.import_module("transformers.models.llama.modeling_llama").LlamaAttention
    monkeypatch.setattr(klass, "__init__", _stating(klass, lambda m: m.head_dim ** -1))
    bound = load_target(HF.format("llama", "LlamaAttention")).build(32, 4)
    x = torch.randn(2, 5, 32)
    trace = trace_call(lambda q, k, v: bound(q, k, v, None), (x, x, x), owner=bound.module)
    assert [f.value for f in facts.attention_scales(trace)] == [pytest.approx(8 ** -1)]
