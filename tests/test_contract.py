"""Every line of the reference module's contract, held against the float64 oracle."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given

from mha_verify.mha import MultiHeadAttention, multi_head, params_of
from mha_verify.mha.reference import same_precision
from mha_verify.mha.tolerance import compare
from mha_verify.properties.strategies.examples import attention_examples
from tests.conftest import seeded_mha


def _oracle_and_same(m: MultiHeadAttention, q, k, v, mask):
    ref, ref_w = multi_head(q, k, v, params_of(m), m.n_head, mask)
    same, same_w = same_precision(q, k, v, params_of(m), m.n_head, mask, dtype=q.dtype, oracle=ref)
    return ref, ref_w, same, same_w


@pytest.mark.parametrize("need_weights", [False, True], ids=["fast-path", "math-path"])
@given(ex=attention_examples())
def test_agrees_with_float64_oracle_on_cross_attention(need_weights: bool, ex) -> None:
    s = ex.sizes
    m = seeded_mha(s.d_model, s.n_head, seed=ex.seed)
    got = m(ex.q, ex.k, ex.v, ex.mask, need_weights=need_weights)
    out = got[0] if need_weights else got
    ref, ref_w, same, same_w = _oracle_and_same(m, ex.q, ex.k, ex.v, ex.mask)
    assert out.shape == (s.batch, s.lq, s.d_model)
    c = compare(out, ref, same, torch.float32)
    assert c.ok, f"{c} for {ex.describe()}"
    if need_weights:
        w = got[1]
        assert w.shape == (s.batch, s.n_head, s.lq, s.lk)
        cw = compare(w, ref_w, same_w, torch.float32)
        assert cw.ok, f"weights: {cw} for {ex.describe()}"


@pytest.mark.parametrize("convention", ["bool", "float"])
@pytest.mark.parametrize("need_weights", [False, True], ids=["fast-path", "math-path"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_fully_masked_rows_give_zero_weights_and_w_o_bias(convention: str, need_weights: bool, bias: bool) -> None:
    m = seeded_mha(8, 2, bias=bias)
    q = torch.randn(2, 3, 8, requires_grad=True)
    k = torch.randn(2, 4, 8, requires_grad=True)
    v = torch.randn(2, 4, 8, requires_grad=True)
    keep = torch.rand(2, 1, 3, 4) < 0.7
    keep[..., 0] = True
    keep[0, :, 1] = False  # item 0, query 1: every key masked
    keep[1] = False  # item 1: every query of the item sees no key
    mask = keep if convention == "bool" else torch.zeros(keep.shape).masked_fill(~keep, -math.inf)
    got = m(q, k, v, mask, need_weights=need_weights)
    out = got[0] if need_weights else got
    expected_row = m.w_o.bias if bias else torch.zeros(8)
    assert torch.isfinite(out).all(), "fully masked rows gave NaN/inf"
    torch.testing.assert_close(out[0, 1], expected_row, rtol=0, atol=0)
    torch.testing.assert_close(out[1], expected_row.expand(3, 8), rtol=0, atol=0)
    if need_weights:
        assert (got[1][0, :, 1] == 0).all() and (got[1][1] == 0).all()
    out.sum().backward()
    for name, t in (("q", q), ("k", k), ("v", v)):
        assert t.grad is not None and torch.isfinite(t.grad).all(), f"{name}.grad is not finite"


@pytest.mark.parametrize(
    "shape", [(3, 5), (1, 1, 3, 5), (2, 1, 3, 5), (2, 4, 3, 5), (5,), (1, 5), (2, 1, 1, 5)],
    ids=lambda s: "x".join(map(str, s)),
)
def test_mask_shapes_that_broadcast_are_accepted_and_applied(shape: tuple[int, ...]) -> None:
    m = seeded_mha(8, 4)
    q, k, v = torch.randn(2, 3, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    gen = torch.Generator().manual_seed(1)
    mask = torch.rand(shape, generator=gen) < 0.6
    full = mask.expand(2, 4, 3, 5)
    for need_weights in (False, True):
        got = m(q, k, v, mask, need_weights=need_weights)
        out = got[0] if need_weights else got
        ref, _, same, _ = _oracle_and_same(m, q, k, v, full)
        c = compare(out, ref, same, torch.float32)
        assert c.ok, f"mask shape {shape}: {c}"


def test_dropout_acts_on_weights_in_training_only() -> None:
    m = seeded_mha(16, 2, dropout=0.5)
    q, k, v = torch.randn(2, 6, 16), torch.randn(2, 7, 16), torch.randn(2, 7, 16)
    m.eval()
    out_eval, w_eval = m(q, k, v, need_weights=True)
    torch.testing.assert_close(m(q, k, v), out_eval, rtol=1e-5, atol=1e-6)
    m.train()
    torch.manual_seed(3)
    _, w_train = m(q, k, v, need_weights=True)
    dropped = w_train == 0
    assert dropped.any() and not dropped.all(), "dropout 0.5 in training zeroed no weight or every weight"
    # kept weights are scaled by 1 / (1 - p)
    torch.testing.assert_close(w_train[~dropped], w_eval[~dropped] * 2.0, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(m(q, k, v), out_eval), "fast path ignored dropout in training mode"


def test_dropout_zero_in_training_equals_eval() -> None:
    m = seeded_mha(16, 4, dropout=0.0)
    q, k, v = torch.randn(2, 3, 16), torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    expected = m.eval()(q, k, v)
    m.train()
    torch.testing.assert_close(m(q, k, v), expected, rtol=0, atol=0)


def test_bias_switch_removes_every_bias() -> None:
    m = MultiHeadAttention(8, 2, bias=False)
    assert all(lin.bias is None for lin in (m.w_q, m.w_k, m.w_v, m.w_o))
    assert sorted(n for n, _ in m.named_parameters()) == ["w_k.weight", "w_o.weight", "w_q.weight", "w_v.weight"]


def test_state_dict_matches_seed_000_and_so_does_the_output() -> None:
    from tests.fixtures.seed_000 import MultiHeadAttention as Seed000

    ours = seeded_mha(12, 3)
    seed = Seed000(12, 3, dropout=0.0).eval()
    seed.load_state_dict(ours.state_dict())
    q, k, v = torch.randn(2, 4, 12), torch.randn(2, 6, 12), torch.randn(2, 6, 12)
    mask = torch.ones(2, 1, 4, 6, dtype=torch.bool).tril(diagonal=2)
    torch.testing.assert_close(ours(q, k, v, mask), seed(q, k, v, mask), rtol=1e-5, atol=1e-6)
    # where the seed is wrong, we are not: a fully masked row
    mask[0, 0, 0] = False
    assert torch.isnan(seed(q, k, v, mask)).any()
    assert torch.isfinite(ours(q, k, v, mask)).all()


def test_float64_layer_runs_in_float64() -> None:
    m = seeded_mha(8, 2).double()
    q, k, v = (torch.randn(1, 3, 8, dtype=torch.float64) for _ in range(3))
    out, w = m(q, k, v, need_weights=True)
    assert out.dtype == w.dtype == torch.float64
    ref, _ = multi_head(q, k, v, params_of(m), 2)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
