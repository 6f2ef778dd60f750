"""The precision a layer computes float64 inputs at: measured (properties/engine/precision.py), and
a float64 check judged by it. The twin pair: softmax in float32 for float64 inputs is a precision
policy (gradcheck n/a, the finding stated, exit 0); softmax in float16 for float32 inputs is a
defect in the layer's own dtype (oracle_agreement fails, tests/mutants.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mha_verify.mha import MultiHeadAttention
from mha_verify.properties.engine import profiles
from mha_verify.properties.engine.precision import read_precision
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.targets.eager import Target
from tests.mutants import SoftmaxInFloat16, SoftmaxInFloat32, ValuesDetached

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = profiles.PROFILES["quick"]


class _QueryNormInFloat32(MultiHeadAttention):
    """Its queries through an RMSNorm that casts to float32 (Qwen3's kind), in a child module."""

    def __init__(self, d_model: int, n_head: int, **kw: object) -> None:
        super().__init__(d_model, n_head, **kw)  # type: ignore[arg-type]
        self.q_norm = _Float32Identity()

    def forward(self, q, k, v, mask=None, need_weights=False):  # type: ignore[no-untyped-def]
        return super().forward(self.q_norm(q), k, v, mask, need_weights=need_weights)


class _Float32Identity(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.to(torch.float32) * 1.0).to(x.dtype)  # rounds a float64 input to float32


class _WrongScaleInFloat32(SoftmaxInFloat32):
    """A float32 softmax and a wrong scale: an error float32's rounding does not explain."""

    def scores(self, qh: torch.Tensor, kh: torch.Tensor) -> torch.Tensor:
        return super().scores(qh, kh) * 1.01


def _target(cls: type) -> Target:
    return Target(f"tests.test_precision:{cls.__name__}", cls)


def test_the_reference_computes_float64_at_float64() -> None:
    reading = read_precision(_target(MultiHeadAttention))
    assert not reading.steps and not reading.policy
    assert reading.error <= reading.allowed64 < 1e-12


def test_a_float32_softmax_is_found_in_the_layers_own_forward() -> None:
    reading = read_precision(_target(SoftmaxInFloat32))
    assert reading.policy and reading.dtype == "float32"
    assert [(s.where, s.dtype) for s in reading.steps] == [("", "float32")]
    assert "_softmax" in reading.steps[0].ops
    assert reading.allowed64 < reading.error <= reading.allowed_low
    assert "in the layer's own forward (SoftmaxInFloat32): _softmax" in reading.finding()


def test_a_float32_norm_is_found_in_its_module() -> None:
    reading = read_precision(_target(_QueryNormInFloat32))
    assert reading.policy
    assert [s.where for s in reading.steps] == ["q_norm"]
    assert "in q_norm (_Float32Identity): mul in float32" in reading.finding()


def test_an_error_float32_does_not_explain_is_no_policy() -> None:
    reading = read_precision(_target(_WrongScaleInFloat32))
    assert reading.steps and reading.error > reading.allowed_low
    assert not reading.policy


def test_gradcheck_of_a_float32_softmax_is_na_by_precision_policy_with_the_finding() -> None:
    result = run_property(all_properties()["gradcheck"], _target(SoftmaxInFloat32), settings=SETTINGS)
    assert (result.verdict, result.kind) == ("n/a", "precision_policy"), result
    assert result.reason and "float64 inputs are computed at float32 precision" in result.reason
    assert "grad_agreement" in result.reason
    assert result.details["precision"]["dtype"] == "float32"


def test_gradients_of_a_float32_softmax_are_still_held_in_float32() -> None:
    result = run_property(all_properties()["grad_agreement"], _target(SoftmaxInFloat32), settings=SETTINGS)
    assert result.verdict == "pass" and result.examples > 0, result


@pytest.mark.deep
def test_a_gradient_bug_computed_in_float64_still_fails_gradcheck() -> None:
    result = run_property(all_properties()["gradcheck"], _target(ValuesDetached), settings=SETTINGS)
    assert result.verdict == "fail" and result.kind is None, result


@pytest.mark.deep
def test_a_float16_softmax_for_float32_inputs_fails_in_the_layers_own_dtype() -> None:
    result = run_property(all_properties()["oracle_agreement"], _target(SoftmaxInFloat16), settings=SETTINGS)
    assert result.verdict == "fail", result
    assert result.worst_error is not None and result.allowed is not None and result.worst_error > result.allowed


@pytest.mark.serial
@pytest.mark.deep
def test_the_gate_exits_0_on_a_float32_softmax_and_states_its_precision_finding(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "mha_verify.cli", "check", "--no-export", "--profile", "quick",
                           "--target", "tests.mutants:SoftmaxInFloat32", "--report", str(report)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "FINDING (precision policy), not a failure: gradcheck" in proc.stdout
    doc = json.loads(report.read_text())
    assert doc["kinds"]["precision_policy"] == 1 and doc["counts"]["fail"] == 0
    twin = subprocess.run([sys.executable, "-m", "mha_verify.cli", "check", "--no-export", "--profile", "quick",
                           "--target", "tests.mutants:SoftmaxInFloat16", "--only", "oracle_agreement"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert twin.returncode == 1, twin.stdout[-3000:]
