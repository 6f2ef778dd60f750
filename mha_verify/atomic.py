"""Atomic file output: check the destination up front, write to a temp file, rename at the end.

A failed or interrupted run leaves no partial file at the destination.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from mha_verify.export.atomic import atomic_path


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
