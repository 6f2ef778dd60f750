"""Shards and merge: ``check --shard I/N`` in separate processes, merged, gives the single run's
verdicts, order, documents and exit code; parts that are not one whole run are refused."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from mha_verify import report_json
from mha_verify.properties.engine.results import CheckResult
from mha_verify.shards import EXPECTED_SECONDS, Shard, assign, parse_shard, select
from mha_verify.sweep import shard_of
from mha_verify.sweep_classes import Found
from tests.cli_run import run_cli

ROOT = Path(__file__).resolve().parent.parent
MUTANT = "tests/mutants.py:MaskPolarityInverted"
ONLY = ("rows_sum_to_one,determinism,mask_zeroes_weights,fully_masked_rows,lk_equals_lv,mask_broadcast,"
        "query_permutation,bool_equals_additive")


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd)


def popen(*args: str) -> subprocess.Popen[str]:
    """A shard standing in for a machine of its own: one torch thread, so that three of them beside
    another test do not fight over two cores (each took both, and checks ran past their timeout)."""
    return subprocess.Popen([sys.executable, "-m", "mha_verify.cli", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_parse_shard() -> None:
    assert parse_shard("2/3") == Shard(2, 3) and str(Shard(2, 3)) == "2/3"
    for bad in ("0/3", "4/3", "1", "a/b", "1/0", "-1/2", "1/1001"):
        with pytest.raises(Exception, match=f"got {bad!r}"):
            parse_shard(bad)


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7, 30])
def test_every_task_in_exactly_one_shard(count: int) -> None:
    names = list(EXPECTED_SECONDS)
    parts = [select(names, Shard(i, count)) for i in range(1, count + 1)]
    assert sorted(p for part in parts for p in part) == list(range(len(names)))
    assert parts == [select(names, Shard(i, count)) for i in range(1, count + 1)]  # the same on every call


def test_longest_first_balances_the_measured_costs() -> None:
    """Graham's bound for LPT: no shard exceeds the mean load by more than its largest task."""
    costs = list(EXPECTED_SECONDS.values())
    for count in (2, 3, 4):
        owners = assign(costs, count)
        loads = [sum(c for c, o in zip(costs, owners, strict=True) if o == s) for s in range(count)]
        assert max(loads) <= sum(costs) / count + max(costs), (count, loads)
    # three shards of the reference gate: the dynamo export alone, and the rest split around it
    loads3 = sorted(sum(c for c, o in zip(costs, assign(costs, 3), strict=True) if o == s) for s in range(3))
    assert loads3[-1] - loads3[0] < 2.0, loads3


def test_duplicate_task_names_cannot_be_sharded() -> None:
    with pytest.raises(ValueError, match="duplicates"):
        select(["a", "b", "a"], Shard(1, 2))


def test_sweep_shards_deal_classes_in_file_order() -> None:
    found = [Found(f"lib.m{i}:A{i}", f"m{i}.py") for i in range(10)]
    parts = [shard_of(found, Shard(i, 3)) for i in (1, 2, 3)]
    assert [len(p) for p in parts] == [4, 3, 3]
    assert sorted((f.spec for p in parts for f in p), key=lambda s: int(s.split(":A")[1])) == [f.spec for f in found]


def test_sweep_shards_by_measured_costs(tmp_path: Path) -> None:
    """With an earlier sweep's seconds, the one slow class is a shard of its own."""
    from mha_verify.sweep import measured_costs

    found = [Found(f"lib.m{i}:A{i}", f"m{i}.py") for i in range(6)]
    earlier = _sweep_part(1, 1, [f.spec for f in found], [f.spec for f in found])
    for i, row in enumerate(earlier["rows"]):
        row["build_seconds"], row["check_seconds"] = 1.0, 900.0 if i == 0 else 10.0
    (tmp_path / "sweep.json").write_text(json.dumps(earlier))
    costs = measured_costs(tmp_path / "sweep.json")
    assert costs["lib.m0:A0"] == 901.0
    assert [f.spec for f in shard_of(found, Shard(1, 2), costs)] == ["lib.m0:A0"]
    assert len(shard_of(found, Shard(2, 2), costs)) == 5
    (tmp_path / "bad.json").write_text("[]")
    with pytest.raises(ValueError, match=r"not an mha-verify sweep\.json"):
        measured_costs(tmp_path / "bad.json")


@pytest.mark.integration
def test_sharded_check_merges_into_the_single_run(tmp_path: Path) -> None:
    """Three shards as three processes, against a mutant that fails some checks: the merged JSON,
    JUnit and exit code are the single run's."""
    common = ["check", "--target", MUTANT, "--no-export", "--max-examples", "5", "--only", ONLY, "--jobs", "1"]
    procs = [popen(*common, "--shard", f"{i}/3", "--report", str(tmp_path / f"p{i}.json")) for i in (1, 2, 3)]
    single = cli(*common, "--report", str(tmp_path / "single.json"), "--junit", str(tmp_path / "single.xml"))
    codes = [p.wait(timeout=600) for p in procs]
    assert single.returncode == 1, single.stderr
    assert set(codes) <= {0, 1} and 1 in codes, [p.stderr.read() for p in procs if p.stderr]  # type: ignore[union-attr]
    parts = [str(tmp_path / f"p{i}.json") for i in (3, 1, 2)]  # any order
    merged = cli("merge", *parts, "--report", str(tmp_path / "m.json"), "--junit", str(tmp_path / "m.xml"))
    assert merged.returncode == single.returncode, merged.stderr
    one = json.loads((tmp_path / "single.json").read_text())
    both = json.loads((tmp_path / "m.json").read_text())

    def verdicts(doc: dict[str, Any]) -> list[list[object]]:
        # a counterexample whose shrinking a loaded machine cut short (the safety net, said in the
        # reason) depends on the machine's speed: then only the verdict must agree
        keys = ("stage", "name", "verdict", "examples", "worst_error", "allowed", "counterexample", "reason")
        return [[r[k] for k in (keys if "safety net" not in (r["reason"] or "") else keys[:3])]
                for r in doc["results"]]

    assert verdicts(both) == verdicts(one)
    assert both["counts"] == one["counts"] and both["verdict"] == one["verdict"] == "fail"
    assert "shard" not in both
    cases = [[(c.get("name"), c.find("failure") is not None) for c in ET.parse(tmp_path / f).iter("testcase")]
             for f in ("single.xml", "m.xml")]
    assert cases[0] == cases[1] and any(failed for _, failed in cases[0])
    assert merged.stdout.splitlines()[-1] == single.stdout.splitlines()[-1]  # the summary line


def _part(index: int, count: int, tasks: list[str], mine: list[str], *, target: str = "t:A",
          verdict: str = "pass", dtype: str = "float32") -> dict[str, Any]:
    results = [CheckResult(n, "properties", verdict, examples=5) for n in mine]
    shard = {"index": index, "count": count, "tasks": tasks, "mine": [[n, 1] for n in mine],
             "options": {"dtype": dtype, "max_examples": None}}
    return report_json.document(results, target=target, profile="ci", seed=None, shard=shard)


def _write(tmp_path: Path, docs: dict[str, Any]) -> list[str]:
    for name, doc in docs.items():
        (tmp_path / name).write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return [str(tmp_path / n) for n in docs]


TASKS = ["a", "b", "c"]
WHOLE = {"1.json": _part(1, 2, TASKS, ["a", "c"]), "2.json": _part(2, 2, TASKS, ["b"])}
NOT_ONE_RUN = {
    "missing-shard": ({"1.json": WHOLE["1.json"]}, "shards 2/2 are missing"),
    "shard-twice": ({**WHOLE, "3.json": WHOLE["2.json"]}, "shard 2/2 is given twice"),
    "another-target": ({**WHOLE, "2.json": _part(2, 2, TASKS, ["b"], target="u:B")}, "differ in target"),
    "another-dtype": ({**WHOLE, "2.json": _part(2, 2, TASKS, ["b"], dtype="float16")}, "differ in options"),
    "another-task-list": ({**WHOLE, "2.json": _part(2, 2, [*TASKS, "d"], ["b", "d"])}, "different task lists"),
    "task-run-twice": ({**WHOLE, "2.json": _part(2, 2, TASKS, ["b", "c"])}, "run by two shards"),
    "task-lost": ({**WHOLE, "2.json": _part(2, 2, TASKS, [])}, r"no part ran the tasks \['b'\]"),
    "not-a-shard": ({**WHOLE, "2.json": report_json.document([], target="t:A", profile="ci", seed=None)},
                    "run without --shard"),
    "not-json": ({**WHOLE, "2.json": "{not json"}, "is not valid JSON"),
    "bad-verdict": ({**WHOLE, "2.json": {**WHOLE["2.json"], "results": [{"name": "b", "stage": "properties",
                                                                            "verdict": "great"}]}}, "verdict must be"),
    "hostile-field": ({**WHOLE, "2.json": {**WHOLE["2.json"], "results": [{"name": "b", "stage": "properties",
                                                                              "verdict": "pass", "__class__": 1}]}},
                      "unknown fields"),
    "hostile-details": ({**WHOLE, "2.json": {**WHOLE["2.json"], "results": [{
        "name": "b", "stage": "properties", "verdict": "fail", "details": {"heatmap": [1, 2]}}]}},
        r"details\.heatmap must be"),
    "miscounted": ({**WHOLE, "2.json": {**WHOLE["2.json"], "results": []}}, "account for 1 results, it holds 0"),
}


@pytest.mark.parametrize("case", list(NOT_ONE_RUN))
def test_parts_that_are_not_one_run_are_a_usage_error(tmp_path: Path, case: str) -> None:
    docs, message = NOT_ONE_RUN[case]
    out = tmp_path / "merged.json"
    got = cli("merge", *_write(tmp_path, docs), "--report", str(out))
    assert got.returncode == 2, (got.stdout, got.stderr)
    assert len(got.stderr.strip().splitlines()) == 1 and "Traceback" not in got.stderr
    assert re.search(message, got.stderr), got.stderr
    assert not out.exists()


def test_merge_orders_by_the_single_run_and_never_replaces_a_part(tmp_path: Path) -> None:
    parts = _write(tmp_path, WHOLE)
    got = cli("merge", *reversed(parts), "--report", str(tmp_path / "m.json"))
    assert got.returncode == 0, got.stderr
    assert [r["name"] for r in json.loads((tmp_path / "m.json").read_text())["results"]] == TASKS
    before = Path(parts[0]).read_bytes()
    refused = cli("merge", *parts, "--report", parts[0])
    assert refused.returncode == 2 and "is one of the parts being merged" in refused.stderr
    assert Path(parts[0]).read_bytes() == before


def test_merged_parts_that_verified_nothing_fail(tmp_path: Path) -> None:
    docs = {"1.json": _part(1, 2, TASKS, ["a", "c"], verdict="n/a"), "2.json": _part(2, 2, TASKS, ["b"], verdict="n/a")}
    got = cli("merge", *_write(tmp_path, docs))
    assert got.returncode == 1 and "nothing was verified" in got.stderr


def _sweep_part(index: int, count: int, specs: list[str], mine: list[str], status: str = "passed") -> dict[str, Any]:
    from mha_verify.sweep import FORMAT

    rows = [{"spec": s, "path": "x.py", "status": status, "verified": 3} for s in mine]
    ctx = {"library": "lib", "library_version": "1.0", "mha_verify": "0.1.0", "torch": "2.13.0", "profile": "quick",
           "max_examples": ""}
    return {"format": FORMAT, "context": ctx, "command": "mha-verify sweep lib", "totals": {}, "rows": rows,
            "shard": {"index": index, "count": count, "specs": specs}}


def test_sweep_parts_merge_into_one_table(tmp_path: Path) -> None:
    specs = ["l.a:A", "l.b:B", "l.c:C"]
    parts = _write(tmp_path, {"s1.json": _sweep_part(1, 2, specs, ["l.a:A", "l.c:C"]),
                              "s2.json": _sweep_part(2, 2, specs, ["l.b:B"], status="failed")})
    got = cli("merge", *parts, "--out", str(tmp_path / "all"))
    assert got.returncode == 1, got.stderr  # a class failed
    doc = json.loads((tmp_path / "all" / "sweep.json").read_text())
    assert [r["spec"] for r in doc["rows"]] == specs and doc["totals"]["failed"] == 1
    assert "| `B (l.b)` | FAIL |" in (tmp_path / "all" / "sweep.md").read_text()
    lost = cli("merge", parts[0], "--out", str(tmp_path / "half"))
    assert lost.returncode == 2 and "shards 2/2 are missing" in lost.stderr
    mixed = cli("merge", parts[0], *_write(tmp_path, {"c.json": WHOLE["1.json"]}), "--out", str(tmp_path / "x"))
    assert mixed.returncode == 2 and "mix sweep tables and check reports" in mixed.stderr


@pytest.mark.serial
@pytest.mark.deep
def test_whole_gate_in_three_shards_equals_the_single_run(tmp_path: Path) -> None:
    """The gate on the reference, exports included: three processes standing in for three machines."""
    # a timeout of 300 s per check: this test is about the merge, and three shards beside another
    # test on two cores run each check several times slower than an idle machine
    procs = [popen("--shard", f"{i}/3", "--jobs", "1", "--timeout", "300", "--report", str(tmp_path / f"p{i}.json"))
             for i in (1, 2, 3)]
    outs = [p.communicate(timeout=900) for p in procs]
    failed = {i + 1: [f"{r['name']}: {r['reason']}" for r in json.loads((tmp_path / f"p{i + 1}.json").read_text())[
        "results"] if r["verdict"] == "fail"] for i in range(3) if (tmp_path / f"p{i + 1}.json").exists()}
    assert [p.returncode for p in procs] == [0, 0, 0], (failed, [err[-2000:] for _, err in outs])
    single = cli("--timeout", "300", "--report", str(tmp_path / "single.json"))
    merged = cli("merge", *(str(tmp_path / f"p{i}.json") for i in (1, 2, 3)), "--report", str(tmp_path / "m.json"))
    assert single.returncode == merged.returncode == 0, merged.stderr
    one, both = (json.loads((tmp_path / f).read_text())["results"] for f in ("single.json", "m.json"))
    key = ("stage", "name", "verdict", "examples")
    assert [[r[k] for k in key] for r in both] == [[r[k] for k in key] for r in one]
