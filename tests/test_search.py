"""``mha-verify search`` on a local Dask cluster: it finds a bug a one-example run misses, saves
it where ``check`` replays it, ends when its time is up, and refuses bad use in one line."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_run import run_cli

pytest.importorskip("distributed", reason="the search engine is an optional extra: pip install 'mha-verify[search]'")

ROOT = Path(__file__).resolve().parent.parent
MUTANT = "tests/fixtures/rare_bugs.py:DropsKeyInBatches"


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mha_verify.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def _example(out: str) -> str:
    lines = [line.strip() for line in out.splitlines() if line.strip().startswith("example:")]
    assert lines, out
    return lines[0]


@pytest.mark.integration
def test_search_finds_saves_and_check_replays(tmp_path: Path) -> None:
    db = str(tmp_path / "db")
    start = time.perf_counter()
    found = cli("search", "--target", MUTANT, "--only", "oracle_agreement,rows_sum_to_one", "--database", db,
                "--seconds", "45", "--workers", "1", "--examples", "30", "--seed", "1")
    wall = time.perf_counter() - start
    assert found.returncode == 1, found.stdout + found.stderr
    assert "oracle_agreement FAILED after" in found.stderr, found.stderr
    assert "rows_sum_to_one: no failure in" in found.stderr  # searched to the end, and it holds
    assert wall < 45 + 60 + 60, wall  # the time asked, the grace of a round in flight, the cluster's start
    replayed = cli("check", "--target", MUTANT, "--only", "oracle_agreement", "--no-export", "--jobs", "1",
                   "--max-examples", "1", "--seed", "7", "--database", db)
    assert replayed.returncode == 1, replayed.stdout + replayed.stderr
    assert _example(replayed.stdout) == _example(found.stdout)


@pytest.mark.parametrize(("args", "message"), [
    (["--seconds", "5"], "the following arguments are required: --database"),
    (["--database", "d", "--seconds", "0"], "expected a finite number of seconds > 0"),
    (["--database", "d", "--seconds", "5", "--workers", "2", "--scheduler", "tcp://127.0.0.1:1"], "give one of them"),
    (["--database", "d", "--seconds", "5", "--only", "nope"], "unknown properties nope"),
])
def test_bad_use_is_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    got = run_cli("search", *args, cwd=tmp_path)
    assert got.returncode == 2, got.stdout + got.stderr
    assert message in got.stderr and "Traceback" not in got.stderr
    assert len(got.stderr.strip().splitlines()) == 1, got.stderr


@pytest.mark.integration
def test_unreachable_scheduler_is_a_usage_error(tmp_path: Path) -> None:
    got = cli("search", "--only", "rows_sum_to_one", "--database", str(tmp_path / "db"), "--seconds", "5",
              "--scheduler", "tcp://127.0.0.1:9", timeout=120)
    assert got.returncode == 2, got.stdout + got.stderr
    assert "cannot start the Dask cluster or reach --scheduler" in got.stderr and "Traceback" not in got.stderr
