"""Run checks in a worker process, so that a crash, hang or memory blow-up inside the target or
onnxruntime becomes that check's failure instead of a dead gate.

One worker runs the tasks in order (imports are paid once). A task that does not finish in
``timeout`` seconds, or during which the worker dies (segfault, out of memory), is reported
as a failed CheckResult; a new worker takes the remaining tasks.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from properties.results import CheckResult

Task = tuple[str, dict[str, Any]]  # (function name in mha_verify.gate, keyword arguments)


@dataclass(frozen=True)
class Limits:
    timeout: float = 900.0  # seconds per task
    memory_gb: float | None = 16.0  # address-space limit of the worker (None: no limit)


def _worker(conn: Connection, memory_gb: float | None) -> None:
    if memory_gb is not None:
        import resource

        limit = int(memory_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    from mha_verify import gate

    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        name, kwargs = task
        try:
            results = getattr(gate, name)(**kwargs)
            conn.send(("ok", results))
        except BaseException as exc:  # reported by the parent as this task's failure
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


class Isolated:
    """A lazily started worker; ``run(task)`` returns its results or a failure result."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        # fork on Linux: the worker starts with torch already imported (spawn would import it
        # again, ~3 s); elsewhere spawn, the only safe choice on macOS
        self._ctx: Any = mp.get_context("fork" if sys.platform == "linux" else "spawn")
        self._proc: Any = None
        self._conn: Connection | None = None

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_worker, args=(child, self.limits.memory_gb), daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(5)
        self._proc, self._conn = None, None

    def run(self, task: Task, *, name: str, stage: str) -> list[CheckResult]:
        if self._proc is None or not self._proc.is_alive():
            self._start()
        assert self._conn is not None
        start = time.perf_counter()
        self._conn.send(task)
        failure: str
        try:
            if self._conn.poll(self.limits.timeout):
                status, payload = self._conn.recv()
                if status == "ok":
                    return list(payload)
                failure = f"the check itself raised {payload}"
            else:
                failure = f"timed out after {self.limits.timeout:g} s (hang?)"
                self._kill()
        except (EOFError, ConnectionError, OSError):
            self._proc.join(5)
            failure = f"the worker process {_describe_exit(self._proc.exitcode)} (crash or out of memory)"
            self._kill()
        return [CheckResult(name, stage, "fail", seconds=time.perf_counter() - start, reason=failure)]

    def close(self) -> None:
        if self._conn is not None and self._proc is not None and self._proc.is_alive():
            with contextlib.suppress(OSError):
                self._conn.send(None)
            self._proc.join(10)
        self._kill()


def run_tasks(tasks: Sequence[tuple[str, str, Task]], *, limits: Limits | None,
              progress: Callable[[str], None] | None = None) -> list[CheckResult]:
    """Run (name, stage, task) in order: in a worker process, or in this one when ``limits`` is None."""
    from mha_verify import gate

    results: list[CheckResult] = []
    worker = Isolated(limits) if limits is not None else None
    try:
        for name, stage, task in tasks:
            if progress:
                progress(f"{stage}/{name}")
            if worker is None:
                results += getattr(gate, task[0])(**task[1])
            else:
                results += worker.run(task, name=name, stage=stage)
    finally:
        if worker is not None:
            worker.close()
    return results
