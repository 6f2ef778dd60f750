"""What the CLI says while it works and when it fails: progress with a count and the time left,
Hypothesis's replay hint worded for someone at a command line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from mha_verify.report_text import hypothesis_hint

ROOT = Path(__file__).resolve().parent.parent


def test_hypothesis_hint_names_pytest_and_keeps_the_decorator() -> None:
    note = ("You can reproduce this test case by temporarily adding @reproduce_failure('6.170.27', "
            "b'AXicc2RwZARCBkcmKA2FACgSAxM=') as a decorator on your test function")
    hint = hypothesis_hint(note)
    assert hint.startswith("pytest:  @reproduce_failure('6.170.27', b'AXicc2RwZARCBkcmKA2FACgSAxM=')")
    assert "replay command needs nothing" in hint and "your test function" not in hint
    assert hypothesis_hint("  something else  ") == "something else"


@pytest.mark.integration
def test_progress_counts_the_checks_and_says_the_time_left() -> None:
    done = subprocess.run([sys.executable, "-m", "mha_verify.cli", "check", "--no-export", "--profile", "quick",
                           "--jobs", "1", "--only", "determinism,lk_equals_lv,rows_sum_to_one"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "running properties/" in line]
    assert [re.match(r"  \[(\d)/3, \d+ s", line).group(1) for line in lines] == ["1", "2", "3"], lines  # type: ignore[union-attr]
    assert "s left]" not in lines[0] and all(re.search(r", ~\d+ s left\]", line) for line in lines[1:]), lines


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mha_verify.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.deep
def test_export_of_a_layer_without_a_mask_says_to_pass_no_mask_input(tmp_path: Path) -> None:
    out = tmp_path / "m.onnx"
    done = _cli("export", "--target", "tests/fixtures/seed_001.py:MultiHeadAttention", "--d-model", "16",
                "--n-head", "2", "-o", str(out))
    assert done.returncode == 2 and not out.exists(), done.stderr
    assert done.stderr.strip().splitlines() == [
        "mha-verify: error: tests/fixtures/seed_001.py:MultiHeadAttention takes no mask, so the graph cannot have "
        "a mask input: pass --no-mask-input (inputs q, k, v only)"]


@pytest.mark.deep
def test_export_takes_an_adapter_and_names_an_unknown_one(tmp_path: Path) -> None:
    done = _cli("export", "--target", "tests/fixtures/seed_001.py:MultiHeadAttention", "--adapter", "nope",
                "--d-model", "16", "--n-head", "2", "-o", str(tmp_path / "m.onnx"))
    assert done.returncode == 2 and "unknown adapter 'nope'; known: torch_mha" in done.stderr, done.stderr


@pytest.mark.deep
def test_no_adapter_recognizes_is_one_short_line_naming_the_way_on() -> None:
    done = _cli("check", "--no-export", "--target", "tests/fixtures/odd_layers.py:Unusual")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "no adapter recognizes Unusual" in lines[0] and "mha-verify list" in lines[0]
    assert "--adapter pkg.mod:YourAdapter" in lines[0] and len(lines[0]) < 400, lines[0]


@pytest.mark.deep
def test_validate_takes_the_adapter_its_eager_target_needs(tmp_path: Path) -> None:
    target, adapter = "tests/fixtures/odd_layers.py:Unusual", "tests/fixtures/user_adapter.py:UnusualAdapter"
    out = tmp_path / "m.onnx"
    done = _cli("export", "--target", target, "--adapter", adapter, "--exporter", "torchscript", "--d-model", "8",
                "--n-head", "2", "-o", str(out))
    assert done.returncode == 0 and out.exists(), done.stderr
    without = _cli("validate", str(out), "--target", target, "--profile", "quick")
    assert without.returncode == 2 and "no adapter recognizes Unusual" in without.stderr, without.stderr
    done = _cli("validate", str(out), "--target", target, "--adapter", adapter, "--profile", "quick")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ort_vs_eager" in done.stdout, done.stdout
