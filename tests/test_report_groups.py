"""Reports: failures with one root cause shown once; histograms put failing examples in the red bin."""

from __future__ import annotations

import math

import pytest

from mha_verify import report_html, report_text
from mha_verify.properties.engine.results import CheckResult
from mha_verify.report_groups import group_failures, not_finite


def _fail(name: str, reason: str = "", error: float | str | None = None, stage: str = "properties") -> CheckResult:
    return CheckResult(name, stage, "fail", worst_error=error, allowed=1e-6, reason=reason,  # type: ignore[arg-type]
                       replay=f"mha-verify check --only {name}")


FULLY = _fail("fully_masked_rows", "output gives NaN on fully masked rows; should give w_o(0) = b_o", math.inf)
ORACLE_NAN = _fail("oracle_agreement", "output vs float64 oracle: max error inf exceeds allowed 1.79e-06", "inf")
BATCH_NAN = _fail("batch_independence", "item 1 differs: NaN", None)
HEADS = _fail("head_split", "per-head formulation: max error 3e-3 exceeds allowed 1e-6", 3e-3)
PASSED = CheckResult("query_permutation", "properties", "pass", worst_error=0.0, allowed=1e-6)


def _names(groups: list[tuple[CheckResult, list[CheckResult]]]) -> list[tuple[str, list[str]]]:
    return [(root.name, [s.name for s in same]) for root, same in groups]


def test_nan_failures_are_grouped_under_fully_masked_rows() -> None:
    groups = group_failures([ORACLE_NAN, PASSED, HEADS, FULLY, BATCH_NAN])
    assert _names(groups) == [("head_split", []), ("fully_masked_rows", ["oracle_agreement", "batch_independence"])]


@pytest.mark.parametrize("other", [
    _fail("oracle_agreement", "output contract: output shape (1, 3, 8), but should be (B, Lq, D) = (1, 4, 8)", "inf"),
    _fail("gradcheck", "gradcheck failed: Jacobian mismatch for output 0 with respect to input 0, numerical nan"),
    _fail("bool_equals_additive", "additive 0/-inf mask vs bool mask: max difference 0.3 > allowed 1e-06", 0.3),
    _fail("determinism", "the target raised RuntimeError: inf is not allowed here", math.inf),
    _fail("masked_grad_zero", "gradient nan reached k at a key masked for every query, but should be exactly 0"),
], ids=["wrong-shape", "gradcheck", "minus-inf-wording", "exception", "gradient"])
def test_a_failure_with_a_cause_of_its_own_is_never_grouped_as_nan(other: CheckResult) -> None:
    assert not not_finite(other)
    assert _names(group_failures([FULLY, other])) == [("fully_masked_rows", []), (other.name, [])]


def test_without_a_fully_masked_rows_failure_every_failure_stands_alone() -> None:
    assert _names(group_failures([ORACLE_NAN, HEADS, BATCH_NAN, PASSED])) == [
        ("oracle_agreement", []), ("head_split", []), ("batch_independence", [])]
    assert group_failures([PASSED]) == []


@pytest.mark.parametrize(("result", "expected"), [
    pytest.param(ORACLE_NAN, True, id="error-inf-as-json-string"),
    pytest.param(_fail("x", "", "nan"), True, id="error-nan-string"),
    pytest.param(_fail("x", "", math.nan), True, id="error-nan-float"),
    pytest.param(_fail("x", "output not finite at (b, i)=(0, 1)"), True, id="reason-not-finite"),
    pytest.param(BATCH_NAN, True, id="reason-nan"),
    pytest.param(HEADS, False, id="finite-error"),
    pytest.param(_fail("x", "the target raised RuntimeError: information lost"), False, id="no-nan-in-words"),
])
def test_not_finite(result: CheckResult, expected: bool) -> None:
    assert not_finite(result) is expected


def test_text_report_shows_the_cause_once_and_lists_the_rest() -> None:
    text = report_text.failures([FULLY, ORACLE_NAN, HEADS])
    assert text.count("what:") == 2  # fully_masked_rows and head_split in full
    assert "same cause (a NaN or inf output) fails 1 more check:" in text
    assert "FAILED properties/oracle_agreement  replay: mha-verify check --only oracle_agreement" in text


@pytest.mark.parametrize(("ratio", "bin_"), [
    (0.0, 0), (1e-7, 1), (1e-5, 2), (0.5, 6), (1.0, 6), (1.5, 7), (math.inf, 7), (math.nan, 7),
    ("inf", 7), ("nan", 7), ("NaN", 7), ("Infinity", 7), ("garbage", 7), (None, 7), ("0.001", 4),
], ids=repr)
def test_histogram_bins(ratio: object, bin_: int) -> None:
    assert report_html._bin(ratio) == bin_


def test_failed_check_shows_its_failing_example_in_the_red_bin() -> None:
    only_passing = CheckResult("oracle_agreement", "properties", "fail", 2, worst_error=math.inf, allowed=1e-6,
                               details={"error_ratios": [0.01, 0.02]})
    assert report_html._ratios(only_passing)[-1] == math.inf
    recorded = CheckResult("oracle_agreement", "properties", "fail", 3, worst_error=math.inf, allowed=1e-6,
                           details={"error_ratios": [0.01, 0.02, "inf"]})
    assert report_html._ratios(recorded) == [0.01, 0.02, "inf"]  # the runner's own record: not counted twice
    svg = report_html._histogram(["nan", math.inf, 2.0, 0.5])
    assert '<title>&gt;1: 3</title>' in svg or "<title>>1: 3</title>" in svg


def test_html_summary_comes_first_and_names_the_failure() -> None:
    page = report_html.document([PASSED, FULLY, ORACLE_NAN, HEADS], target="t.py:A", profile="ci", versions={})
    summary, checks, details = (page.index(f"id={x}") for x in ("summary", "checks", "failures"))
    assert summary < checks < details
    box = page[summary:checks]
    assert "fully_masked_rows" in box and "head_split" in box and "same cause as fully_masked_rows" in box
    assert "<b>oracle_agreement</b>" in box and "error 0.003 vs allowed 1e-06" in box
    assert "<script" not in page
