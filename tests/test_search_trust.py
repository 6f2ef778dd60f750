"""``mha-verify search`` on hostile or mistaken use: a worker count beyond this machine's cores is
refused before any cluster starts, and a scheduler that accepts the connection but never answers
is a prompt one-line usage error, not a hang past ``--seconds``."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mha_verify.isolation import default_jobs
from mha_verify.search import _within
from tests.cli_run import run_cli, run_cli_process

ROOT = Path(__file__).resolve().parent.parent
HAS_DASK = importlib.util.find_spec("distributed") is not None


def cli(*args: str, timeout: float | None = None) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.perf_counter()
    got = run_cli("search", *args) if timeout is None else run_cli_process("search", *args, timeout=timeout)
    return got, time.perf_counter() - start


def _one_line(err: str) -> None:
    __tracebackhide__ = True
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, f"stderr should be one line, got {err!r}"


@pytest.mark.parametrize("extra", [1, 998], ids=["one-above-the-cores", "a-thousand-odd"])
def test_workers_beyond_the_cores_are_refused_before_any_cluster_starts(extra: int, tmp_path: Path) -> None:
    most = default_jobs()
    asked = most + extra
    db = tmp_path / "db"
    got, wall = cli("--database", str(db), "--seconds", "30", "--only", "rows_sum_to_one", "--workers", str(asked))
    assert got.returncode == 2, got.stdout + got.stderr
    assert f"argument --workers: expected at most {most} (the cores this machine lets it use)" in got.stderr, got.stderr
    assert f"got {asked}" in got.stderr, got.stderr
    _one_line(got.stderr)
    assert not db.exists()  # refused while parsing: no database, no cluster
    assert wall < 30, wall  # a cluster searching for --seconds 30 would take longer


@pytest.fixture
def silent_scheduler() -> Iterator[str]:
    """A TCP server that accepts every connection and never sends a byte: Dask's handshake waits on it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.2)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:  # the accept timeout: look at stop again
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for conn in accepted:
            conn.close()
        server.close()


@pytest.mark.integration
@pytest.mark.skipif(not HAS_DASK, reason="the search engine is an optional extra: pip install 'mha-verify[search]'")
def test_a_scheduler_that_never_answers_is_a_prompt_usage_error(silent_scheduler: str, tmp_path: Path) -> None:
    # before: Client(timeout=...) bounds the TCP connect, not the handshake read; it hung for minutes
    got, wall = cli("--only", "rows_sum_to_one", "--database", str(tmp_path / "db"), "--seconds", "2",
                    "--scheduler", silent_scheduler, timeout=90)
    assert got.returncode == 2, got.stdout + got.stderr
    assert f"reach --scheduler {silent_scheduler!r}" in got.stderr, got.stderr
    assert "did not answer in 10 s" in got.stderr, got.stderr
    _one_line(got.stderr)  # the search's banner comes only once the scheduler answered
    assert wall < 40, wall


def test_within_returns_raises_or_gives_up_in_time() -> None:
    assert _within(1.0, "a quick call", lambda: 7) == 7
    with pytest.raises(KeyError):
        _within(1.0, "a failing call", lambda: {}["missing"])
    never = threading.Event()
    start = time.perf_counter()
    with pytest.raises(TimeoutError, match=r"a silent peer did not answer in 0\.2 s"):
        _within(0.2, "a silent peer", never.wait)
    assert time.perf_counter() - start < 5
    never.set()  # the thread left behind ends
