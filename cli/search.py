"""``mha-verify search``: the property suite searched for hours on a Dask cluster, every worker
feeding one example database.

The engine is Dask's (``distributed``, BSD-3-Clause, an optional extra): a ``LocalCluster`` of
``workers`` processes on this machine, or the scheduler of a cluster spanning machines
(``dask scheduler`` on one, ``dask worker tcp://HOST:8786`` on each). Dask places the rounds,
restarts a worker that died and spreads the work as workers join or leave; this module only
says what a round is and when to stop.

A round (:func:`mha_verify.gate.search_round`) is one property against the target: ``examples``
random examples from a seed no round used before, after the failures stored in the database
for that (property, target) are replayed. Rounds go round-robin over the properties that can
still fail, as many in flight as the cluster has threads. A property stops being searched at
its first failure (Hypothesis has shrunk it and saved it in the database, where every later
``check`` with that ``--database`` replays it first) or when it turns out not to apply.
Nothing is submitted after ``seconds``; rounds still running then get ``grace`` seconds, and
what has not finished by then is cancelled and not counted.

Choice of engine (measured on this machine, 2 cores, torch 2.13 CPU, Hypothesis 6.170):
HypoFuzz 25.11 is the coverage-guided engine made for this, but its licence forbids commercial
CI use without a paid licence, it adds 54 MiB (black, libcst, trio, a web dashboard), it crashes
after its first failure with Hypothesis >= 6.157 (``slice_comments`` was renamed), it keys the
database by pytest node id where ``pytest`` does not (its failures are not replayed), and it did
not find an integer needle (x % 9973 == 17 and x > 500000) in 300 s. Ray spans machines too but
its wheel alone is 79 MB. pytest-xdist (already a test dependency) spreads over one machine's
cores only. Dask adds 39 MiB, takes our gate's tasks as they are (plain functions of picklable
arguments), and runs from one machine to many with the same code.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from asyncio import CancelledError
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from mha_verify.properties.engine.results import CheckResult

#: seconds a round still running at the deadline may take to finish
GRACE = 60.0
#: seconds a scheduler may take to answer one request (the connection with its handshake, a
#: result, a cancellation): Dask's own timeouts leave the handshake and an rpc unbounded, so a
#: server that accepts and never answers would hang the search past its deadline
ANSWER = 10.0

T = TypeVar("T")


def _within(seconds: float, what: str, call: Callable[[], T]) -> T:
    """``call()``, or TimeoutError naming ``what`` when it has not returned in ``seconds``.

    It runs in a daemon thread, left behind when it hangs: a Dask call blocked on a silent
    socket cannot be interrupted, but it must not hold the process (or its exit) with it.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True, name=f"mha-verify: {what}")
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"{what} did not answer in {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


@dataclass(frozen=True)
class SearchOptions:
    target: str | None
    adapter: str | None
    database: str
    seconds: float
    names: tuple[str, ...]
    workers: int = 1
    scheduler: str | None = None
    examples: int = 200
    seed: int = 0
    dtype: str = "float32"


@dataclass
class _Tally:
    rounds: int = 0
    examples: int = 0
    seconds: float = 0.0
    worst: CheckResult | None = None
    found: CheckResult | None = None
    found_after: float = 0.0
    not_applicable: CheckResult | None = None
    warnings: list[str] = field(default_factory=list)


def _ratio(r: CheckResult) -> float:
    if r.worst_error is None or r.allowed is None:
        return 0.0
    return r.worst_error / r.allowed if r.allowed > 0 else float("inf") if r.worst_error else 0.0


def _summary(name: str, tally: _Tally, seconds: float) -> CheckResult:
    searched = f"{tally.rounds} rounds, {tally.examples} examples compared in {seconds:.0f} s"
    if tally.found is not None:
        found = tally.found
        found.reason = f"{found.reason} (found after {tally.found_after:.0f} s of search, in round {tally.rounds})"
        found.examples, found.seconds = tally.examples, tally.seconds
        return found
    if tally.not_applicable is not None:
        return tally.not_applicable
    if tally.examples == 0:
        why = "; ".join(tally.warnings[:2]) or "no round finished"
        return CheckResult(name, "search", "warn", seconds=tally.seconds, reason=f"nothing compared: {why}")
    worst = tally.worst
    return CheckResult(name, "search", "pass", examples=tally.examples, seconds=tally.seconds,
                       worst_error=worst.worst_error if worst else None, allowed=worst.allowed if worst else None,
                       reason=f"no failure in {searched}")


def search(opts: SearchOptions, *, log: Callable[[str], None] = lambda s: None,
           ready: Callable[[], None] = lambda: None) -> list[CheckResult]:
    """Search until ``opts.seconds`` have passed; one result per property, in ``opts.names`` order.
    ``ready`` is called once the cluster is up or the scheduler answered, before the first round.

    ValueError when the engine is missing or the scheduler cannot be reached (within :data:`ANSWER`
    seconds). A scheduler that stops answering mid-run ends it by ``seconds`` + :data:`GRACE` +
    a few :data:`ANSWER` s; the rounds it did not hand back are not counted.
    """
    try:
        from distributed import Client, LocalCluster, wait
    except ImportError:
        raise ValueError("mha-verify search runs on Dask: pip install 'mha-verify[search]'") from None
    from mha_verify import gate

    start = time.monotonic()
    deadline = start + opts.seconds
    cluster = None
    try:
        if opts.scheduler is None:
            cluster = LocalCluster(n_workers=opts.workers, threads_per_worker=1, processes=True,
                                   dashboard_address=None, silence_logs=logging.ERROR)
            client = Client(cluster)
        else:
            address = opts.scheduler
            client = _within(ANSWER, f"the scheduler at {address}",
                             lambda: Client(address, timeout=ANSWER))
        nthreads = _within(ANSWER, "the scheduler", client.nthreads)
    except (OSError, TimeoutError) as exc:
        if cluster is not None:
            cluster.close()
        raise ValueError(f"cannot start the Dask cluster or reach --scheduler {opts.scheduler!r}: {exc}") from None
    ready()
    try:
        slots = max(1, sum(nthreads.values()))
        threads = max(1, (os.cpu_count() or 1) // slots) if opts.scheduler is None else 1
        tallies = {name: _Tally() for name in opts.names}
        active = list(opts.names)
        turn = 0
        rounds_begun = 0
        pending: dict[object, str] = {}

        def submit() -> None:
            nonlocal turn, rounds_begun
            name = active[turn % len(active)]
            turn += 1
            rounds_begun += 1
            future = client.submit(gate.search_round, target_spec=opts.target, adapter=opts.adapter, name=name,
                                   max_examples=opts.examples, database=opts.database,
                                   seed=opts.seed * 1_000_003 + rounds_begun, threads=threads, dtype=opts.dtype,
                                   pure=False)
            pending[future] = name

        answering = True
        while answering:
            while time.monotonic() < deadline and active and len(pending) < slots:
                submit()
            if not pending:
                break
            left = deadline + GRACE - time.monotonic()
            if left <= 0:
                late = f"search: {len(pending)} rounds still running {GRACE:g} s past the deadline"
                try:
                    _within(ANSWER, "the scheduler", lambda: client.cancel(list(pending)))
                    log(f"{late} were cancelled")
                except TimeoutError as exc:
                    log(f"{late} were left to the cluster: {exc}")
                break
            try:
                done, _ = wait(list(pending), timeout=min(left, 5.0), return_when="FIRST_COMPLETED")
            except TimeoutError:
                continue
            for future in done:
                name = pending.pop(future)
                tally = tallies[name]
                try:
                    (result,) = future.result(timeout=ANSWER)
                except TimeoutError:  # the cluster stopped answering: every later wait would be as long
                    log(f"search: a round of {name} finished but the cluster did not hand its result back in "
                        f"{ANSWER:g} s: the search ends with the rounds counted so far")
                    answering = False
                    break
                except CancelledError:  # the scheduler lost it (restarted, or its connection dropped)
                    log(f"search: a round of {name} was lost by the scheduler; not counted")
                    continue
                except Exception as exc:  # the worker died in the round (a crash of the target): its failure
                    result = CheckResult(name, "search", "fail", reason=f"the round's worker failed: "
                                                                        f"{type(exc).__name__}: {exc}")
                result.stage = "search"
                if tally.found is not None or tally.not_applicable is not None:
                    continue  # a round of a property already settled, still in flight when it was
                tally.rounds += 1
                tally.examples += result.examples
                tally.seconds += result.seconds
                if result.verdict == "fail":
                    tally.found, tally.found_after = result, time.monotonic() - start
                    log(f"search: {name} FAILED after {tally.found_after:.0f} s: "
                        f"{result.counterexample or result.reason}")
                elif result.verdict == "n/a":
                    tally.not_applicable = result
                elif result.verdict == "warn" and result.reason:
                    tally.warnings.append(result.reason)
                if result.verdict in ("pass", "declared", "warn") and _ratio(result) >= (
                        _ratio(tally.worst) if tally.worst else -1.0):
                    tally.worst = result
                if result.verdict in ("fail", "n/a") and name in active:
                    active.remove(name)
        seconds = time.monotonic() - start
        results = [_summary(name, tallies[name], seconds) for name in opts.names]
        for r in results:
            if r.verdict != "fail":
                log(f"search: {r.name}: {r.reason}")
        return results
    finally:
        client.close(timeout=ANSWER)
        if cluster is not None:
            cluster.close()
