"""Outputs are written through or atomically, never by replacing what is not a regular file: a
FIFO or a device is written into, a symlink's target is written and the link stays, and a new
file gets the mode an ordinary write gives it."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from mha_verify.export.atomic import AtomicWriter, atomic_path, resolve_destination


def test_a_fifo_is_written_through_and_stays_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    AtomicWriter(fifo).write_text('{"ok": true}')
    reader.join(10)
    assert got == [b'{"ok": true}']
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.fifo"]  # no temp file left


def test_dev_null_is_written_through_never_replaced() -> None:
    # decided without writing: replacing /dev/null as root would break the machine
    assert resolve_destination("/dev/null") == (Path("/dev/null"), True)


def test_a_symlink_stays_a_link_and_its_target_is_written(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    AtomicWriter(link).write_text("new")
    assert link.is_symlink() and link.resolve() == real.resolve()
    assert real.read_text() == "new"


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_a_new_file_gets_the_users_umask(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        AtomicWriter(tmp_path / "r.json").write_text("{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "r.json").stat().st_mode) == 0o666 & ~umask


def test_a_replaced_file_keeps_its_mode(tmp_path: Path) -> None:
    out = tmp_path / "m.onnx"
    out.write_bytes(b"old")
    out.chmod(0o640)
    with atomic_path(out) as tmp:
        tmp.write_bytes(b"new")
    assert out.read_bytes() == b"new" and stat.S_IMODE(out.stat().st_mode) == 0o640


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path: Path) -> None:
    out = tmp_path / "m.onnx"
    out.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_path(out) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("interrupted")
    assert out.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
