"""Atomic file writes, the one home for every file the tool writes (models, reports, baselines):
a temp file in the destination's directory, then ``os.replace``; a failed or interrupted run
leaves no partial file at the destination."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def resolve_destination(dest: str | os.PathLike[str]) -> tuple[Path, bool]:
    """(the path to write, whether to write through it) for an output the user named.

    A symlink is followed (its target is written; the link stays a link). An existing path that
    is not a regular file (a device such as /dev/null, a FIFO) is written through, never
    replaced: ``os.replace`` over it would turn it into a regular file (as root, /dev/null too).
    """
    path = Path(dest)
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    if path.exists() and not path.is_file() and not path.is_dir():
        return path, True
    return path, False


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike[str], *, suffix: str = ".onnx") -> Iterator[Path]:
    """Yield a temp path next to ``dest``; on a clean exit move it onto ``dest``.

    The temp file lives in ``dest``'s directory, so the final ``os.replace`` is a rename on
    one file system: readers see the old file or the new one, never half of one. If the
    body raises (or the process is interrupted), the temp file is removed and ``dest`` is
    untouched. ``dest``'s directory must exist. The file gets the mode an ordinary write would
    give it (the replaced file's, else 0666 less the umask), a symlink's target is written
    (the link stays), and a device or FIFO is written through (see :func:`resolve_destination`).
    """
    target, through = resolve_destination(dest)
    folder = target.parent if str(target.parent) else Path(".")
    if through:  # a device or FIFO: stage in a temp folder, then write into it as any tool would
        folder = Path(tempfile.gettempdir())
    if not folder.is_dir():
        raise FileNotFoundError(f"output directory {str(folder)!r} does not exist")
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=f".tmp{suffix}", dir=folder)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        if through:
            with open(tmp, "rb") as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
            tmp.unlink()
        else:
            mode = (target.stat().st_mode & 0o7777) if target.is_file() else (0o666 & ~_umask())
            os.chmod(tmp, mode)
            os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


class AtomicWriter:
    """A destination checked for writability now and written in one rename later."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        target, through = resolve_destination(self.path)
        if through:  # a device or FIFO: written through at the end, nothing to probe
            self.parent = target.parent
            return
        parent = target.parent if str(target.parent) else Path(".")
        if target.is_dir():
            raise OSError(f"output path {str(self.path)!r} is a directory")
        if not parent.is_dir():
            raise OSError(f"output directory {str(parent)!r} does not exist (for {str(self.path)!r})")
        try:  # the only reliable writability test is to write
            fd, probe = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent)
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
