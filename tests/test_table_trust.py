"""The files a sweep or merge reads and the folders it writes, under hostile or careless use: two
sweeps into one folder, a table with wrongly typed rows, a part claiming absurd counts, an output
linked onto an input, a broken adapter entry point. Each is a one-line refusal (exit 2) that loses
nothing, or the right verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_run import run_cli, run_cli_process

ROOT = Path(__file__).resolve().parents[1]
LIB = "tests.fixtures.fakelib"
# the caller's PYTHONPATH after ours: an earlier package copy put there is what runs (for "before" figures)
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def cli(*args: str, env: dict[str, str] | None = None,
        timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """In this process; in a process of its own where the process is what is tested (``timeout``)."""
    if timeout is None:
        return run_cli(*args, env=env or ENV)
    return run_cli_process(*args, env=env or ENV, timeout=timeout)


def one_line_refusal(proc: subprocess.CompletedProcess[str], words: str) -> None:
    __tracebackhide__ = True
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert words in proc.stderr, proc.stderr


def build_only_table(out: Path, match: str = "(Good|NoScale)Attention$") -> dict:
    proc = cli("sweep", LIB, "--out", str(out), "--build-only", "--match", match)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads((out / "sweep.json").read_text())


@pytest.mark.integration
def test_two_sweeps_into_one_folder_keep_every_row(tmp_path: Path) -> None:
    """The first holds the folder while it builds (a class that hangs for --build-timeout); the
    second, started meanwhile, is refused at once and writes nothing; run after, it adds its rows
    and the first's stay."""
    out = tmp_path / "s"
    first = subprocess.Popen([sys.executable, "-m", "mha_verify.cli", "sweep", LIB, "--out", str(out),
                              "--build-only", "--match", "(Good|Hanging)Attention$", "--build-timeout", "20"],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    lock = out / ".mha-verify.lock"
    deadline = time.monotonic() + 60
    while not (lock.is_file() and lock.read_text().strip() == str(first.pid)):
        assert time.monotonic() < deadline and first.poll() is None, "the first sweep never took the folder"
        time.sleep(0.2)
    # processes of their own, as two CI jobs sharing a folder would be
    second = cli("sweep", LIB, "--out", str(out), "--build-only", "--match", "NoScaleAttention$", timeout=120)
    one_line_refusal(second, "is being written by another mha-verify run")
    assert str(first.pid) in second.stderr
    stdout, stderr = first.communicate(timeout=120)
    assert first.returncode == 0, stdout + stderr
    rows = {r["spec"].rpartition(":")[2]: r["status"] for r in json.loads((out / "sweep.json").read_text())["rows"]}
    assert rows == {"GoodAttention": "built", "HangingAttention": "hung while built"}

    again = cli("sweep", LIB, "--out", str(out), "--build-only", "--match", "NoScaleAttention$", timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    rows = {r["spec"].rpartition(":")[2]: r["status"] for r in json.loads((out / "sweep.json").read_text())["rows"]}
    assert rows == {"GoodAttention": "built", "HangingAttention": "hung while built", "NoScaleAttention": "built"}


@pytest.mark.deep
@pytest.mark.parametrize(("field", "value", "words"), [
    ("verified", "3", "'verified' must be a count, got '3'"),
    ("causes", {"a cause": "oracle_agreement"}, "'causes' must be {cause: [check, ...]}"),
    ("reason", 7, "'reason' must be a text, got 7"),
    ("status", "judged", "'status' must be one of"),
    ("check_seconds", -1, "'check_seconds' must be seconds >= 0"),
], ids=["verified-text", "causes-dict", "reason-number", "status-unknown", "seconds-negative"])
def test_a_table_with_a_wrongly_typed_row_is_refused_and_kept(field: str, value: object, words: str,
                                                              tmp_path: Path) -> None:
    out = tmp_path / "s"
    doc = build_only_table(out)
    doc["rows"][1][field] = value
    text = json.dumps(doc)
    (out / "sweep.json").write_text(text)
    proc = cli("sweep", LIB, "--out", str(out), "--build-only", "--match", "(Good|NoScale)Attention$")
    one_line_refusal(proc, words)
    assert "row 2" in proc.stderr
    assert (out / "sweep.json").read_text() == text  # nothing of it rewritten


def test_a_costs_file_nested_too_deep_is_refused(tmp_path: Path) -> None:
    costs = tmp_path / "costs.json"
    costs.write_text("[" * 200_000 + "]" * 200_000)
    proc = cli("sweep", LIB, "--out", str(tmp_path / "s"), "--build-only", "--shard", "1/2", "--costs", str(costs))
    one_line_refusal(proc, "is nested deeper than")


def _shard_tables(tmp_path: Path) -> list[Path]:
    parts = []
    for i in (1, 2):
        out = tmp_path / f"part{i}"
        proc = cli("sweep", LIB, "--out", str(out), "--build-only", "--match", "(Good|NoScale)Attention$",
                   "--shard", f"{i}/2")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        parts.append(out / "sweep.json")
    return parts


@pytest.mark.deep
def test_merge_refuses_an_output_linked_onto_a_part_and_a_build_only_part_beside_a_checked_one(
        tmp_path: Path) -> None:
    one, two = _shard_tables(tmp_path)
    before = one.read_text()
    out = tmp_path / "merged"
    out.mkdir()
    (out / "sweep.md").symlink_to(one)
    one_line_refusal(cli("merge", "--out", str(out), str(one), str(two)), "is one of the parts being merged")
    assert one.read_text() == before

    # a shard whose class crashed in its check beside a --build-only shard is not a build-only sweep
    doc = json.loads(two.read_text())
    doc["shard"]["build_only"] = False
    doc["rows"][0].update(status="check crashed", reason="exited with code -11")
    two.write_text(json.dumps(doc))
    one_line_refusal(cli("merge", "--out", str(tmp_path / "m2"), str(one), str(two)),
                     "one is a --build-only sweep and the other checked its classes")


@pytest.mark.deep
@pytest.mark.parametrize(("edit", "words"), [
    (lambda d: d["shard"].update(count=10**18), "shard count must be in 1..1000"),
    (lambda d: d["rows"][0].update(verified="3"), "'verified' must be a count"),
], ids=["count-1e18", "verified-text"])
def test_merge_refuses_a_sweep_part_with_absurd_fields(edit, words: str, tmp_path: Path) -> None:
    one, two = _shard_tables(tmp_path)
    doc = json.loads(one.read_text())
    edit(doc)
    one.write_text(json.dumps(doc))
    start = time.perf_counter()
    one_line_refusal(cli("merge", "--out", str(tmp_path / "m"), str(one), str(two)), words)
    assert time.perf_counter() - start < 60


@pytest.mark.integration
def test_merge_refuses_a_check_part_whose_counts_shift_results_between_tasks(tmp_path: Path) -> None:
    """2 results for one task and -1 for another add up, and would move a result onto the wrong
    task and drop a check from the merge."""
    parts = []
    for i in (1, 2):
        report = tmp_path / f"{i}.json"
        proc = cli("check", "--no-export", "--only", "rows_sum_to_one,determinism", "--max-examples", "3",
                   "--shard", f"{i}/2", "--report", str(report), timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        parts.append(report)
    doc = json.loads(parts[0].read_text())
    (name, n), = doc["shard"]["mine"]
    doc["shard"]["mine"] = [[name, n + 1], ["determinism" if name != "determinism" else "rows_sum_to_one", -1]]
    parts[0].write_text(json.dumps(doc))
    one_line_refusal(cli("merge", *map(str, parts), "--report", str(tmp_path / "m.json")), "must be at least 1, got -1")


ENTRY_POINT = """
[mha_verify.adapters]
broken = brokenadapter:Adapter
"""


@pytest.mark.integration
@pytest.mark.parametrize(("body", "words"), [
    ("import sys\nsys.exit(0)\n", "called sys.exit(0) while loading"),
    ("raise RuntimeError('no GPU here')\n", "RuntimeError: no GPU here"),
], ids=["sys-exit-0", "raises"])
def test_a_broken_adapter_entry_point_is_a_usage_error_naming_it(body: str, words: str, tmp_path: Path) -> None:
    """An installed package whose adapter exits or raises while loaded: `check --no-isolation`
    exited 0 with no output, `list` printed a traceback."""
    (tmp_path / "brokenadapter.py").write_text(body)
    dist = tmp_path / "brokenadapter-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: brokenadapter\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINT)
    env = {**ENV, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ENV['PYTHONPATH']}"}
    for args in (["list"], ["check", "--no-isolation", "--no-export", "--only", "determinism",
                            "--max-examples", "2"]):
        proc = cli(*args, env=env, timeout=300)
        one_line_refusal(proc, "entry point broken = brokenadapter:Adapter (mha_verify.adapters)")
        assert words in proc.stderr


@pytest.mark.parametrize("command", [["check", "--no-export"], ["sweep", LIB, "--out", "unused"]],
                         ids=["check", "sweep"])
def test_more_jobs_than_cores_are_refused(command: list[str]) -> None:
    from mha_verify.arg_types import usable_cores

    proc = cli(*command, "--jobs", str(usable_cores() + 1))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"expected at most {usable_cores()} (the cores this machine lets it use)" in proc.stderr
