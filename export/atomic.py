"""Atomic file writes, the one home for every file the tool writes (models, reports, baselines):
a temp file in the destination's directory, then ``os.replace``; a failed or interrupted run
leaves no partial file at the destination."""

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


class AtomicWriter:
    """A destination checked for writability now and written in one rename later."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        parent = self.path.parent if str(self.path.parent) else Path(".")
        if self.path.is_dir():
            raise OSError(f"output path {str(self.path)!r} is a directory")
        if not parent.is_dir():
            raise OSError(f"output directory {str(parent)!r} does not exist (for {str(self.path)!r})")
        try:  # the only reliable writability test is to write
            fd, probe = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=parent)
        except OSError as exc:
            raise OSError(f"cannot write to {str(self.path)!r}: {exc.strerror or exc}") from None
        os.close(fd)
        os.unlink(probe)
        self.parent = parent

    def write_bytes(self, data: bytes) -> None:
        with atomic_path(self.path, suffix="") as tmp:
            tmp.write_bytes(data)

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode("utf-8"))
