"""Reading the JSON files users hand the tool (reports, sweep tables, costs, baselines, bundles).

A user's file is hostile until read: it may be a FIFO that never ends, a gigabyte, nested deeper
than the parser's recursion limit, or valid JSON of the wrong shape. :func:`read_json` refuses the
first three with a ValueError that names the file as the user gave it; the shape is each reader's
to check, field by field (``CheckResult.from_json``, :func:`mha_verify.sweep_rows.row_from_json`).
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any

#: deeper than any file the tool writes (a report's heatmap is 4 levels inside 3)
MAX_DEPTH = 32


def read_json(path: str | os.PathLike[str], *, what: str, max_bytes: int) -> Any:
    """The JSON document at ``path``; ValueError starting with ``what`` (how the user named the
    file, e.g. ``"--costs 'old/sweep.json'"``) if it is not a regular file, larger than
    ``max_bytes``, not UTF-8 JSON, or nested deeper than :data:`MAX_DEPTH`."""
    try:
        # O_NONBLOCK: opening a FIFO with no writer would otherwise wait forever
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ValueError(f"{what}: cannot read it: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{what} is not a regular file")
        if info.st_size > max_bytes:
            raise ValueError(f"{what} is larger than {max_bytes} bytes ({info.st_size})")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise ValueError(f"{what}: cannot read it: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # it grew while read
        raise ValueError(f"{what} is larger than {max_bytes} bytes")
    try:
        doc = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ValueError(f"{what} is nested deeper than {MAX_DEPTH} levels") from None
    except UnicodeDecodeError:
        raise ValueError(f"{what} is not UTF-8 text") from None
    except ValueError as exc:  # JSONDecodeError, and an integer of more digits than Python converts
        raise ValueError(f"{what} is not valid JSON: {str(exc)[:200]}") from None
    if depth_exceeds(doc, MAX_DEPTH):
        raise ValueError(f"{what} is nested deeper than {MAX_DEPTH} levels")
    return doc


def depth_exceeds(doc: Any, limit: int) -> bool:
    """Whether ``doc`` nests lists and objects more than ``limit`` deep (walked without
    recursion: the later readers recurse, so a deep document is refused before they see it)."""
    stack = [(doc, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False


__all__ = ["MAX_DEPTH", "depth_exceeds", "read_json"]
