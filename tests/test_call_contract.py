"""The one call path checks the call contract on every call of every property: a layer exact in
its outputs that changes its inputs fails with that reason; autograd's None gradient is 0."""

from __future__ import annotations

import pytest
import torch

from mha_verify.mha.masks import causal_keep
from mha_verify.properties.engine import profiles
from mha_verify.properties.engine.call_path import Checked
from mha_verify.properties.engine.measure import Violation
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.protocol import NotApplicable
from mha_verify.properties.strategies.examples import AttnExample, make_example
from mha_verify.properties.strategies.masks import MaskSpec
from mha_verify.properties.strategies.size_cases import Sizes
from mha_verify.properties.targets.eager import load_target

FIXTURE = "tests/fixtures/contract_breakers.py:"


def test_a_layer_that_writes_into_its_input_fails_the_contract() -> None:
    result = run_property(all_properties()["oracle_agreement"], load_target(FIXTURE + "ScalesItsQueryInPlace"),
                          settings=profiles.PROFILES["quick"])
    assert result.verdict == "fail", result
    assert "changed its input q in place" in (result.reason or ""), result.reason


def test_the_reference_leaves_its_inputs_alone_through_the_call_path() -> None:
    checked = Checked(load_target().build(8, 2))
    q, k, v = (torch.randn(2, 3, 8) for _ in range(3))
    keep = causal_keep(3, 3)
    copies = [t.clone() for t in (q, k, v, keep)]
    checked(q, k, v, keep)
    assert all(torch.equal(a, b) for a, b in zip((q, k, v, keep), copies, strict=True))


def test_the_call_path_names_a_wrong_output_shape() -> None:
    class Truncating:
        def __init__(self) -> None:
            self.inner = load_target().build(8, 2)

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

        def __call__(self, q, k, v, mask=None):  # type: ignore[no-untyped-def]
            return self.inner(q, k, v, mask)[:, :-1]

    q = torch.randn(1, 4, 8)
    try:
        Checked(Truncating())(q, q, q)  # type: ignore[arg-type]
    except Violation as exc:
        assert "output shape (1, 3, 8), but should be (B, Lq, D) = (1, 4, 8)" in str(exc)
    else:
        raise AssertionError("a wrong output shape passed the call path")


def test_a_none_gradient_is_a_zero_gradient() -> None:
    """masked_grad_zero on an example whose every key is masked: the layer never touches k or v."""
    target = load_target(FIXTURE + "SkipsKeysOfAFullyMaskedItem")
    ex: AttnExample = make_example(Sizes(2, 3, 4, 8, 2), MaskSpec("fully_masked_item", "B11L", "bool", 0), (1.0, 1.0),
                                   0, torch.float32)
    ex = ex._replace(mask=torch.zeros(2, 1, 1, 4, dtype=torch.bool))
    measure = all_properties()["masked_grad_zero"].check(Checked(target.build(8, 2)), ex)
    assert measure.checked


def test_a_layer_that_raises_on_views_has_those_calls_unchecked_not_failed() -> None:
    checked = Checked(load_target(FIXTURE + "ViewsItsInput").build(8, 2))
    dense = make_example(Sizes(2, 3, 3, 8, 2), MaskSpec("none", "BHLL", "bool", 0), (1.0, 1.0), 0)
    view = make_example(Sizes(2, 3, 3, 8, 2), MaskSpec("none", "BHLL", "bool", 0), (1.0, 1.0), 0, layout="transposed")
    assert checked(dense.q, dense.k, dense.v).shape == (2, 3, 8)
    with pytest.raises(NotApplicable, match="raises on non-contiguous inputs and not on contiguous copies"):
        checked(view.q, view.k, view.v)
    result = run_property(all_properties()["layout_independence"], load_target(FIXTURE + "ViewsItsInput"),
                          settings=profiles.PROFILES["quick"])
    assert result.verdict == "warn" and "non-contiguous" in (result.reason or ""), result


@pytest.mark.deep
@pytest.mark.parametrize(("layer", "verdict"), [("ReturnsFloat32", "pass"), ("ReturnsFloat32Undeclared", "fail")])
def test_the_output_dtype_is_the_inputs_or_the_declared_one(layer: str, verdict: str) -> None:
    result = run_property(all_properties()["oracle_agreement"], load_target(FIXTURE + layer),
                          settings=profiles.PROFILES["quick"], dtype=torch.bfloat16)
    assert result.verdict == verdict, result
    if verdict == "fail":
        assert "output dtype float32 for bfloat16 inputs, but should be bfloat16" in (result.reason or ""), result
