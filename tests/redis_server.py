"""A redis-server of a test's own, on a free port and without persistence (skipped, with the
reason, where none can start), for the tests of the shared database."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def redis_server(tmp: Path, *config: str) -> Iterator[int]:
    """A redis-server of this test's own on a free port, without persistence; skipped with the
    reason where none can start."""
    redis = pytest.importorskip("redis", reason="the redis package is not installed (pip install 'mha-verify[redis]')")
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("no redis-server on PATH (Debian: apt-get install redis-server)")
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp), *config], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for _ in range(100):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if proc.poll() is not None:
                    pytest.skip(f"redis-server did not start: {proc.stdout.read()[-300:] if proc.stdout else ''}")
                time.sleep(0.1)
        else:
            pytest.skip("redis-server did not answer within 10 s")
        del redis
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)
