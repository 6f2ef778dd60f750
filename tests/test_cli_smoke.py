"""One run of each subcommand as a process of its own: the installed entry point starts, dispatches and
keeps the exit-code contract (0 done, 1 a check failed, 2 one line of usage error) outside pytest's
process. Everything else about the CLI is tested in-process (tests/cli_run.py); each run here pays about
3.5 s of imports.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mha_verify.cli import SUBCOMMANDS
from tests.source_modules import ROOT

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def entry_point(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``mha-verify ARGS`` through the console script pip installed, else ``python -m mha_verify.cli``."""
    script = shutil.which("mha-verify", path=str(Path(sys.executable).parent))
    command = [script] if script else [sys.executable, "-m", "mha_verify.cli"]
    return subprocess.run([*command, *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=ENV)


def _one_line_usage_error(proc: subprocess.CompletedProcess[str], words: str) -> None:
    __tracebackhide__ = True
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert words in proc.stderr, proc.stderr


def _check(tmp: Path) -> None:
    report = tmp / "r.json"
    proc = entry_point("check", "--only", "rows_sum_to_one,oracle_agreement", "--max-examples", "3", "--no-export",
                       "--jobs", "1", "--report", str(report), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verdicts = {r["name"]: r["verdict"] for r in json.loads(report.read_text())["results"]}
    assert verdicts == {"rows_sum_to_one": "pass", "oracle_agreement": "pass"}, verdicts


def _export(tmp: Path) -> None:
    out = tmp / "m.onnx"
    proc = entry_point("export", "--d-model", "8", "--n-head", "2", "--exporter", "torchscript", "--profile", "quick",
                       "-o", str(out), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert out.is_file() and out.stat().st_size > 0


def _validate(tmp: Path) -> None:
    _one_line_usage_error(entry_point("validate", str(tmp / "missing.onnx"), cwd=tmp), "missing.onnx")


def _sweep(tmp: Path) -> None:
    proc = entry_point("sweep", "tests.fixtures.fakelib", "--out", str(tmp / "sweep"), "--build-only",
                       "--match", "GoodAttention", cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp / "sweep" / "sweep.json").is_file(), sorted(p.name for p in (tmp / "sweep").iterdir())


def _merge(tmp: Path) -> None:
    _one_line_usage_error(entry_point("merge", str(tmp / "part0.json"), cwd=tmp), "part0.json")


def _search(tmp: Path) -> None:
    _one_line_usage_error(entry_point("search", "--seconds", "5", cwd=tmp), "--database")


def _list(tmp: Path) -> None:
    proc = entry_point("list", cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    assert "oracle_agreement" in proc.stdout and "head_split" in proc.stdout, proc.stdout


RUNS = {"check": _check, "export": _export, "validate": _validate, "sweep": _sweep, "merge": _merge,
        "search": _search, "list": _list}


def test_every_subcommand_has_a_smoke_run() -> None:
    assert sorted(RUNS) == sorted(SUBCOMMANDS)


@pytest.mark.parametrize("subcommand", sorted(RUNS))
def test_the_subcommand_runs_as_a_process_of_its_own(subcommand: str, tmp_path: Path) -> None:
    RUNS[subcommand](tmp_path)


def test_the_version_is_printed_with_its_bump_rule(tmp_path: Path) -> None:
    import mha_verify

    proc = entry_point("--version", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"mha-verify {mha_verify.__version__} ("), proc.stdout
