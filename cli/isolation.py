"""Run checks in a worker process, so that a crash, hang or memory blow-up inside the target or
onnxruntime becomes that check's failure instead of a dead gate.

``jobs`` workers (one per core by default, see :func:`default_jobs`) take the tasks from one
queue; each runs its tasks in turn (imports are paid once per worker, and a worker's torch
gets ``cores // jobs`` threads, so workers do not fight over cores). A task that does not
finish in ``timeout`` seconds, or during which its worker dies (segfault, out of memory), is
reported as a failed CheckResult; a new worker takes that worker's remaining tasks. Results
come back in the order of the tasks, whatever order they finished in.

How the worker starts (measured on Linux, 2 cores, torch 2.13 CPU; time from
``Process.start`` to the reply of a task that imports ``mha_verify.gate`` and runs a parallel
op, in a parent that already ran parallel ops, as a nanoGPT-style ``__init__`` does with
``torch.tril``):

=====================================  =============================================
fork (before)                          deadlocks: libgomp's thread pool does not survive
                                       fork, the child's first parallel op never returns
fork, child sets 1 torch thread        0.4-1.1 s; relies on libgomp skipping the pool
                                       with one thread, and the worker runs single-threaded
spawn                                  2.2-2.8 s for every worker (imports torch again)
forkserver                             1.9-2.2 s for every worker
forkserver, torch + gate preloaded     2.1 s for the first worker, 0.05 s for each later one
=====================================  =============================================

We use the last: the server process is exec'd fresh and imports torch without running an op,
so its children never inherit a started thread pool, whatever the target did at import or
construction in the parent; a replacement worker after a hang or crash starts in 0.05 s;
and in one pytest process the server is started once for all tests. Python 3.14 made
forkserver its default on Linux for the same reason. Elsewhere spawn (macOS, Windows).

A fork-before-threads design (fork the worker before the target is loaded) was rejected: the
CLI loads the target before it runs tasks, and a replacement worker would be forked from the
poisoned parent.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from mha_verify.properties.engine.results import CheckResult
from mha_verify.tasks import Task

PRELOAD = ["torch", "mha_verify.gate"]  # imported once by the fork server, inherited by each worker

#: the modules of a library that every layer of it imports, imported by the fork server as well
#: when the target is in that library: else the probe and every worker import them again (about
#: 2.5 s each for transformers' modeling_utils on this 2-core machine, twice per class of a
#: sweep). Only these, never the target's own module: the server's children inherit whatever it
#: did at import, and a module that runs a parallel torch op there would start the thread pool
#: that deadlocks them (see above). These import without running a torch op (transformers 5.24,
#: diffusers 0.42; `tests/test_isolation.py` checks that a worker forked after them still runs
#: parallel ops). A library that is not installed is skipped.
LIBRARY_PRELOAD: dict[str, tuple[str, ...]] = {
    "transformers": ("transformers.modeling_utils",),
    "diffusers": ("diffusers.models.attention_processor",),
}

#: a task that runs Hypothesis examples gets TIMEOUT_PER_EXAMPLE seconds per example, at least
#: MIN_TIMEOUT: 60 s for the ci profile's 100 examples (its slowest property takes ~4 s), 600 s
#: for thorough's 1000. A hang becomes a failure in about a minute. The export of one exporter
#: and the validation of its model (~17 checks of half the examples each, ~19 s at ci for the
#: dynamo exporter on an idle machine) get EXPORT_TIMEOUT_FACTOR times that: a machine shared
#: with other work slows them threefold, and a timeout must not be what fails a healthy export.
MIN_TIMEOUT = 60.0
TIMEOUT_PER_EXAMPLE = 0.6
EXPORT_TIMEOUT_FACTOR = 3.0


@dataclass(frozen=True)
class Limits:
    timeout: float | None = None  # seconds per task; None: from the task's example count (see timeout_for)
    # address space a task may add to what the worker had mapped when the task started (None: no
    # limit): a headroom, not a total, so the libraries a target imports (numba's and OpenBLAS's
    # reservations run to gigabytes of address space they never touch) do not eat an example's memory
    memory_gb: float | None = 16.0
    torch_threads: int | None = None  # torch's intra-op threads in the worker (None: torch's default)

    def timeout_for(self, task: Task) -> float:
        """The explicit timeout, else MIN_TIMEOUT or TIMEOUT_PER_EXAMPLE x the task's examples, times
        the task's ``timeout_factor``."""
        if self.timeout is not None:
            return float(self.timeout)
        return task.timeout_factor * max(MIN_TIMEOUT, TIMEOUT_PER_EXAMPLE * (task.examples or 0))


_preload: list[str] = list(PRELOAD)  # what the server imports, once it is started (start_server may add)


def preload_for(target_spec: str | None) -> list[str]:
    """The :data:`LIBRARY_PRELOAD` modules of the library ``target_spec`` ("pkg.module:Class" or a
    path) is in, if it is installed; found without importing anything."""
    import importlib.util

    if not target_spec or ":" not in target_spec:
        return []
    library = target_spec.partition(":")[0].partition(".")[0]
    modules = LIBRARY_PRELOAD.get(library, ())
    try:
        return list(modules) if modules and importlib.util.find_spec(library) is not None else []
    except (ImportError, ValueError):
        return []


def _context() -> Any:
    """forkserver with torch preloaded on Linux, spawn elsewhere (see the module docstring)."""
    if sys.platform != "linux":
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_preload)
    return ctx


def default_jobs() -> int:
    """Workers for the gate: one per core this process may use."""
    from mha_verify.arg_types import usable_cores

    return usable_cores()


def start_server(target_spec: str | None = None) -> None:
    """Start the fork server now (Linux), so that its imports run beside the caller's own; with
    ``target_spec``, it imports that library's common modules too (:func:`preload_for`).

    The gate calls this before it imports torch and loads the target: the server's 2 s of
    imports then overlap the CLI's instead of following them. A server already running keeps
    what it imported.
    """
    if sys.platform == "linux":
        from multiprocessing import forkserver

        _preload.extend(m for m in preload_for(target_spec) if m not in _preload)
        _context()
        forkserver.ensure_running()


def _worker(conn: Connection, memory_gb: float | None, torch_threads: int | None, tmp: str) -> None:
    if hasattr(os, "setpgrp"):
        # a process group of its own: killing the group also ends whatever the target spawned
        os.setpgrp()
    # every temporary file of the worker (and of what the target starts) goes into a folder the
    # parent removes when the worker ends, however it ends (a killed worker unwinds nothing)
    tempfile.tempdir = tmp
    os.environ["TMPDIR"] = tmp
    if torch_threads is not None:
        import torch

        torch.set_num_threads(torch_threads)
    from mha_verify import gate

    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        fn, kwargs = task
        try:
            if memory_gb is not None:
                _limit_address_space(memory_gb)
            results = getattr(gate, fn)(**kwargs)
            conn.send(("ok", results))
        except BaseException as exc:  # reported by the parent as this task's failure
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


def _mapped_bytes() -> int | None:
    """This process's address space now (``VmSize``), None where /proc does not say."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            line = next((line for line in status if line.startswith("VmSize:")), None)
    except OSError:
        return None
    return None if line is None else int(line.split()[1]) * 1024


def _limit_address_space(memory_gb: float) -> None:
    """The soft address-space limit: what is mapped now plus ``memory_gb`` (the whole limit where the
    mapping cannot be read); the hard limit stays, so the next task's headroom can be set again."""
    import resource

    limit = (_mapped_bytes() or 0) + int(memory_gb * 2**30)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))


def describe_exit(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _kill_group(pid: int | None) -> None:
    """SIGKILL the worker's process group: the worker and every process the target started."""
    if pid is None or not hasattr(os, "killpg"):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


#: every worker alive in this process, so that a SIGTERM or SIGINT ends them all (see stop_all)
_LIVE: set[Isolated] = set()
_LIVE_LOCK = threading.RLock()  # re-entrant: the SIGTERM handler may run while the main thread holds it


def stop_all() -> None:
    """End every live worker, its process group and its temporary folder (the CLI calls it on
    SIGTERM and SIGINT): SIGKILL, since a hung target ignores gentler signals in native code."""
    with _LIVE_LOCK:
        workers = list(_LIVE)
    for worker in workers:
        worker.kill()


class Isolated:
    """A lazily started worker; ``run(task)`` returns its results or a failure result."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._ctx: Any = _context()
        self._proc: Any = None
        self._conn: Connection | None = None
        self._tmp: str | None = None

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._tmp = tempfile.mkdtemp(prefix="mha-verify-worker-")
        self._proc = self._ctx.Process(target=_worker, daemon=True,
                                       args=(child, self.limits.memory_gb, self.limits.torch_threads, self._tmp))
        self._proc.start()
        child.close()
        self._conn = parent
        with _LIVE_LOCK:
            _LIVE.add(self)

    def kill(self) -> None:
        """End the worker and its process group now."""
        self._kill()
        with _LIVE_LOCK:
            _LIVE.discard(self)



    def _kill(self) -> None:
        if self._proc is not None:
            _kill_group(self._proc.pid)
            self._proc.kill()
            self._proc.join(5)
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
        self._proc, self._conn, self._tmp = None, None, None

    def run(self, task: Task) -> list[CheckResult]:
        if self._proc is None or not self._proc.is_alive():
            self._start()
        assert self._conn is not None
        start = time.perf_counter()
        timeout = self.limits.timeout_for(task)
        self._conn.send((task.fn, dict(task.kwargs)))
        failure: str
        try:
            if self._conn.poll(timeout):
                status, payload = self._conn.recv()
                if status == "ok":
                    return list(payload)
                failure = f"the check itself raised {payload}"
            else:
                failure = f"timed out after {timeout:g} s (hang?)"
                self._kill()
        except (EOFError, ConnectionError, OSError):
            self._proc.join(5)
            failure = f"the worker process {describe_exit(self._proc.exitcode)} (crash or out of memory)"
            self._kill()
        return [CheckResult(task.name, task.stage, "fail", seconds=time.perf_counter() - start, reason=failure)]

    def close(self) -> None:
        if self._conn is not None and self._proc is not None and self._proc.is_alive():
            with contextlib.suppress(OSError):
                self._conn.send(None)
            self._proc.join(10)
        self._kill()
        with _LIVE_LOCK:
            _LIVE.discard(self)


def run_tasks(tasks: Sequence[Task], *, limits: Limits | None, progress: Callable[[str], None] | None = None,
              jobs: int = 1, rank: Callable[[Task], int] | None = None) -> list[CheckResult]:
    """Run ``tasks``: in ``jobs`` worker processes, or in this one when ``limits`` is None.

    Tasks are handed out in order of ``rank`` (lowest first, ties in the given order): give the
    longest the lowest, so that no worker is left with a long task at the end. Results keep
    the order of ``tasks``.
    """
    groups = run_task_groups(tasks, limits=limits, progress=progress, jobs=jobs, rank=rank)
    return [r for group in groups for r in group]


def run_task_groups(tasks: Sequence[Task], *, limits: Limits | None, progress: Callable[[str], None] | None = None,
                    jobs: int = 1, rank: Callable[[Task], int] | None = None) -> list[list[CheckResult]]:
    """:func:`run_tasks`, with the results of each task apart: one list per task, in the order of ``tasks``."""
    from mha_verify import gate

    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise ValueError(f"jobs must be a positive integer, got jobs={jobs!r}")
    if limits is None:
        groups: list[list[CheckResult]] = []
        for task in tasks:
            if progress:
                progress(f"{task.stage}/{task.name}")
            try:
                groups.append(list(getattr(gate, task.fn)(**task.kwargs)))
            except (Exception, SystemExit) as exc:  # as the worker reports it: this task's failure
                groups.append([CheckResult(task.name, task.stage, "fail",
                                           reason=f"the check itself raised {type(exc).__name__}: {exc}")])
        return groups
    jobs = min(jobs, len(tasks)) or 1
    if jobs > 1 and limits.torch_threads is None:
        limits = Limits(limits.timeout, limits.memory_gb, torch_threads=max(1, default_jobs() // jobs))
    pending: queue.SimpleQueue[int] = queue.SimpleQueue()
    for i in sorted(range(len(tasks)), key=lambda i: rank(tasks[i])) if rank else range(len(tasks)):
        pending.put(i)
    done: dict[int, list[CheckResult]] = {}
    lock = threading.Lock()

    def serve() -> None:
        worker = Isolated(limits)
        try:
            while True:
                try:
                    i = pending.get_nowait()
                except queue.Empty:
                    return
                task = tasks[i]
                if progress:
                    with lock:
                        progress(f"{task.stage}/{task.name}")
                try:
                    got = worker.run(task)
                except Exception as exc:  # e.g. a task that cannot be pickled: that task's failure
                    got = [CheckResult(task.name, task.stage, "fail",
                                       reason=f"could not run the check: {type(exc).__name__}: {exc}")]
                with lock:
                    done[i] = got
        finally:
            worker.close()

    if jobs == 1:
        serve()
    else:
        threads = [threading.Thread(target=serve, daemon=True) for _ in range(jobs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return [done[i] for i in range(len(tasks))]


def probe(fn: str, kwargs: dict[str, Any], *, what: str, timeout: float | None = None) -> str:
    """Run the loading step ``mha_verify.gate.<fn>`` in a worker, under the checks' limits: the
    reason of its passing result, else a TargetError (a usage error) naming what went wrong.

    A target (or model) that crashes, hangs or exits while it is imported, built or loaded ends
    that worker, not the gate.
    """
    from mha_verify.properties.protocol import TargetError

    worker = Isolated(Limits(timeout=timeout or MIN_TIMEOUT))
    try:
        (result,) = worker.run(Task(what, "load", fn, kwargs))
    finally:
        worker.close()
    if result.verdict == "pass":
        return str(result.reason)
    if result.details.get("usage"):  # the target's own error, already a sentence naming it
        raise TargetError(str(result.reason))
    raise TargetError(f"loading {what} failed: {result.reason}")


def probe_target(target_spec: str | None, adapter: str | None, *, timeout: float | None = None) -> str:
    """Import and build the target in a worker (see :func:`probe`); its spec."""
    return probe("probe_target", {"target_spec": target_spec, "adapter": adapter},
                 what=f"the target {target_spec or 'mha_verify.mha:MultiHeadAttention'}", timeout=timeout)
