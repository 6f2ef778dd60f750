"""Text that came from a target, a model file or an exception, made safe to show: control
characters become visible escapes, so that ANSI sequences from a model's metadata never reach a
terminal and every report is valid XML (XML 1.0 forbids most control characters outright)."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with every control character but newline and tab written as ``\\xNN``."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
