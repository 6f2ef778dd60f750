"""Atomic file writes: a temp file in the destination's directory, then ``os.replace``."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike[str], *, suffix: str = ".onnx") -> Iterator[Path]:
    """Yield a temp path next to ``dest``; on a clean exit move it onto ``dest``.

    The temp file lives in ``dest``'s directory, so the final ``os.replace`` is a rename on
    one file system: readers see the old file or the new one, never half of one. If the
    body raises (or the process is interrupted), the temp file is removed and ``dest`` is
    untouched. ``dest``'s directory must exist.
    """
    dest = Path(dest)
    folder = dest.parent if str(dest.parent) else Path(".")
    if not folder.is_dir():
        raise FileNotFoundError(f"output directory {str(folder)!r} does not exist")
    fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=f".tmp{suffix}", dir=folder)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
