"""``mha-verify sweep LIBRARY``: every attention class of an installed library, built with no
user code, then run through the gate, one row each.

Stages, each surviving what a class does to it:

1. find (:mod:`mha_verify.sweep_classes`): read the library's files, import nothing;
2. build (:mod:`mha_verify.sweep_build` in a worker): import, build from the constructor's
   names and the library's config, one forward. A class that hangs past ``build_timeout`` or
   crashes its worker becomes a row ("hung", "crashed") and a new worker goes on;
3. check: ``mha-verify check --target CLASS --no-export --profile quick`` per built class, run by
   one :mod:`mha_verify.sweep_check` worker per job (a process group of its own, killed past
   ``class_timeout`` and replaced); its JSON report gives the verdicts.

The table (``sweep.json``, ``sweep.md``) is rewritten atomically after every row, so an
interrupted sweep has lost nothing, and a sweep run again into the same folder (same library,
versions and profile) resumes: rows already judged are kept.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import re
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from mha_verify.exit_codes import EXIT_ERROR
from mha_verify.export.atomic import AtomicWriter
from mha_verify.folder_lock import hold_folder
from mha_verify.isolation import describe_exit
from mha_verify.json_files import read_json
from mha_verify.properties.engine.results import KINDS
from mha_verify.shards import Shard
from mha_verify.sweep_classes import Found, find_classes
from mha_verify.sweep_rows import Row, cause_of, row_from_json, totals

FORMAT = "mha-verify sweep 1"
#: a sweep.json larger than this is refused before it is parsed (transformers' whole table is ~2 MB)
MAX_TABLE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Options:
    library: str
    out: Path
    profile: str = "quick"
    max_examples: int | None = None
    build_only: bool = False
    match: str | None = None
    sample: int | None = None
    seed: int = 0
    jobs: int = 1
    build_timeout: float = 120.0
    class_timeout: float = 900.0
    fresh: bool = False
    retry: bool = False
    shard: Shard | None = None
    costs: Path | None = None


def library_version(library: str) -> str:
    """The installed version of the package ``library`` imports as, through its distribution where the
    two names differ (``whisper`` is openai-whisper's, ``esm`` fair-esm's)."""
    for name in (library, *metadata.packages_distributions().get(library, ())):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


CONTEXT_KEYS = ("library", "library_version", "mha_verify", "torch", "profile", "max_examples")


def context(opts: Options) -> dict[str, str]:
    """What a stored row is valid for (:data:`CONTEXT_KEYS`): reused only when all of it matches."""
    from mha_verify import __version__

    return {"library": opts.library, "library_version": library_version(opts.library),
            "mha_verify": __version__, "torch": library_version("torch"), "profile": opts.profile,
            "max_examples": str(opts.max_examples or "")}


def select(found: list[Found], opts: Options) -> list[Found]:
    """The classes ``--match`` keeps, then a seeded sample of ``--sample`` of them (file order kept)."""
    chosen = [f for f in found if opts.match is None or re.search(opts.match, f.spec)]
    if opts.sample is not None and opts.sample < len(chosen):
        keep = set(random.Random(opts.seed).sample(range(len(chosen)), opts.sample))
        chosen = [f for i, f in enumerate(chosen) if i in keep]
    return chosen


def shard_of(chosen: list[Found], shard: Shard, costs: dict[str, float] | None = None) -> list[Found]:
    """The classes of ``shard``.

    With ``costs`` (seconds per class, as an earlier sweep measured them: :func:`measured_costs`),
    longest first (:func:`mha_verify.shards.select`; a class it does not name costs its median).
    Without, a class's cost is unknown until it is built (2 s to refuse, 15 minutes to time out):
    every N-th class in file order, from the I-th, which spreads each model family (files of one
    family sit together, and cost alike) over every shard.
    """
    if costs:
        from mha_verify.shards import expected_cost
        from mha_verify.shards import select as select_shard

        specs = [f.spec for f in chosen]
        return [chosen[i] for i in select_shard(specs, shard, [expected_cost(s, costs) for s in specs])]
    return [f for i, f in enumerate(chosen) if i % shard.count == shard.index - 1]


def measured_costs(path: Path) -> dict[str, float]:
    """Seconds per class (build and check) of the sweep.json at ``path``; ValueError if it is not one."""
    doc = read_json(path, what=f"--costs {str(path)!r}", max_bytes=MAX_TABLE_BYTES)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("rows"), list):
        raise ValueError(f"--costs {str(path)!r} is not an mha-verify sweep.json")
    rows = [row_from_json(item, f"--costs {str(path)!r} row {i + 1}") for i, item in enumerate(doc["rows"])]
    return {row.spec: row.build_seconds + row.check_seconds for row in rows}


def load_previous(out: Path, ctx: dict[str, str]) -> dict[str, Row]:
    """Rows of an earlier sweep into ``out`` with the same context; ValueError if ``out`` holds a
    sweep.json that is not a sweep's, or one of its rows does not fit (nothing of it is
    overwritten then: a row dropped here would be gone from the table rewritten after it)."""
    path = out / "sweep.json"
    if not path.exists() and not path.is_symlink():
        return {}
    where = f"--out {str(out)!r}: its sweep.json"
    doc = read_json(path, what=where, max_bytes=MAX_TABLE_BYTES)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("rows"), list):
        raise ValueError(f"--out {str(out)!r} holds a sweep.json that is not an mha-verify sweep's; "
                         "choose another folder")
    if doc.get("context") != ctx:
        return {}
    rows: dict[str, Row] = {}
    for i, item in enumerate(doc["rows"]):
        row = row_from_json(item, f"{where}, row {i + 1}")
        rows[row.spec] = row
    return rows


class LineWorker:
    """A process of ``module`` (``sweep_build``, ``sweep_check``) in a session of its own: one
    line in, one JSON line out, each answer under a time limit."""

    def __init__(self, module: str = "mha_verify.sweep_build", env: dict[str, str] | None = None,
                 label: tuple[str, ...] = ()) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *label], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, start_new_session=True, env=env)
        self.buffer = b""

    def ask(self, spec: str, timeout: float) -> dict[str, Any] | str:
        """The worker's JSON line for the line ``spec``, or "hung" / "crashed: ..." (the worker is then dead)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(spec.encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return self._crashed()
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while b"\n" not in self.buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    self.kill()
                    return "hung"
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:
                    return self._crashed()
                self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            answer = json.loads(line)
        except ValueError:
            self.kill()
            return "crashed: the worker wrote something other than its answer"
        return answer if isinstance(answer, dict) else "crashed: the worker wrote something other than its answer"

    def _crashed(self) -> str:
        code = self.proc.wait()
        return f"crashed: {describe_exit(code)}"

    def kill(self) -> None:
        _kill_group(self.proc)

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """End ``proc`` and everything it started (it leads its own session): TERM, then KILL."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group's stragglers (the gate's workers)
        os.killpg(proc.pid, signal.SIGKILL)


def build_row(worker: LineWorker, row: Row, timeout: float) -> None:
    start = time.perf_counter()
    answer = worker.ask(row.spec, timeout)
    row.build_seconds = round(time.perf_counter() - start, 2)
    if answer == "hung":
        row.status, row.reason = "hung while built", f"no answer within {timeout:g} s (import, build or one forward)"
    elif isinstance(answer, str):
        row.status, row.reason = "crashed while built", answer
    elif answer.get("built"):
        row.status, row.built_as, row.conventions = "built", str(answer["built_as"]), str(answer["conventions"])
    elif answer.get("wraps"):
        row.status, row.reason = "wrapper", str(answer.get("reason", ""))
    else:
        row.status, row.reason = "not built", str(answer.get("reason", ""))


_RUNNING: set[subprocess.Popen[bytes]] = set()  # the check workers alive now, each in its own process group
_RUNNING_LOCK = threading.Lock()
_CHECKERS: queue.SimpleQueue[CheckWorker] = queue.SimpleQueue()  # the idle ones, one per job


def stop_checks() -> None:
    """Kill every check worker's process group (what the sweep does when it is interrupted)."""
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for proc in running:
        _kill_group(proc)


class CheckWorker(LineWorker):
    """A :mod:`mha_verify.sweep_check` process: the gate on one class after another."""

    def __init__(self, opts: Options) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        if opts.jobs > 1 and "OMP_NUM_THREADS" not in os.environ:
            # classes judged side by side share the cores: torch's threads in each would otherwise be
            # one per core, and two checks' spinning thread pools on 2 cores made a sweep 2.2x slower
            # than judging one class at a time (benchmarks/bench_shards.py --sweep)
            env["OMP_NUM_THREADS"] = str(max(1, _cores() // opts.jobs))
        super().__init__("mha_verify.sweep_check", env, label=(str(opts.out),))
        with _RUNNING_LOCK:
            _RUNNING.add(self.proc)

    def kill(self) -> None:
        super().kill()
        with _RUNNING_LOCK:
            _RUNNING.discard(self.proc)

    def close(self) -> None:
        super().close()
        with _RUNNING_LOCK:
            _RUNNING.discard(self.proc)


def _cores() -> int:
    from mha_verify.isolation import default_jobs

    return default_jobs()


def check_row(row: Row, opts: Options) -> dict[str, Any]:
    """Run the gate on one built class: the row's new fields, from its JSON report (returned, not
    set: the table is written from the main thread while other classes run)."""
    reports = opts.out / "reports"
    report = reports / (re.sub(r"[^A-Za-z0-9_.-]", "_", row.spec) + ".json")
    report.unlink(missing_ok=True)
    bundles = opts.out / "bundles" / report.stem  # a standalone replay of each failure (mha_verify.eager_bundle)
    cmd = ["check", "--target", row.spec, "--profile", opts.profile, "--jobs", "1", "--report", str(report),
           "--no-export", "--bundle-dir", str(bundles)]
    if opts.max_examples is not None:
        cmd += ["--max-examples", str(opts.max_examples)]
    start = time.perf_counter()
    worker = _CHECKERS.get()
    answer = worker.ask(json.dumps(cmd), opts.class_timeout)
    if isinstance(answer, str):
        worker.kill()
        worker = CheckWorker(opts)
    _CHECKERS.put(worker)
    if answer == "hung":
        return {"status": "check timed out", "reason": f"the gate ran past {opts.class_timeout:g} s",
                "check_seconds": round(time.perf_counter() - start, 1)}
    if isinstance(answer, str):
        return {"status": "check crashed", "reason": answer.removeprefix("crashed: "),
                "check_seconds": round(time.perf_counter() - start, 1)}
    code = answer.get("code")
    seconds = round(time.perf_counter() - start, 1)
    lines = [ln for ln in str(answer.get("stderr", "")).splitlines() if ln.strip()]
    if code == 2:
        return {"status": "check usage error", "reason": lines[-1] if lines else "exit code 2",
                "check_seconds": seconds}
    if code not in (0, 1, EXIT_ERROR) or not report.is_file():
        return {"status": "check crashed", "check_seconds": seconds,
                "reason": f"exited with code {code}" + (f": {lines[-1]}" if lines else "")}
    doc = json.loads(report.read_text())
    results = doc.get("results", [])
    causes: dict[str, list[str]] = {}
    for r in results:
        if r.get("verdict") == "fail":
            causes.setdefault(cause_of(str(r.get("reason") or r.get("counterexample") or "")), []).append(
                str(r.get("name")))
    findings: dict[str, list[str]] = {}
    for r in results:
        kind = KINDS.get(str(r.get("kind")))
        if kind is not None:
            findings.setdefault(f"{kind}: {cause_of(str(r.get('reason') or ''))}", []).append(str(r.get("name")))
    written = sorted(str(p.relative_to(opts.out)) for p in bundles.glob("*/replay.py")) if bundles.is_dir() else []
    verified = sum(1 for r in results if r.get("verdict") != "n/a" and (r.get("examples") or 0) > 0)
    errors = [f"{r.get('name')}: {r.get('reason')}" for r in results if r.get("verdict") == "error"]
    status = "check raised in mha-verify" if code == EXIT_ERROR else "nothing verified" if verified == 0 else \
        "passed" if code == 0 else "failed"
    reason = "; ".join(errors)[:300] if code == EXIT_ERROR else "no check compared an example" if verified == 0 else ""
    return {"status": status, "reason": reason,
            "counts": {k: int(v) for k, v in doc.get("counts", {}).items()}, "verified": verified,
            "causes": causes, "findings": findings, "bundles": written, "check_seconds": seconds}


def write(rows: list[Row], opts: Options, ctx: dict[str, str], command: str,
          shard: dict[str, Any] | None = None) -> None:
    """sweep.json and sweep.md into ``opts.out``; ``shard``: the part of a sharded sweep this is."""
    write_table(opts.out, rows, ctx, command, shard)


TABLE_FILES = ("sweep.json", "sweep.md")


def check_table_paths(out: Path, flag: str = "--out") -> None:
    """ValueError if a table file in ``out`` is a symbolic link or not a regular file: the table
    is the folder's own, and a link would have it written onto whatever the link names (a part
    being merged, the --costs file)."""
    for name in TABLE_FILES:
        path = out / name
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise ValueError(f"{flag} {str(out)!r}: its {name} is a symbolic link or not a regular file; "
                             "the table is written into the folder itself: remove it, or choose another folder")


def write_table(out: Path, rows: list[Row], ctx: dict[str, str], command: str,
                shard: dict[str, Any] | None = None) -> None:
    from mha_verify.sweep_table import markdown

    check_table_paths(out)
    doc: dict[str, Any] = {"format": FORMAT, "context": ctx, "command": command, "totals": totals(rows),
                           "rows": [asdict(r) for r in rows]}
    if shard is not None:
        doc["shard"] = shard
    table = markdown(rows, totals(rows), ctx, command)  # both rendered before either is written
    AtomicWriter(out / "sweep.json").write_text(json.dumps(doc, indent=1) + "\n")
    AtomicWriter(out / "sweep.md").write_text(table)


def sweep(opts: Options, *, command: str, progress: Callable[[Row], None] = lambda r: None) -> list[Row]:
    """Run the sweep; the rows, in the library's file order. ValueError for a usage error."""
    if opts.match is not None:
        try:
            re.compile(opts.match)
        except re.error as exc:
            raise ValueError(f"--match {opts.match!r} is not a regular expression: {exc}") from None
    found = select(find_classes(opts.library), opts)
    if not found:
        raise ValueError(f"no attention class of {opts.library} matches"
                         + (f" --match {opts.match!r}" if opts.match else ""))
    shard = None
    if opts.shard is not None:
        everything = len(found)
        shard = {"index": opts.shard.index, "count": opts.shard.count, "specs": [f.spec for f in found],
                 "build_only": opts.build_only}
        found = shard_of(found, opts.shard, measured_costs(opts.costs) if opts.costs else None)
        if not found:
            raise ValueError(f"--shard {opts.shard}: {opts.shard.count} shards for {everything} classes "
                             f"leaves this one empty; use at most {everything} shards")
    opts.out.mkdir(parents=True, exist_ok=True)
    # one sweep writes a folder at a time: each rewrites the table from the rows it read at its
    # start, so a second one beside it would silently drop the first one's rows
    with hold_folder(opts.out, "--out"):
        return _sweep_into(found, shard, opts, command=command, progress=progress)


def _sweep_into(found: list[Found], shard: dict[str, Any] | None, opts: Options, *, command: str,
                progress: Callable[[Row], None]) -> list[Row]:
    check_table_paths(opts.out)
    (opts.out / "reports").mkdir(exist_ok=True)
    ctx = context(opts)
    stored = {} if opts.fresh else load_previous(opts.out, ctx)
    previous = stored
    if opts.retry:  # judge again what did not end in a verdict on the class itself or a refusal to build
        previous = {spec: row for spec, row in stored.items() if row.status in ("passed", "not built", "wrapper")}
    rows = [previous.get(f.spec) or Row(f.spec, f.path) for f in found]
    # the table keeps the earlier rows this run did not select (a narrower --match or --sample into
    # the same folder), in their order: a resumed sweep never drops what it did not judge again
    chosen = {row.spec: row for row in rows}
    table = rows if shard is not None else \
        [chosen.get(spec, row) for spec, row in stored.items()] + [row for row in rows if row.spec not in stored]
    worker: LineWorker | None = None
    try:
        for row in rows:
            if row.status:
                continue
            worker = worker if worker is not None and worker.proc.poll() is None else LineWorker()
            build_row(worker, row, opts.build_timeout)
            write(table, opts, ctx, command, shard)
            progress(row)
    finally:
        if worker is not None:
            worker.close()
    if not opts.build_only:
        todo = [r for r in rows if r.status == "built"]

        pool = ThreadPoolExecutor(max_workers=max(1, opts.jobs))
        for _ in range(min(max(1, opts.jobs), len(todo))):
            _CHECKERS.put(CheckWorker(opts))
        try:
            futures = {pool.submit(check_row, row, opts): row for row in todo}
            for future in as_completed(futures):
                row = futures[future]
                for key, value in future.result().items():
                    setattr(row, key, value)
                write(table, opts, ctx, command, shard)
                progress(row)
        except BaseException:
            # Ctrl-C or SIGTERM (CI cancelling): end the checks now. Leaving the pool's `with`
            # waited for every running check, up to --class-timeout each, and the sweep ignored
            # the signal for that long
            pool.shutdown(wait=False, cancel_futures=True)
            stop_checks()
            raise
        finally:
            pool.shutdown()
            while not _CHECKERS.empty():
                _CHECKERS.get().close()
    write(table, opts, ctx, command, shard)
    return rows


__all__ = ["Options", "sweep"]
