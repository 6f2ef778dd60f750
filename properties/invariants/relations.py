"""Relations between two targets on identical inputs, run by the same engine as every property.

``ort_vs_eager``: an onnxruntime session against the eager module it should compute. Every
other check of an ONNX model is a property run against the session alone; this one needs
both sides: a model whose initializers are stale, or a graph that computes a different
function than the eager module, can agree with the float64 formula evaluated with *its own*
weights yet not with the module the user deploys from.

Tolerance. On each example the float64 oracle (the formula with the eager module's weights)
is computed once; each side is allowed the derived tolerance of the rule in
:mod:`mha_verify.mha.tolerance` (``A = 4 x |same-precision formula - oracle| + floor``), so the
two may differ by ``A_ort + A_eager``. The sum of the two sides' *measured* errors against the
oracle is not the allowance: by the triangle inequality ``|ort - eager|`` never exceeds it, so
such a check could not fail. A failure says which side is off the oracle.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from hypothesis import strategies as st

from mha_verify.mha.tolerance import Tolerance, tolerance_for
from mha_verify.properties.engine.applicable import comparable_rows, examples_for
from mha_verify.properties.engine.measure import UNCHECKED, Measure, Violation, close, oracle, relation_allowed
from mha_verify.properties.engine.registry import relation
from mha_verify.properties.protocol import Conventions, Instance
from mha_verify.properties.strategies.examples import AttnExample


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    d = (a.detach().double() - b.detach().double()).abs()
    if d.numel() == 0:
        return 0.0
    return float(d.max()) if bool(torch.isfinite(d).all()) else math.inf


def _examples(conv: Conventions) -> st.SearchStrategy[AttnExample] | str:
    """oracle_agreement's examples for the session's conventions, fully masked rows included whatever
    it declares there: the two sides of one layer must agree on them too."""
    return examples_for(dataclasses.replace(conv, fully_masked="zeros"))


def _agree_where_masked(got: torch.Tensor, want: torch.Tensor, tol: Tolerance) -> None:
    """Rows with a fully masked head (n, D), onnxruntime vs eager: no NaN where eager is finite, and
    within the floors of the tolerance rule scaled to the eager values where both are finite.

    The model is the subject: where eager gives NaN (torch MHA's fast path does) and the model a
    finite value, the model lost nothing, and eager's NaN is a finding of the eager target's own checks.
    """
    nan_got, nan_want = torch.isnan(got), torch.isnan(want)
    if bool((nan_got & ~nan_want).any()):
        raise Violation("on rows with a fully masked head onnxruntime gives NaN where eager gives finite values",
                        math.inf, 0.0)
    both = ~nan_got & ~nan_want
    if bool(both.any()):
        diff = _max_abs(got[both], want[both])
        allowed = 2 * tol.allowed(0.0, float(want[both].abs().max()))
        if not diff <= allowed:
            raise Violation(f"on rows with a fully masked head max |onnxruntime - eager| {diff:.3g} > allowed "
                            f"{allowed:.3g}", diff, allowed)


@relation("ort_vs_eager", strategy=_examples)
def ort_vs_eager(ort: Instance, eager: Instance, ex: AttnExample) -> Measure:
    """|onnxruntime - eager| <= A_ort + A_eager on identical inputs, each A the derived tolerance
    of the float64 oracle with the eager module's weights."""
    with torch.no_grad():
        got = ort(ex.q, ex.k, ex.v, ex.mask)
        want = eager(ex.q, ex.k, ex.v, ex.mask)
    if eager.conventions.beyond:  # the oracle does not model it: each side may stray its own rounding
        rows = None if eager.conventions.fully_masked == "zeros" else comparable_rows(ex)
        return close(got, want, relation_allowed(eager, ex), "onnxruntime vs eager (each side allowed the eager "
                     "layer's rounding, measured against its own float64 forward)", rows)
    ref, _, same = oracle(eager, ex)
    tol = tolerance_for(ex.q.dtype)
    if ort.conventions.fully_masked != "zeros" or eager.conventions.fully_masked != "zeros":
        # the oracle follows a declared convention on rows with a fully masked head; the two sides
        # are one layer, so there they must still agree with each other: NaN where the other is NaN
        rows = comparable_rows(ex)
        _agree_where_masked(got[~rows], want[~rows], tol)
        got, want, ref, same = got[rows], want[rows], ref[rows], same[rows]
    if ref.numel() == 0:
        return UNCHECKED
    one = tol.allowed(_max_abs(same, ref), float(ref.abs().max()))
    if not math.isfinite(one):
        return UNCHECKED
    allowed = 2 * one
    diff = _max_abs(got, want)
    if not diff <= allowed:
        e_ort, e_eager = _max_abs(got, ref), _max_abs(want, ref)
        off = [side for side, e in (("onnxruntime", e_ort), ("eager", e_eager)) if not e <= one]
        raise Violation(
            f"max |onnxruntime - eager| {diff:.3g} > allowed {allowed:.3g} (each side may stray {one:.3g} from the "
            f"float64 oracle with the eager weights; onnxruntime strays {e_ort:.3g}, eager {e_eager:.3g}: "
            f"{' and '.join(off) or 'neither alone'} off the oracle)", diff, allowed)
    return Measure(diff, allowed)
