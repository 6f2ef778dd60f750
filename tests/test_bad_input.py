"""Every bad input gets a ValueError/TypeError naming the argument and the values."""

from __future__ import annotations

import pytest
import torch

from mha_verify.mha import MultiHeadAttention
from tests.conftest import seeded_mha

D, H = 8, 2


def _qkv(B=2, Lq=3, Lk=4, Lv=4, Dq=D, Dk=D, Dv=D):
    return torch.randn(B, Lq, Dq), torch.randn(B, Lk, Dk), torch.randn(B, Lv, Dv)


BAD_CALLS = {
    "lk-ne-lv": (lambda: (*_qkv(Lv=5), None), ValueError, ["Lk=4", "Lv=5"]),
    "q-feature-size": (lambda: (*_qkv(Dq=6), None), ValueError, ["q", "d_model=8", "(2, 3, 6)"]),
    "k-feature-size": (lambda: (*_qkv(Dk=6), None), ValueError, ["k", "d_model=8"]),
    "v-feature-size": (lambda: (*_qkv(Dv=6), None), ValueError, ["v", "d_model=8"]),
    "rank-2": (lambda: (torch.randn(3, D), torch.randn(4, D), torch.randn(4, D), None), ValueError,
               ["rank 3", "q.shape=(3, 8)"]),
    "rank-4": (lambda: (torch.randn(1, 2, 3, D), *_qkv()[1:], None), ValueError, ["rank 3", "(1, 2, 3, 8)"]),
    "batch-differs": (lambda: (torch.randn(2, 3, D), torch.randn(3, 4, D), torch.randn(3, 4, D), None),
                      ValueError, ["batch", "q.shape=(2, 3, 8)", "k.shape=(3, 4, 8)"]),
    "mask-does-not-broadcast": (lambda: (*_qkv(), torch.ones(2, 1, 3, 5, dtype=torch.bool)), ValueError,
                                ["mask", "(2, 2, 3, 4)", "(2, 1, 3, 5)"]),
    "mask-rank-5": (lambda: (*_qkv(), torch.ones(1, 1, 1, 3, 4, dtype=torch.bool)), ValueError, ["mask", "rank"]),
    "mask-int": (lambda: (*_qkv(), torch.ones(3, 4, dtype=torch.int64)), TypeError, ["mask", "torch.int64",
                                                                                     "ambiguous"]),
    "mask-float-dtype": (lambda: (*_qkv(), torch.zeros(3, 4, dtype=torch.float64)), TypeError,
                         ["mask", "torch.float64", "torch.float32"]),
    "mask-nan": (lambda: (*_qkv(), torch.full((3, 4), float("nan"))), ValueError, ["mask", "NaN"]),
    "mask-not-tensor": (lambda: (*_qkv(), [[True] * 4] * 3), TypeError, ["mask", "list"]),
    "qkv-dtypes-differ": (lambda: (torch.randn(2, 3, D), torch.randn(2, 4, D).double(), torch.randn(2, 4, D), None),
                          TypeError, ["q=torch.float32", "k=torch.float64"]),
    "qkv-not-layer-dtype": (lambda: (*(t.double() for t in _qkv()), None), TypeError,
                            ["torch.float64", "torch.float32"]),
    "qkv-int": (lambda: (*(t.long() for t in _qkv()), None), TypeError, ["floating point", "torch.int64"]),
    "q-not-tensor": (lambda: ([[0.0] * D], *_qkv()[1:], None), TypeError, ["q", "list"]),
    "qkv-devices-differ": (lambda: (torch.randn(2, 3, D), torch.randn(2, 4, D, device="meta"),
                                    torch.randn(2, 4, D), None), ValueError, ["device", "meta", "cpu"]),
    "empty-sequence": (lambda: (*_qkv(Lk=0, Lv=0), None), ValueError, ["L >= 1", "k.shape=(2, 0, 8)"]),
}


@pytest.mark.parametrize("case", list(BAD_CALLS), ids=list(BAD_CALLS))
@pytest.mark.parametrize("need_weights", [False, True], ids=["fast-path", "math-path"])
def test_bad_call_raises_clear_error(case: str, need_weights: bool) -> None:
    make, exc, words = BAD_CALLS[case]
    m = seeded_mha(D, H)
    q, k, v, mask = make()
    with pytest.raises(exc) as info:
        m(q, k, v, mask, need_weights=need_weights)
    assert type(info.value) is exc, f"raised {type(info.value).__name__}, not {exc.__name__}"
    for word in words:
        assert word in str(info.value), f"message {str(info.value)!r} does not name {word!r}"


BAD_SIZES = {
    "not-divisible": ((10, 3), ValueError, ["d_model=10", "n_head=3"]),
    "d-model-zero": ((0, 1), ValueError, ["d_model", "positive", "d_model=0"]),
    "n-head-negative": ((8, -2), ValueError, ["n_head", "n_head=-2"]),
    "d-model-float": ((8.0, 2), TypeError, ["d_model", "float"]),
    "n-head-bool": ((8, True), TypeError, ["n_head", "bool"]),
    "dropout-one": ((8, 2, 1.0), ValueError, ["dropout", "[0, 1)", "dropout=1.0"]),
    "dropout-negative": ((8, 2, -0.1), ValueError, ["dropout=-0.1"]),
    "dropout-nan": ((8, 2, float("nan")), ValueError, ["dropout=nan"]),
    "dropout-str": ((8, 2, "0.1"), TypeError, ["dropout", "str"]),
}


@pytest.mark.parametrize("case", list(BAD_SIZES), ids=list(BAD_SIZES))
def test_bad_constructor_arguments_raise_clear_error(case: str) -> None:
    args, exc, words = BAD_SIZES[case]
    with pytest.raises(exc) as info:
        MultiHeadAttention(*args)
    assert type(info.value) is exc
    for word in words:
        assert word in str(info.value), f"message {str(info.value)!r} does not name {word!r}"
