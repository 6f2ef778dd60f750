"""Baselines: every stored value a finite number >= 0, recorded for one target, dtype and profile,
and never overwritten by a failing run unless asked (then failed checks keep their entries)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mha_verify import baseline
from mha_verify.cli import main
from mha_verify.properties.engine.results import CheckResult

CONTEXT = {"target": "mha_verify.mha:MultiHeadAttention", "dtype": "float32", "profile": "ci"}
FAST = ["--no-export", "--no-isolation", "--max-examples", "3", "--only", "lk_equals_lv"]


def _write(path: Path, worst: dict[str, object], context: dict[str, str] = CONTEXT) -> None:
    path.write_text(json.dumps({"format": baseline.FORMAT, "context": context, "worst": worst}))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, True, None, [1.0], "1e-3"],
                         ids=["nan", "inf", "negative", "true", "null", "list", "string"])
def test_a_stored_value_must_be_a_finite_number(tmp_path: Path, value: object) -> None:
    path = tmp_path / "b.json"
    _write(path, {"properties/oracle_agreement": value})
    with pytest.raises(ValueError, match="must be a finite number >= 0"):
        baseline.load(str(path), CONTEXT)


def test_a_baseline_of_another_target_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    _write(path, {"properties/oracle_agreement": 1e-6}, {**CONTEXT, "target": "torch.nn:MultiheadAttention"})
    with pytest.raises(ValueError, match=r"recorded for another run: target .torch\.nn:MultiheadAttention"):
        baseline.load(str(path), CONTEXT)


def test_the_cli_refuses_a_bad_baseline_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "b.json"
    _write(path, {"properties/lk_equals_lv": None})
    assert main(["check", *FAST, "--baseline", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "must be a finite number" in err[0]


def test_a_failing_run_keeps_the_old_entry(tmp_path: Path) -> None:
    old = {"properties/oracle_agreement": 1e-6, "properties/lk_equals_lv": 0.0}
    results = [CheckResult("oracle_agreement", "properties", "fail", worst_error=0.5),
               CheckResult("lk_equals_lv", "properties", "pass", worst_error=0.0)]
    doc = json.loads(baseline.document(results, CONTEXT, kept=old))
    assert doc["worst"] == old and doc["context"] == CONTEXT


@pytest.mark.deep
def test_a_failing_run_does_not_update_the_baseline_unless_asked(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "b.json"
    argv = ["check", "--no-export", "--no-isolation", "--max-examples", "3", "--only", "oracle_agreement",
            "--target", "tests/mutants.py:ScaleBySqrtDModel", "--baseline", str(path)]
    assert main(argv) == 1
    assert not path.exists() and "not written" in capsys.readouterr().err
    assert main([*argv, "--baseline-despite-failures"]) == 1
    assert json.loads(path.read_text())["worst"] == {}  # the failed check has no entry to keep
