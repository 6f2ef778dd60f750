"""The check worker: no deadlock when the target ran parallel ops before the worker started,
and a default timeout that turns a hang into a failure in about a minute."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mha_verify.isolation import MIN_TIMEOUT, Limits
from mha_verify.properties.engine.profiles import PROFILES
from mha_verify.tasks import Task

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.integration
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


@pytest.mark.parametrize(("examples", "seconds"), [
    pytest.param(PROFILES["quick"].max_examples, MIN_TIMEOUT, id="quick"),
    pytest.param(PROFILES["ci"].max_examples, 60.0, id="ci"),
    pytest.param(PROFILES["thorough"].max_examples, 600.0, id="thorough"),
    pytest.param(500, 300.0, id="max-examples"),
    pytest.param(None, MIN_TIMEOUT, id="no-examples"),
])
def test_default_timeout_is_about_a_minute_and_scales_with_examples(examples: int | None, seconds: float) -> None:
    assert Limits().timeout_for(Task("p", "properties", "property_check", examples=examples)) == pytest.approx(seconds)


def test_an_explicit_timeout_wins() -> None:
    assert Limits(timeout=8).timeout_for(Task("p", "properties", "property_check", examples=1000)) == 8.0


def _property_task(name: str, target: str | None) -> Task:
    return Task(name, "properties", "property_check", dict(
        target_spec=target, adapter=None, name=name, profile="ci", max_examples=3, database=None, seed=None,
        replay=None), examples=3)


@pytest.mark.integration
def test_two_workers_keep_the_order_of_the_tasks_and_a_crash_stays_in_its_task() -> None:
    from mha_verify.isolation import run_tasks

    tasks = [
        _property_task("determinism", None),
        _property_task("oracle_agreement", "tests/fixtures/bad_targets.py:Segfaults"),
        _property_task("lk_equals_lv", None),
        _property_task("rows_sum_to_one", None),
    ]
    started: list[str] = []
    # the last task ranks first: handed out first, reported last
    results = run_tasks(tasks, limits=Limits(timeout=120), jobs=2, progress=started.append,
                        rank=lambda t: 0 if t.name == "rows_sum_to_one" else 1)
    assert started[0] == "properties/rows_sum_to_one"
    assert [r.name for r in results] == ["determinism", "oracle_agreement", "lk_equals_lv", "rows_sum_to_one"]
    verdicts = {r.name: r.verdict for r in results}
    assert verdicts == {"determinism": "pass", "oracle_agreement": "fail", "lk_equals_lv": "pass",
                        "rows_sum_to_one": "pass"}, results
    assert "killed by SIGSEGV" in (results[1].reason or "")


@pytest.mark.parametrize("jobs", [0, -1, 1.5, True])
def test_jobs_must_be_a_positive_integer(jobs: object) -> None:
    from mha_verify.isolation import run_tasks

    with pytest.raises(ValueError, match="jobs must be a positive integer"):
        run_tasks([], limits=None, jobs=jobs)  # type: ignore[arg-type]


def test_an_export_task_gets_three_times_the_timeout_of_a_property() -> None:
    from mha_verify.isolation import EXPORT_TIMEOUT_FACTOR

    assert EXPORT_TIMEOUT_FACTOR == 3.0
    export = Task("export-dynamo", "export", "export_checks", examples=100, timeout_factor=EXPORT_TIMEOUT_FACTOR)
    assert Limits().timeout_for(export) == pytest.approx(3 * MIN_TIMEOUT)
    assert Limits(timeout=8).timeout_for(export) == 8.0


def test_the_preload_of_a_library_is_found_from_the_target_without_importing_it() -> None:
    from mha_verify.isolation import LIBRARY_PRELOAD, preload_for

    assert preload_for(None) == [] and preload_for("tests/fixtures/x.py:Layer") == []
    assert preload_for("no_such_library_xyz.models:Layer") == []
    assert preload_for("mha_verify.mha:MultiHeadAttention") == []
    for library, modules in LIBRARY_PRELOAD.items():
        installed = importlib.util.find_spec(library) is not None
        assert preload_for(f"{library}.models.x:Layer") == (list(modules) if installed else [])


_PRELOAD_SCRIPT = """
import json
import sys
from mha_verify import isolation
isolation.start_server(sys.argv[1])
ctx = isolation._context()
out = ctx.Queue()
p = ctx.Process(target=__import__("tests.fixtures.preload_probe", fromlist=["x"]).inherited_and_parallel,
                args=(isolation.preload_for(sys.argv[1]), out))
p.start()
print(json.dumps(out.get(timeout=120)))
p.join(10)
"""


@pytest.mark.parametrize("library", ["transformers", "diffusers"])
def test_a_worker_inherits_the_librarys_modules_and_still_runs_parallel_ops(library: str) -> None:
    pytest.importorskip(library)
    from mha_verify.isolation import LIBRARY_PRELOAD

    # two OpenMP threads: with one, libgomp never starts a pool and a poisoned fork would not hang
    env = dict(os.environ, OMP_NUM_THREADS="2", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", _PRELOAD_SCRIPT, f"{library}.models.x:Layer"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    had, threads, finite = json.loads(proc.stdout.strip().splitlines()[-1])
    assert had == list(LIBRARY_PRELOAD[library]) and threads == 2 and finite, proc.stdout


@pytest.mark.integration
def test_the_memory_limit_is_headroom_over_what_the_worker_has_mapped() -> None:
    """A budget of 256 MiB is below the address space torch alone maps in the worker (as a total it
    would not let the worker import torch), yet a small check runs in it: the limit is what a task
    may add. A task that allocates past its headroom still fails, in its worker, as its failure."""
    from mha_verify.isolation import _mapped_bytes, run_tasks

    mapped = _mapped_bytes()
    assert mapped is None or mapped > 2**28  # this process (torch imported) maps more than the budget itself
    results = run_tasks([_property_task("determinism", None)], limits=Limits(timeout=120, memory_gb=0.25), jobs=1)
    assert [r.verdict for r in results] == ["pass"], results
    big = Task("oracle_agreement", "properties", "property_check", dict(
        target_spec="tests/fixtures/bad_targets.py:Allocates", adapter=None, name="oracle_agreement", profile="ci",
        max_examples=1, database=None, seed=None, replay=None), examples=1)
    (result,) = run_tasks([big], limits=Limits(timeout=120, memory_gb=0.25), jobs=1)
    assert result.verdict == "fail", result
