"""Findings that are not failures, each with its kind and its evidence, and each next to the one-bug
twin that still FAILs: inherited (torch's SDPA accepts Lk != Lv the layer passed through), ignored
(a mask the layer's own source says it does not use), unspecified by its library (fully masked rows
its library leaves don't-care: finite is still owed). A precision policy has tests/test_precision.py."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from mha_verify.properties.engine import profiles
from mha_verify.properties.engine.results import CheckResult
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.protocol import Conventions
from mha_verify.properties.targets.eager import Bound, Target, load_target
from mha_verify.report_json import document
from mha_verify.report_text import summary
from tests.mutants import MaskWithMinusOneE9, NaNOnFullyMaskedRows

SETTINGS = profiles.PROFILES["quick"]


def _run(name: str, target: object) -> CheckResult:
    return run_property(all_properties()[name], target, settings=SETTINGS)  # type: ignore[arg-type]


def test_lengths_torch_sdpa_accepts_are_inherited_and_the_call_is_shown() -> None:
    got = _run("lk_equals_lv", load_target("tests.fixtures.sdpa_layers:SdpaAttention"))
    assert (got.verdict, got.kind) == ("finding", "inherited"), got
    assert not got.failed and got.examples > 0
    assert "torch.nn.functional.scaled_dot_product_attention(query (" in (got.reason or "")
    assert "pytorch/pytorch#193728" in (got.reason or "")


@pytest.mark.deep
def test_a_layer_that_cuts_values_to_the_keys_itself_still_fails() -> None:
    got = _run("lk_equals_lv", load_target("tests.fixtures.kind_layers:CutsValuesToKeys"))
    assert got.verdict == "fail" and got.kind is None, got
    assert "should raise" in (got.reason or "")


def test_a_mask_its_source_says_is_unused_is_ignored_with_the_line_quoted() -> None:
    target = load_target("tests.fixtures.kind_layers:MaskDocumentedUnused")
    for name in ("masked_kv_invariance", "fully_masked_rows", "bool_equals_additive"):
        got = _run(name, target)
        assert (got.verdict, got.kind) == ("n/a", "ignored"), got
        assert "# Not used but kept for signature matching" in (got.reason or "")
    assert _run("oracle_agreement", target).verdict == "pass"  # the rest is still held, without a mask


@pytest.mark.deep
def test_the_same_mask_dropped_silently_still_fails() -> None:
    got = _run("masked_kv_invariance", load_target("tests.fixtures.kind_layers:MaskDroppedSilently"))
    assert got.verdict == "fail" and got.kind is None, got


def test_keys_and_values_its_forward_never_reads_are_ignored_and_it_is_verified_as_self_attention() -> None:
    """ErnieImage's single stream: encoder_hidden_states is in the signature, and the forward's
    body never names it."""
    target = load_target("tests.fixtures.kind_layers:ContextNeverRead")
    for name in ("lk_equals_lv", "key_permutation", "masked_grad_zero"):
        got = _run(name, target)
        assert (got.verdict, got.kind) == ("n/a", "ignored"), got
        assert "encoder_hidden_states is accepted and not used: its forward takes encoder_hidden_states and never " \
               "reads it" in (got.reason or "")
    assert _run("oracle_agreement", target).verdict == "pass"


@pytest.mark.deep
def test_keys_and_values_read_and_then_dropped_still_fail() -> None:
    got = _run("oracle_agreement", load_target("tests.fixtures.kind_layers:ContextReadAndDropped"))
    assert got.verdict == "fail" and got.kind is None, got


@dataclasses.dataclass
class _RowsUnspecified:
    """A target with the conventions its library would give: fully masked rows don't-care."""

    inner: Target
    why: str = "its library treats fully masked rows as padding, don't-care (a test's statement)"

    @property
    def spec(self) -> str:
        return self.inner.spec

    @property
    def probe_sizes(self) -> tuple[int, int]:
        return self.inner.probe_sizes

    def build(self, d_model: int, n_head: int, *, seed: int = 0, dtype: torch.dtype = torch.float32) -> Bound:
        bound = self.inner.build(d_model, n_head, seed=seed, dtype=dtype)
        return _Declared(bound, dataclasses.replace(bound.conventions, rows_unspecified=self.why))  # type: ignore


class _Declared:
    def __init__(self, bound: Bound, conv: Conventions) -> None:
        self._bound, self.conventions = bound, conv

    def __getattr__(self, name: str) -> object:
        return getattr(self._bound, name)

    def __call__(self, *args: object) -> torch.Tensor:
        return self._bound(*args)  # type: ignore[arg-type]


@pytest.mark.deep
def test_finite_rows_its_library_leaves_unspecified_are_a_finding_not_a_failure() -> None:
    plain = Target("tests.mutants:MaskWithMinusOneE9", MaskWithMinusOneE9)
    assert _run("fully_masked_rows", plain).verdict == "fail"  # owed w_o(0) = b_o by the contract
    got = _run("fully_masked_rows", _RowsUnspecified(plain))
    assert (got.verdict, got.kind) == ("finding", "unspecified"), got
    assert "fully masked rows are finite" in (got.reason or "") and "don't-care" in (got.reason or "")


def test_nan_on_rows_its_library_leaves_unspecified_still_fails() -> None:
    got = _run("fully_masked_rows", _RowsUnspecified(Target("tests.mutants:NaNOnFullyMaskedRows",
                                                            NaNOnFullyMaskedRows)))
    assert got.verdict == "fail", got  # NaN x 0 is NaN: a masked loss over padding rows is poisoned


def test_kinds_reach_the_text_summary_and_the_json_report() -> None:
    finding = CheckResult("lk_equals_lv", "properties", "finding", examples=3, kind="inherited", reason="why")
    policy = CheckResult("gradcheck", "properties", "n/a", kind="precision_policy", reason="float32 steps")
    line = summary([finding, policy])
    assert "1 finding," in line and "1 inherited" in line and "1 precision policy" in line
    doc = json.loads(json.dumps(document([finding, policy], target="t", profile="quick", seed=None)))
    assert doc["kinds"]["inherited"] == 1 and doc["kinds"]["precision_policy"] == 1
    assert doc["counts"]["finding"] == 1 and doc["verdict"] == "pass"


@pytest.mark.parametrize(("verdict", "kind"), [("finding", None), ("pass", "inherited"), ("fail", "ignored"),
                                               ("n/a", "no such kind")])
def test_a_kind_goes_with_a_finding_or_an_n_a_only(verdict: str, kind: str | None) -> None:
    with pytest.raises(ValueError, match="kind"):
        CheckResult("x", "properties", verdict, kind=kind)
