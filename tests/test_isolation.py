"""The check worker: no deadlock when the target ran parallel ops before the worker started,
and a default timeout that turns a hang into a failure in about a minute."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mha_verify.isolation import MIN_TIMEOUT, Limits

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_no_deadlock_when_the_target_runs_parallel_ops_at_import_and_init() -> None:
    # two OpenMP threads: with one, libgomp never starts a pool and a forked worker would not hang
    env = dict(os.environ, OMP_NUM_THREADS="2")
    proc = subprocess.run(
        [sys.executable, "-m", "mha_verify.cli", "--no-export", "--max-examples", "3", "--only", "determinism",
         "--timeout", "60", "--target", "tests/fixtures/threads_at_init.py:ThreadsAtInit"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "timed out" not in proc.stdout and "1 passed" in proc.stdout, proc.stdout


@pytest.mark.parametrize(("kwargs", "seconds"), [
    pytest.param({"profile": "quick", "max_examples": None}, MIN_TIMEOUT, id="quick"),
    pytest.param({"profile": "ci", "max_examples": None}, 60.0, id="ci"),
    pytest.param({"profile": "thorough", "max_examples": None}, 600.0, id="thorough"),
    pytest.param({"profile": "ci", "max_examples": 500}, 300.0, id="max-examples"),
    pytest.param({}, MIN_TIMEOUT, id="no-examples"),
])
def test_default_timeout_is_about_a_minute_and_scales_with_examples(kwargs: dict[str, object],
                                                                    seconds: float) -> None:
    assert Limits().timeout_for(("property_check", kwargs)) == pytest.approx(seconds)


def test_an_explicit_timeout_wins() -> None:
    assert Limits(timeout=8).timeout_for(("property_check", {"profile": "thorough"})) == 8.0
