"""Execution modes: the same layer under ``torch.inference_mode()`` and in training mode with
dropout off computes what it computes in eval mode.

torch.nn.MultiheadAttention takes a different kernel (its "fast path") when no gradient is
recorded; HF layers switch attention code on ``self.training``. The other properties call the
layer in eval mode with autograd on, so these two are where those paths get verified. Fully
masked rows are included whatever the target declares: a path may not give NaN where the
other gives numbers (or the reverse).
"""

from __future__ import annotations

import dataclasses
import math

import torch
from hypothesis import strategies as st

from mha_verify.properties.engine.applicable import examples_for
from mha_verify.properties.engine.measure import UNCHECKED, Measure, Violation, relation_allowed
from mha_verify.properties.engine.registry import invariant
from mha_verify.properties.protocol import Conventions, Instance
from mha_verify.properties.strategies.examples import AttnExample
from mha_verify.properties.strategies.masks import MASK_KINDS


def _with_fully_masked_rows(conv: Conventions) -> st.SearchStrategy[AttnExample] | str:
    if not conv.torch_modes:  # both sides would be the same call: a check that cannot fail
        return "torch's inference and training modes do not reach the target (an onnxruntime session)"
    # fully masked rows are drawn even for targets declaring NaN or uniform there: both paths
    # must agree on them, whatever the convention. They are where paths part (torch MHA's fast
    # path gives NaN, its eager path b_o), so they come three times as often as with the
    # default kinds: 6 in 11 masks instead of 2 in 7 (at 10 examples the fast path's NaN was
    # found in some runs only).
    kinds = (*MASK_KINDS, *("fully_masked_rows", "fully_masked_item") * 2)
    return examples_for(dataclasses.replace(conv, fully_masked="zeros"), kinds=kinds)


def _agree(got: torch.Tensor, expected: torch.Tensor, allowed: float, what: str) -> Measure:
    """NaN where and only where ``expected`` has NaN; elsewhere within ``allowed``."""
    __tracebackhide__ = True
    a, e = got.detach().double(), expected.detach().double()
    nan_a, nan_e = torch.isnan(a), torch.isnan(e)
    if not bool(torch.equal(nan_a, nan_e)):
        where = tuple(int(i) for i in torch.nonzero(nan_a != nan_e)[0][:2])
        a_says = "NaN" if bool(nan_a[where].any()) else "numbers"
        e_says = "NaN" if bool(nan_e[where].any()) else "numbers"
        raise Violation(f"{what}: at (b, i)={where} it gives {a_says} where eval mode gives {e_says}")
    if not math.isfinite(allowed):  # the NaN pattern agreed; values cannot be compared: not a pass
        return UNCHECKED
    diff = (a - e).abs()[~nan_e]
    error = float(diff.max()) if diff.numel() else 0.0
    if not math.isfinite(error) or error > allowed:
        raise Violation(f"{what}: max difference {error:.3g} > allowed {allowed:.3g}", error, allowed)
    return Measure(error, allowed)


@invariant("inference_mode_agreement", strategy=_with_fully_masked_rows)
def inference_mode_agreement(bound: Instance, ex: AttnExample) -> Measure:
    """Under torch.inference_mode() the output equals the eval-mode output with autograd on.

    out_inference(q, k, v, M) = out_eval(q, k, v, M) within twice the derived tolerance, and
    NaN in the same places (torch.nn.MultiheadAttention's fast path runs only here).
    """
    expected = bound(ex.q, ex.k, ex.v, ex.mask).detach()
    with torch.inference_mode():
        got = bound(ex.q, ex.k, ex.v, ex.mask)
    return _agree(got.clone(), expected, relation_allowed(bound, ex), "output under torch.inference_mode()")


@invariant("train_mode_agreement", strategy=_with_fully_masked_rows)
def train_mode_agreement(bound: Instance, ex: AttnExample) -> Measure:
    """In training mode with every dropout probability at 0 the output equals the eval output.

    Dropout is set to 0 wherever the layer holds it (nn.Dropout modules, float ``dropout``/
    ``attn_dropout``/``dropout_p``/``attention_dropout`` attributes); then
    out_train(q, k, v, M) = out_eval(q, k, v, M) within twice the derived tolerance.
    """
    bound.set_dropout(0.0)
    expected = bound(ex.q, ex.k, ex.v, ex.mask).detach()
    bound.set_training(True)
    try:
        got = bound(ex.q, ex.k, ex.v, ex.mask)
    finally:
        bound.set_training(False)
    return _agree(got, expected, relation_allowed(bound, ex), "output in training mode with dropout 0")
