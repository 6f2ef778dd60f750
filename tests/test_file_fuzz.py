"""Every JSON file format the tool reads, fuzzed: merge parts (check reports and sweep tables), a
sweep's own sweep.json, --costs and baselines. Each drawn file is a valid one with one hostile
change (a field of the wrong type, a huge or negative count, a deleted key, deep nesting, broken
text); the command that reads it ends in a result or a one-line usage error (exit 2), never a
traceback. The valid files themselves are accepted, so the refusals are the changes' doing.

The documents are written by the tool's own writers (``report_json`` through ``gate_outputs``,
``sweep.write_table``, ``baseline.document``), and the commands run in this process.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mha_verify import baseline, gate_outputs, sweep
from mha_verify.cli import main
from mha_verify.properties.engine.results import CheckResult
from mha_verify.sweep_rows import Row

TASKS = ["determinism", "rows_sum_to_one"]
CONTEXT = {"library": "tests.fixtures.fakelib", "library_version": "unknown", "mha_verify": "0", "torch": "0",
           "profile": "quick", "max_examples": ""}
SPECS = ["tests.fixtures.fakelib.layers:GoodAttention", "tests.fixtures.fakelib.layers:NoScaleAttention"]

HOSTILE_VALUES = st.one_of(
    st.sampled_from([None, True, False, 0, -1, 1, 10**18, -(10**18), 1.5, float("nan"), float("inf"), "", "3",
                     "nan", "x" * 5000, [], {}, [1, "a", None], {"a": {"b": []}}, "\x1b[31mred\x1b[0m"]),
    st.text(max_size=20), st.integers(), st.floats(allow_nan=True),
    st.recursive(st.none() | st.integers() | st.text(max_size=5), lambda c: st.lists(c, max_size=3)
                 | st.dictionaries(st.text(max_size=5), c, max_size=3), max_leaves=8),
)


def _paths(doc: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in ``doc`` a value sits (dict keys and list indices from the top)."""
    found = [at]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += _paths(value, (*at, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            found += _paths(value, (*at, i))
    return found


@st.composite
def hostile_text(draw: st.DrawFn, valid: Any) -> bytes:
    """``valid`` as JSON text with one hostile change."""
    how = draw(st.sampled_from(["replace", "replace", "replace", "delete", "deep", "truncate", "bytes"]))
    if how == "deep":
        return b"[" * 200_000 + b"]" * 200_000
    if how == "bytes":
        return draw(st.sampled_from([b"", b"\xff\xfe{", b"{" * 3, b"null", b"[]", b'"text"', b"1e999999",
                                     b"9" * 5000]))
    text = json.dumps(valid)
    if how == "truncate":
        return text[: draw(st.integers(0, max(0, len(text) - 1)))].encode()
    doc = copy.deepcopy(valid)
    path = draw(st.sampled_from(_paths(doc)[1:]))
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    if how == "delete":
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(HOSTILE_VALUES)
    return json.dumps(doc, allow_nan=True).encode()


def _run(argv: list[str]) -> tuple[int, str]:
    """(exit code, stderr) of ``mha-verify ARGV`` in this process; a traceback is code -2."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else -1
        except BaseException as exc:  # the failure this test exists to find
            return -2, f"Traceback: {type(exc).__name__}: {exc}"[:2000]
    return code, err.getvalue()


def _check_parts() -> list[dict[str, Any]]:
    parts = []
    for index, task in enumerate(TASKS, 1):
        result = CheckResult(task, "properties", "pass", examples=3, worst_error=1e-7, allowed=1e-6, seconds=0.5)
        shard = {"index": index, "count": 2, "tasks": TASKS, "options": {"dtype": "float32", "max_examples": 3},
                 "mine": [[task, 1]]}
        docs = gate_outputs.render([result], ["report"], target="mha_verify.mha:MultiHeadAttention",
                                   profile="quick", seed=0, versions={"torch": "0"}, shard=shard)
        parts.append(json.loads(docs["report"]))
    return parts


def _sweep_parts(tmp: Path) -> list[dict[str, Any]]:
    parts = []
    for index, spec in enumerate(SPECS, 1):
        row = Row(spec, "layers.py", status="passed", built_as="X(d_model=8)", counts={"pass": 20}, verified=20,
                  findings={"precision policy: float32 softmax": ["gradcheck"]}, build_seconds=2.0,
                  check_seconds=9.5)
        folder = tmp / f"template{index}"
        folder.mkdir(exist_ok=True)
        sweep.write_table(folder, [row], CONTEXT, "mha-verify sweep",
                          {"index": index, "count": 2, "specs": SPECS, "build_only": False})
        parts.append(json.loads((folder / "sweep.json").read_text()))
    return parts


def _verdict_or_refusal(code: int, err: str, what: str) -> None:
    __tracebackhide__ = True
    assert code in (0, 1, 2), f"{what}: exit {code}: {err}"
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("mha-verify: error: "), f"{what}: {err!r}"


FUZZ = settings(max_examples=100, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.mark.parametrize("which", [0, 1], ids=["first-part", "second-part"])
@FUZZ
@given(data=st.data())
def test_merge_of_check_reports_fuzzed(which: int, data: st.DataObject, tmp_path: Path) -> None:
    parts = _check_parts()
    paths = [tmp_path / "1.json", tmp_path / "2.json"]
    for path, doc in zip(paths, parts, strict=True):
        path.write_text(json.dumps(doc))
    if data.draw(st.booleans(), label="change a part"):
        paths[which].write_bytes(data.draw(hostile_text(parts[which]), label="part"))
    else:  # the valid parts merge
        assert _run(["merge", *map(str, paths)])[0] == 0
    code, err = _run(["merge", *map(str, paths), "--report", str(tmp_path / "merged.json")])
    _verdict_or_refusal(code, err, "merge")


@FUZZ
@given(data=st.data())
def test_merge_of_sweep_tables_fuzzed(data: st.DataObject, tmp_path: Path) -> None:
    parts = _sweep_parts(tmp_path)
    paths = [tmp_path / "template1" / "sweep.json", tmp_path / "template2" / "sweep.json"]
    out = tmp_path / "merged"
    if data.draw(st.booleans(), label="change a part"):
        paths[0].write_bytes(data.draw(hostile_text(parts[0]), label="part"))
    else:
        assert _run(["merge", "--out", str(out), *map(str, paths)])[0] == 0
    code, err = _run(["merge", "--out", str(out), *map(str, paths)])
    _verdict_or_refusal(code, err, "merge --out")


@FUZZ
@given(data=st.data())
def test_a_sweeps_own_table_and_costs_fuzzed(data: st.DataObject, tmp_path: Path) -> None:
    """The sweep reads its folder's sweep.json (to resume) and --costs before it builds anything;
    both readers are called as the sweep calls them."""
    valid = _sweep_parts(tmp_path)[0]
    path = tmp_path / "template1" / "sweep.json"
    changed = data.draw(st.booleans(), label="change it")
    if changed:
        path.write_bytes(data.draw(hostile_text(valid), label="table"))
    for read in (lambda: sweep.load_previous(path.parent, CONTEXT), lambda: sweep.measured_costs(path)):
        try:
            got = read()
        except ValueError as exc:
            assert changed and "\n" not in str(exc), str(exc)
        else:
            assert isinstance(got, dict) and (changed or len(got) == 1)


@FUZZ
@given(data=st.data())
def test_baselines_fuzzed(data: st.DataObject, tmp_path: Path) -> None:
    context = {"target": "t", "dtype": "float32", "profile": "quick"}
    result = CheckResult("determinism", "properties", "pass", examples=3, worst_error=1e-7, allowed=1e-6)
    valid = json.loads(baseline.document([result], context))
    path = tmp_path / "baseline.json"
    changed = data.draw(st.booleans(), label="change it")
    path.write_bytes(data.draw(hostile_text(valid), label="baseline") if changed else json.dumps(valid).encode())
    try:
        stored = baseline.load(str(path), context)
    except ValueError as exc:
        assert changed and "\n" not in str(exc), str(exc)
    else:
        assert all(isinstance(v, float) for v in stored.values()) and (changed or stored)
    try:
        baseline.previous(str(path))
    except ValueError as exc:
        assert changed and "\n" not in str(exc), str(exc)
