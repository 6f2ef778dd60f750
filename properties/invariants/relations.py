"""Relations between two targets on identical inputs, run by the same engine as every property.

``ort_vs_eager``: an onnxruntime session against the eager module it should compute.
``eager_vs_sdpa``: a layer against itself run through another attention implementation its library
ships (transformers' eager code beside sdpa): a bug on one path only passes every check of the other. Every
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
from mha_verify.properties.engine.call_path import Checked
from mha_verify.properties.engine.measure import (
    UNCHECKED,
    Measure,
    Violation,
    close,
    oracle,
    relation_allowed,
    worst,
)
from mha_verify.properties.engine.registry import invariant, relation
from mha_verify.properties.protocol import Conventions, Instance, NotApplicable
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


def _agree_where_masked(got: torch.Tensor, want: torch.Tensor, tol: Tolerance, names: tuple[str, str]) -> None:
    """Rows with a fully masked head (n, D), the subject ``names[0]`` vs its reference ``names[1]``: no NaN
    where the reference is finite, and within the floors of the tolerance rule scaled to the reference's
    values where both are finite.

    The subject is judged: where the reference gives NaN (torch MHA's fast path does) and the subject a
    finite value, the subject lost nothing, and the reference's NaN is a finding of its own checks.
    """
    nan_got, nan_want = torch.isnan(got), torch.isnan(want)
    if bool((nan_got & ~nan_want).any()):
        raise Violation(f"on rows with a fully masked head {names[0]} gives NaN where {names[1]} gives finite values",
                        math.inf, 0.0)
    both = ~nan_got & ~nan_want
    if bool(both.any()):
        diff = _max_abs(got[both], want[both])
        allowed = 2 * tol.allowed(0.0, float(want[both].abs().max()))
        if not diff <= allowed:
            raise Violation(f"on rows with a fully masked head max |{names[0]} - {names[1]}| {diff:.3g} > allowed "
                            f"{allowed:.3g}", diff, allowed)


def sides_agree(subject: Instance, reference: Instance, ex: AttnExample, names: tuple[str, str],
                unspecified: str | None = None) -> Measure:
    """|subject - reference| <= A_subject + A_reference on identical inputs, each A the derived tolerance of
    the float64 oracle with the reference's weights; a failure says which side is off the oracle.
    ``names``: the two sides in words, subject first. ``unspecified``: where the layer's library leaves rows
    with a fully masked head unspecified (HF's padding rows: each path gives its own values there), why: those
    rows are then held finite on both sides, and compared no further."""
    with torch.no_grad():
        got = subject(ex.q, ex.k, ex.v, ex.mask)
        want = reference(ex.q, ex.k, ex.v, ex.mask)
    keep = None
    if unspecified is not None:
        keep = comparable_rows(ex, reference.conventions.causal)
        for side, out in zip(names, (got, want), strict=True):
            if not bool(torch.isfinite(out[~keep]).all()):
                raise Violation(f"{side} gives a non-finite value on a row with a fully masked head, which its "
                                f"library leaves unspecified but finite ({unspecified})", math.inf, 0.0)
    if reference.conventions.beyond:  # the oracle does not model it: each side may stray its own rounding
        rows = keep if keep is not None else None if reference.conventions.fully_masked == "zeros" \
            else comparable_rows(ex)
        return close(got, want, relation_allowed(reference, ex), f"{names[0]} vs {names[1]} (each side allowed the "
                     f"{names[1]} layer's rounding, measured against its own float64 forward)", rows)
    if keep is not None:
        if not bool(keep.any()):
            return UNCHECKED
        ref, _, same = oracle(reference, ex)
        return _within(got[keep], want[keep], ref[keep], same[keep], ex, names)
    ref, _, same = oracle(reference, ex)
    tol = tolerance_for(ex.q.dtype)
    if subject.conventions.fully_masked != "zeros" or reference.conventions.fully_masked != "zeros":
        # the oracle follows a declared convention on rows with a fully masked head; the two sides
        # are one layer, so there they must still agree with each other: NaN where the other is NaN
        rows = comparable_rows(ex)
        _agree_where_masked(got[~rows], want[~rows], tol, names)
        got, want, ref, same = got[rows], want[rows], ref[rows], same[rows]
    if ref.numel() == 0:
        return UNCHECKED
    return _within(got, want, ref, same, ex, names)


def _within(got: torch.Tensor, want: torch.Tensor, ref: torch.Tensor, same: torch.Tensor, ex: AttnExample,
            names: tuple[str, str]) -> Measure:
    """The two sides within twice the derived tolerance of the oracle ``ref`` (``same``: the formula in their
    precision), naming the side that strays where they are not."""
    tol = tolerance_for(ex.q.dtype)
    one = tol.allowed(_max_abs(same, ref), float(ref.abs().max()))
    if not math.isfinite(one):
        return UNCHECKED
    allowed = 2 * one
    diff = _max_abs(got, want)
    if not diff <= allowed:
        e_got, e_want = _max_abs(got, ref), _max_abs(want, ref)
        off = [side for side, e in zip(names, (e_got, e_want), strict=True) if not e <= one]
        raise Violation(
            f"max |{names[0]} - {names[1]}| {diff:.3g} > allowed {allowed:.3g} (each side may stray {one:.3g} from "
            f"the float64 oracle with the {names[1]} weights; {names[0]} strays {e_got:.3g}, {names[1]} "
            f"{e_want:.3g}: {' and '.join(off) or 'neither alone'} off the oracle)", diff, allowed)
    return Measure(diff, allowed)


@relation("ort_vs_eager", strategy=_examples)
def ort_vs_eager(ort: Instance, eager: Instance, ex: AttnExample) -> Measure:
    """|onnxruntime - eager| <= A_ort + A_eager on identical inputs, each A the derived tolerance
    of the float64 oracle with the eager module's weights."""
    return sides_agree(ort, eager, ex, ("onnxruntime", "eager"))


def _two_paths(conv: Conventions) -> st.SearchStrategy[AttnExample] | str:
    if len(conv.implementations) < 2:
        return "its library runs it through one attention implementation here"
    return _examples(conv)


@invariant("eager_vs_sdpa", strategy=_two_paths)
def eager_vs_sdpa(bound: Instance, ex: AttnExample) -> Measure:
    """Each other attention implementation its library runs the layer through (transformers' eager code beside
    the sdpa it is built with) agrees with it within A_other + A_built on identical inputs, each A the derived
    tolerance of the float64 oracle with the layer's weights; a failure says which path is off the oracle. Fully
    masked rows included: the paths are one layer."""
    if not isinstance(bound, Checked):  # the runner hands every property its instance through the call path
        raise NotApplicable("the target is not called through the call path")
    built, *others = bound.conventions.implementations
    unspecified = bound.conventions.rows_unspecified
    return worst(*(sides_agree(bound.implementation(name), bound, ex, (f"the {name} path", f"the {built} path"),
                               unspecified) for name in others))
