"""SIGTERM (how CI cancels a job) and SIGINT end the whole process tree the gate started, the
target's own children included, within a few seconds, and leave no temporary files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _marked(mark: str) -> list[int]:
    """PIDs of live processes whose environment carries ``mark`` (every descendant inherits it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if mark.encode() in (entry / "environ").read_bytes():
                status = (entry / "status").read_text()
                if "\nState:\tZ" not in status:  # a zombie has ended; its parent has not reaped it yet
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.integration
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc (Linux)")
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["TERM", "INT"])
def test_a_signal_ends_every_process_of_the_run(signum: int, code: int, tmp_path: Path) -> None:
    mark = f"MHA_VERIFY_TEST_MARK={uuid.uuid4().hex}"
    env = dict(os.environ, MHA_VERIFY_TEST_MARK=mark.split("=")[1], TMPDIR=str(tmp_path))
    proc = subprocess.Popen(
        [sys.executable, "-m", "mha_verify.cli", "--no-export", "--only", "determinism,oracle_agreement",
         "--max-examples", "3", "--timeout", "600", "--target", "tests/fixtures/bad_targets.py:SpawnsAndHangs"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(
            b"sleep\x001000" in Path(f"/proc/{p}/cmdline").read_bytes() for p in _marked(mark)
            if Path(f"/proc/{p}/cmdline").exists()):
        time.sleep(0.5)  # until the target's own child runs inside a worker
    assert proc.poll() is None, proc.communicate()
    assert len(_marked(mark)) >= 4  # the gate, the fork server, two workers, the target's children
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err
    end = time.monotonic() + 10
    while _marked(mark) and time.monotonic() < end:
        time.sleep(0.2)
    assert _marked(mark) == [], "processes left behind"
    assert "Traceback" not in err
    assert not [p for p in tmp_path.rglob("*") if p.is_file()], "temporary files left behind"
