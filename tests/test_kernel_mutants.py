"""The kernel-depth mutants of tests/mutants.py (backward, strides, output dtype, inputs written in
place, the float16 range, padding sides): each is exact in its plain condition, measured against
the float64 oracle, and fails its property under its trigger through a genuine violation."""

from __future__ import annotations

import math

import pytest
import torch

from mha_verify.mha import MultiHeadAttention
from mha_verify.mha.reference import multi_head, multi_head_graph
from mha_verify.properties.adapters.registry import find_adapter
from mha_verify.properties.engine import profiles
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.strategies.examples import make_example
from mha_verify.properties.strategies.masks import MaskSpec
from mha_verify.properties.strategies.size_cases import Sizes
from mha_verify.properties.targets.eager import Target
from tests.mutants import (
    KERNEL_MUTANTS,
    AssumesRightPadding,
    BackwardPastFirstKeyBlock,
    IgnoresStrides,
    ReturnsFloat64,
    ScalesQueryInPlace,
    UnscaledScoresInHalf,
)

SETTINGS = profiles.PROFILES[profiles.profile_name()]


def _module(cls: type[MultiHeadAttention], d_model: int = 16, n_head: int = 2,
            dtype: torch.dtype = torch.float32) -> MultiHeadAttention:
    torch.manual_seed(0)
    return cls(d_model, n_head, 0.0).eval().to(dtype)


def _inputs(batch: int, lq: int, lk: int, d: int, scale: float = 1.0, dtype: torch.dtype = torch.float32,
            seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return tuple((torch.randn(batch, n, d, generator=gen, dtype=torch.float64) * scale).to(dtype)
                 for n in (lq, lk, lk))  # type: ignore[return-value]


def _relative(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).abs().max() / ref.abs().max())


def _forward_error(module: MultiHeadAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   mask: torch.Tensor | None = None) -> float:
    ref, _ = multi_head(q, k, v, find_adapter(module).params(module), module.n_head, mask)
    with torch.no_grad():
        return _relative(module(q, k, v, mask), ref)


def _grad_error(module: MultiHeadAttention, lk: int) -> float:
    """max relative error of dq, dk, dv against float64 autograd of the formula."""
    q, k, v = _inputs(2, 5, lk, module.d_model)
    g = torch.randn(2, 5, module.d_model, generator=torch.Generator().manual_seed(1))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    got = torch.autograd.grad(module(*leaves), leaves, g)
    params = find_adapter(module).params(module).to(torch.float64)
    ref_leaves = [t.double().requires_grad_(True) for t in (q, k, v)]
    ref = torch.autograd.grad(multi_head_graph(*ref_leaves, params, module.n_head), ref_leaves, g.double())
    return max(_relative(a, b) for a, b in zip(got, ref, strict=True))


def test_backward_mutant_is_exact_forward_everywhere_and_backward_within_one_key_block() -> None:
    module = _module(BackwardPastFirstKeyBlock)
    assert _forward_error(module, *_inputs(2, 5, 40, 16)) < 1e-5
    assert _grad_error(module, 32) < 1e-5
    assert _grad_error(module, 40) > 1e-3


def test_stride_blind_mutant_is_exact_on_contiguous_inputs_and_wrong_on_views() -> None:
    module = _module(IgnoresStrides)
    q, k, v = _inputs(3, 6, 6, 16)
    assert _forward_error(module, q, k, v) < 1e-5
    view = make_example(Sizes(3, 6, 6, 16, 2), MaskSpec("none", "BHLL", "bool", 0), (1.0,) * 3, 0,
                        layout="transposed")
    assert not view.q.is_contiguous()
    assert _forward_error(module, view.q, view.k, view.v) > 1e-2


def test_float64_output_mutant_has_exact_values() -> None:
    q, k, v = _inputs(2, 5, 7, 16)
    module = _module(ReturnsFloat64)
    with torch.no_grad():
        assert module(q, k, v).dtype == torch.float64
    assert _forward_error(module, q, k, v) < 1e-5


def test_in_place_mutant_has_an_exact_output_and_changes_its_input() -> None:
    q, k, v = _inputs(2, 5, 7, 16)
    before = q.clone()
    assert _forward_error(_module(ScalesQueryInPlace), q, k, v) < 1e-5
    assert not torch.equal(q, before)


def test_unscaled_scores_are_exact_in_float32_and_overflow_float16_where_prescaled_ones_do_not() -> None:
    assert _forward_error(_module(UnscaledScoresInHalf, 256, 2), *_inputs(2, 8, 8, 256, 100.0)) < 1e-5
    q, k, v = _inputs(2, 8, 8, 256, 100.0, torch.float16)  # Hd = 128, magnitude 100
    for cls, finite in ((UnscaledScoresInHalf, False), (MultiHeadAttention, True)):
        with torch.no_grad():
            out = _module(cls, 256, 2, torch.float16)(q, k, v)
        assert bool(torch.isfinite(out).all()) is finite, cls.__name__


def test_right_padding_mutant_is_exact_for_right_padding_and_wrong_for_left_padding() -> None:
    q, k, v = _inputs(1, 4, 9, 16)
    right = torch.arange(9).view(1, 1, 1, 9) < 6
    left = right.flip(-1)
    module = _module(AssumesRightPadding)
    assert _forward_error(module, q, k, v, right) < 1e-5
    assert _forward_error(module, q, k, v, left) > 1e-2


@pytest.mark.serial
@pytest.mark.deep  # one gate run per mutant (tox -e deep)
@pytest.mark.parametrize("mutant", list(KERNEL_MUTANTS))
def test_kernel_mutant_is_caught_through_a_genuine_violation(mutant: str) -> None:
    cls, expected, dtype, _ = KERNEL_MUTANTS[mutant]
    result = run_property(all_properties()[expected], Target(f"tests.mutants:{cls.__name__}", cls),
                          settings=SETTINGS, dtype=dtype)
    assert result.verdict == "fail", f"{mutant} escaped {expected}: {result}"
    assert result.reason and not result.reason.startswith("the target raised"), result.reason
    assert result.worst_error is not None and result.allowed is not None
    assert result.worst_error > result.allowed or math.isinf(result.worst_error), result
