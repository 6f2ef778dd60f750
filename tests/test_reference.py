"""The pure reference formulas held against each other and against torch's own modules."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import given

from mha_verify.mha.reference import MHAParams, attention, head_slices, multi_head, per_head
from mha_verify.properties.strategies.examples import attention_examples


def _random_params(d: int, gen: torch.Generator, bias: bool = True) -> MHAParams:
    def w() -> torch.Tensor:
        return torch.randn(d, d, generator=gen, dtype=torch.float64) / d**0.5

    def b() -> torch.Tensor | None:
        return torch.randn(d, generator=gen, dtype=torch.float64) if bias else None

    return MHAParams(w(), b(), w(), b(), w(), b(), w(), b())


@given(ex=attention_examples())
def test_per_head_formulation_equals_packed(ex) -> None:
    s = ex.sizes
    p = _random_params(s.d_model, torch.Generator().manual_seed(ex.seed), bias=ex.seed % 2 == 0)
    packed, _ = multi_head(ex.q, ex.k, ex.v, p, s.n_head, ex.mask)
    heads = per_head(ex.q, ex.k, ex.v, p, s.n_head, ex.mask)
    torch.testing.assert_close(heads, packed, rtol=1e-10, atol=1e-10 * (1 + float(packed.abs().max())))


@given(ex=attention_examples())
def test_attention_formula_matches_torch_sdpa_in_float64(ex) -> None:
    s = ex.sizes
    gen = torch.Generator().manual_seed(ex.seed)
    q, k, v = (torch.randn(s.batch, s.n_head, n, s.head_dim, generator=gen, dtype=torch.float64)
               for n in (s.lq, s.lk, s.lk))
    mask = None if ex.mask is None else (ex.mask if ex.mask.dtype == torch.bool else ex.mask.double())
    ours, w = attention(q, k, v, mask)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)
    assert torch.isfinite(w).all()


def test_head_slices_are_rows_of_the_packed_weights() -> None:
    p = _random_params(6, torch.Generator().manual_seed(0))
    parts = head_slices(p, 3)
    torch.testing.assert_close(torch.cat([h.w_q for h in parts]), p.w_q, rtol=0, atol=0)
    assert parts[1].w_k.shape == (2, 6)
    torch.testing.assert_close(parts[2].b_v, p.b_v[4:6], rtol=0, atol=0)


def test_multi_head_matches_torch_multihead_attention() -> None:
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(12, 3, batch_first=True, dtype=torch.float64).eval()
    w_q, w_k, w_v = ref.in_proj_weight.chunk(3)
    b_q, b_k, b_v = ref.in_proj_bias.chunk(3)
    p = MHAParams(w_q, b_q, w_k, b_k, w_v, b_v, ref.out_proj.weight, ref.out_proj.bias)
    q, k, v = (torch.randn(2, n, 12, dtype=torch.float64) for n in (3, 5, 5))
    keep = torch.rand(3, 5) < 0.7
    keep[:, 0] = True
    expected, expected_w = ref(q, k, v, attn_mask=~keep, average_attn_weights=False)  # torch: True = not allowed
    out, w = multi_head(q, k, v, p, 3, keep)
    torch.testing.assert_close(out, expected.detach(), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(w, expected_w.detach(), rtol=1e-10, atol=1e-10)


def test_kernel_draw_is_the_kernel_beside_a_fully_masked_item() -> None:
    """One fully masked batch item once turned the whole kernel draw into the plain formula, and
    grad_agreement failed the reference (SDPA's CPU flash backward) on the other items: the
    draw must be the kernel's, output and gradient, on every row that has a key."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(4, 1, 2, 2, generator=g) for _ in range(3))
    q[2] *= 100.0  # a saturated softmax: the kernel's backward rounds where the formula is exact
    bias = torch.zeros(4, 1, 1, 2)
    bias[2, ..., 1] = -1500.0
    bias[3] = float("-inf")  # item 3: no key at all
    v.requires_grad_(True)
    got, _ = attention(q, k, v, bias, kernel=True)
    (dv_got,) = torch.autograd.grad(got[:3].sum(), v)
    vk = v.detach().clone().requires_grad_(True)
    fused = F.scaled_dot_product_attention(q[:3], k[:3], vk[:3], attn_mask=bias[:3])
    (dv_fused,) = torch.autograd.grad(fused.sum(), vk)
    assert torch.equal(got[:3], fused) and torch.equal(dv_got[:3], dv_fused[:3])
    assert torch.equal(got[3], torch.zeros_like(got[3])) and bool(torch.isfinite(dv_got).all())


def test_uniform_rows_under_causality_spread_over_the_keys_it_leaves() -> None:
    """"uniform_visible" is what masking with finfo.min computes under a causal or window mask of
    finfo.min too: a row whose every key the caller masks spreads its weights over the keys
    causality leaves (finfo.min twice overflows to -inf), held against a plain softmax of those
    additive masks."""
    from mha_verify.mha.scoring import Scoring

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    keep = torch.rand(2, 5, 5, generator=g) < 0.6
    keep |= torch.eye(5, dtype=torch.bool)  # each row keeps a key that causality and the window leave
    keep[0, 3] = False  # row 3 of item 0: every key masked by the caller
    keep[1, 4] = False
    low = torch.finfo(torch.float64).min
    soft = torch.zeros(2, 5, 5, dtype=torch.float64).masked_fill(~keep, low)
    i, j = torch.arange(5)[:, None], torch.arange(5)[None, :]
    for hard, scoring in ((j <= i, Scoring()), ((j <= i) & (j > i - 3), Scoring(window=3))):
        hard_add = torch.zeros(5, 5, dtype=torch.float64).masked_fill(~hard, low)
        scores = q @ k.transpose(-1, -2) / 2.0 + hard_add + soft  # finfo.min + finfo.min = -inf
        expected = scores.softmax(dim=-1)
        _, weights = attention(q, k, v, keep, causal=True, fully_masked="uniform_visible", scoring=scoring)
        torch.testing.assert_close(weights, expected, rtol=1e-12, atol=1e-12)
        assert torch.equal(expected[0, 3], hard[3].double() / hard[3].sum())  # spread over the keys left, not over all
        assert torch.equal(expected[1, 4], hard[4].double() / hard[4].sum())
