"""One writer per output folder: a sweep (or a merge into a sweep's folder) holds the folder's
lock for as long as it writes there, and a second run into it is refused at once.

The lock is ``flock`` on ``FOLDER/.mha-verify.lock``: the kernel drops it when the holder exits,
however it exits, so a killed sweep never leaves a folder locked. The file holds the holder's pid,
for the message only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

LOCK_NAME = ".mha-verify.lock"


@contextlib.contextmanager
def hold_folder(folder: Path, flag: str) -> Iterator[None]:
    """Hold ``folder``'s lock for the body; ValueError naming ``flag`` and the holder's pid if
    another process holds it. ``folder`` must exist."""
    path = folder / LOCK_NAME
    try:
        # O_NOFOLLOW: a link planted as the lock file must not get a pid written through it
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        raise ValueError(f"{flag} {str(folder)!r}: cannot create its lock file {LOCK_NAME}: "
                         f"{exc.strerror or exc}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            raise ValueError(f"{flag} {str(folder)!r} is being written by another mha-verify run"
                             + (f" (pid {holder})" if holder.isdigit() else "")
                             + "; wait for it to finish, or choose another folder") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


__all__ = ["LOCK_NAME", "hold_folder"]
