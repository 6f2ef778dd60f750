"""Half precision at its real range: the same-precision reference scales q before the product, so it
stays finite in float16 where the float64 oracle is; finite_large_inputs runs in float16; a near
tie of bfloat16 scores is within the rounding bound, not a failure of a correct layer."""

from __future__ import annotations

import torch

from mha_verify.mha.reference import MHAParams, multi_head, rounding_bound, same_precision
from mha_verify.properties.engine import profiles
from mha_verify.properties.engine.call_path import Checked
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.strategies.examples import make_example
from mha_verify.properties.strategies.masks import MaskSpec
from mha_verify.properties.strategies.size_cases import Sizes
from mha_verify.properties.targets.eager import load_target


def _params(d: int, seed: int = 0) -> MHAParams:
    gen = torch.Generator().manual_seed(seed)
    w = [torch.empty(d, d).uniform_(-d ** -0.5, d ** -0.5, generator=gen) for _ in range(4)]
    return MHAParams(w[0], None, w[1], None, w[2], None, w[3], None)


def test_the_float16_reference_is_finite_at_magnitude_80_and_head_width_128() -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 64, 256, generator=gen) * 80 for _ in range(3))
    params = _params(256)
    oracle, _ = multi_head(q, k, v, params, 2)
    same, _ = same_precision(q.half(), k.half(), v.half(), params, 2, dtype=torch.float16, oracle=oracle)
    assert bool(torch.isfinite(oracle).all())
    assert bool(torch.isfinite(same).all())
    # the unscaled product (q k^T) of these inputs leaves float16's range
    qh = (q.double() @ params.w_q.double().T).view(1, 64, 2, 128).transpose(1, 2)
    kh = (k.double() @ params.w_k.double().T).view(1, 64, 2, 128).transpose(1, 2)
    assert float((qh @ kh.transpose(-2, -1)).abs().max()) > torch.finfo(torch.float16).max


def test_finite_large_inputs_runs_in_float16() -> None:
    result = run_property(all_properties()["finite_large_inputs"], load_target(), settings=profiles.PROFILES["quick"],
                          dtype=torch.float16)
    assert result.verdict == "pass" and result.examples > 0, result


def test_a_near_tie_of_bfloat16_scores_is_within_the_rounding_bound() -> None:
    """The counterexample the reference once failed at --dtype bfloat16: two scores 6.5 apart near
    3385, where bfloat16 scores are 16 apart; the reference gave 0.5 / 0.5, the float64 oracle
    0.9985 / 0.0015."""
    ex = make_example(Sizes(3, 4, 19, 7, 1), MaskSpec("none", "BHLL", "bool", 0), (100.0, 1.0, 1.0), 7919,
                      torch.bfloat16)
    bound = Checked(load_target().build(7, 1, seed=7919, dtype=torch.bfloat16))
    _, moved = rounding_bound(ex.q, ex.k, ex.v, bound.params(), 1, dtype=torch.bfloat16)
    assert float(moved[0, 0, 3].max()) >= 0.49  # the tied pair may swap half the row's weight
    assert all_properties()["oracle_agreement"].check(bound, ex).checked


def test_the_rounding_bound_is_negligible_for_small_scores() -> None:
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 5, 16, generator=gen) for _ in range(3))
    out, moved = rounding_bound(q, k, v, _params(16), 2, dtype=torch.float32)
    assert float(moved.max()) < 1e-6 and float(out.max()) < 1e-5


def _identity(d: int) -> MHAParams:
    eye = torch.eye(d, dtype=torch.float64)
    return MHAParams(eye, None, eye, None, eye, None, eye, None)


def test_a_near_tie_at_scores_of_1e5_may_swap_the_whole_row() -> None:
    """Scores 1e5 and 1e5 - 7 in bfloat16 (delta ~ 1.6e3, past exp's range): either key may take
    nearly all the weight. The bound once subtracted exp(2 delta) from exp(...) (inf - inf), and the
    NaN, zeroed, allowed the leading key no move at all (a false FAIL of the reference at bfloat16,
    weights 0.5 / 0.5 against 0.9991 / 0.0009)."""
    q = torch.tensor([[[316.25, 0.0]]], dtype=torch.float64)  # (1, 1, 2); scores q.k / sqrt(2)
    k = torch.tensor([[[447.25, 0.0], [447.25 - 7 * 2 ** 0.5 / 316.25, 0.0]]], dtype=torch.float64)
    _, moved = rounding_bound(q, k, k, _identity(2), 1, dtype=torch.bfloat16)
    assert bool(torch.isfinite(moved).all())
    assert float(moved[0, 0, 0, 0]) > 0.99 and float(moved[0, 0, 0, 1]) > 0.99


def test_a_key_whose_float64_weight_underflows_can_still_be_lifted_by_rounding() -> None:
    """Scores 800 apart at 1e5: the second key's float64 weight is exactly 0 (e^-800), yet bfloat16
    scores there are ~400 apart per rounding, so a correct layer may give it weight; only the masked
    key may not move."""
    q = torch.tensor([[[316.25, 0.0]]], dtype=torch.float64)
    k = torch.tensor([[[447.25, 0.0], [447.25 - 800 * 2 ** 0.5 / 316.25, 0.0], [447.25, 0.0]]], dtype=torch.float64)
    keep = torch.tensor([[[[True, True, False]]]])
    _, moved = rounding_bound(q, k, k, _identity(2), 1, keep, dtype=torch.bfloat16)
    assert float(moved[0, 0, 0, 1]) > 0.99 and float(moved[0, 0, 0, 0]) > 0.99  # the leading key may lose it all
    assert float(moved[0, 0, 0, 2]) == 0.0
    _, in_float64 = rounding_bound(q, k, k, _identity(2), 1, keep, dtype=torch.float64)
    assert float(in_float64.max()) < 1e-9
