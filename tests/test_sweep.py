"""``mha-verify sweep``: every attention class of a library becomes a row, whatever it does when
built or checked, and the table's totals count them (tests/fixtures/fakelib stands for a library)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mha_verify.sweep_classes import find_classes
from mha_verify.sweep_rows import cause_of

ROOT = Path(__file__).resolve().parents[1]
LIB = "tests.fixtures.fakelib"


def sweep(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mha_verify.cli", "sweep", LIB, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_classes_are_found_by_reading_the_files_without_importing_them() -> None:
    found = [f.name for f in find_classes(LIB)]
    assert found == ["GoodAttention", "NoScaleAttention", "BrokenAttention", "HangingAttention",
                     "CrashingAttention", "WrappedAttention", "NotAModuleAttention"]
    assert "tests.fixtures.fakelib.layers" not in sys.modules  # HangingAttention would hang an import-time scan


def test_causes_group_failures_whose_numbers_differ() -> None:
    assert cause_of("max difference 6.54e-06 > allowed 2e-06") == cause_of("max difference 0.1 > allowed 1e-5")
    assert cause_of("x2_proj raised") == "x2_proj raised"  # digits inside a name are kept
    assert cause_of("vs float64 oracle: 1.5e-06") == "vs float64 oracle: #"


@pytest.mark.serial
@pytest.mark.deep  # two stages over six classes: two minutes
def test_a_sweep_turns_every_class_into_a_row_and_survives_hangs_and_crashes(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    proc = sweep("--out", str(out), "--build-timeout", "20", "--max-examples", "5")
    assert proc.returncode == 1, proc.stdout + proc.stderr  # a class failed, one hung, one crashed
    doc = json.loads((out / "sweep.json").read_text())
    rows = {r["spec"].rpartition(":")[2]: r for r in doc["rows"]}
    assert {name: r["status"] for name, r in rows.items()} == {
        "GoodAttention": "passed", "NoScaleAttention": "failed", "BrokenAttention": "not built",
        "HangingAttention": "hung while built", "CrashingAttention": "crashed while built",
        "WrappedAttention": "wrapper", "NotAModuleAttention": "not built"}
    assert "raised NotImplementedError: only on the accelerator" in rows["BrokenAttention"]["reason"]
    assert "SIGSEGV" in rows["CrashingAttention"]["reason"]
    assert rows["GoodAttention"]["built_as"] == "GoodAttention(d_model=8, n_head=2)"
    # which checks meet the bug in 5 examples varies with the machine's timing of shrinking: one of these does
    assert {"oracle_agreement", "head_split", "grad_agreement"} & {
        c for checks in rows["NoScaleAttention"]["causes"].values() for c in checks}
    assert rows["WrappedAttention"]["reason"].startswith("wraps GoodAttention (found on its own)")
    assert doc["totals"] == {"found": 7, "built": 2, "verified": 2, "passed": 1, "failed": 1, "not built": 2,
                             "wrapper": 1, "hung while built": 1, "crashed while built": 1}
    table = (out / "sweep.md").read_text()
    assert "| 7 | 2 | 2 | 1 | 1 | 2 | 1 | 1 | 1 |" in table
    assert "`GoodAttention (tests.fixtures.fakelib.layers)`" in table

    # run again into the same folder: every row is kept, nothing is built or checked again
    again = sweep("--out", str(out), "--build-timeout", "20", "--max-examples", "5", timeout=120)
    assert again.returncode == 1 and json.loads((out / "sweep.json").read_text())["rows"] == doc["rows"]


def test_a_folder_holding_another_sweep_json_is_refused_and_kept(tmp_path: Path) -> None:
    (tmp_path / "sweep.json").write_text('{"mine": true}\n')
    proc = sweep("--out", str(tmp_path), "--build-only", "--match", "GoodAttention", timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "is not an mha-verify sweep's" in proc.stderr
    assert (tmp_path / "sweep.json").read_text() == '{"mine": true}\n'


@pytest.mark.parametrize(("args", "words"), [
    (["--match", "("], "is not a regular expression"),
    (["--match", "NoSuchClass"], "no attention class of tests.fixtures.fakelib matches"),
])
def test_sweep_usage_errors_are_one_line(args: list[str], words: str, tmp_path: Path) -> None:
    proc = sweep("--out", str(tmp_path / "o"), "--build-only", *args, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and words in proc.stderr, proc.stderr


def test_a_library_that_is_not_installed_is_a_usage_error(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "mha_verify.cli", "sweep", "no_such_library", "--out",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "is not installed as a package here" in proc.stderr, proc.stderr


@pytest.mark.serial
@pytest.mark.deep  # a build, then a check stopped in its stride: ~30 s
def test_sigterm_ends_the_sweep_and_its_running_checks(tmp_path: Path) -> None:
    """CI cancels with SIGTERM: the sweep ends within seconds, its checks with it, instead of
    waiting for every running check (up to --class-timeout each)."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "mha_verify.cli", "sweep", LIB, "--match", "GoodAttention",
                             "--out", str(tmp_path / "s"), "--profile", "thorough", "--jobs", "2"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stderr is not None
    for line in proc.stderr:  # the class is built; its check starts next
        if "built" in line and "GoodAttention" in line:
            break
    time.sleep(5)
    # the sweep's check worker, labelled with the sweep's folder
    worker = ["pgrep", "-f", f"mha_verify.sweep_check {tmp_path / 's'}"]
    assert subprocess.run(worker, capture_output=True, text=True).stdout.strip(), "no check worker was running"
    proc.send_signal(signal.SIGTERM)
    start = time.perf_counter()
    code = proc.wait(timeout=60)
    assert code == 143 and time.perf_counter() - start < 30, (code, proc.stderr.read())
    left = subprocess.run(worker, capture_output=True, text=True)
    assert left.stdout.strip() == "", left.stdout


@pytest.mark.integration
def test_a_narrower_run_into_the_same_folder_keeps_the_rows_it_did_not_select(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    first = sweep("--out", str(out), "--build-only", "--match", "(Good|NoScale)Attention$", timeout=120)
    assert first.returncode == 0, first.stdout + first.stderr
    again = sweep("--out", str(out), "--build-only", "--retry", "--match", "NoScaleAttention$", timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    doc = json.loads((out / "sweep.json").read_text())
    assert [r["spec"].rpartition(":")[2] for r in doc["rows"]] == ["GoodAttention", "NoScaleAttention"]
    assert doc["totals"]["found"] == 2 and doc["totals"]["built"] == 2
