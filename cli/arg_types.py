"""Types of the CLI's numeric options: each bad value is argparse's one-line usage error (exit 2)."""

from __future__ import annotations

import argparse
import math
import os


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a container or ``taskset`` narrows)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def process_count(text: str) -> int:
    """A number of processes to run side by side: 1 up to the usable cores. More would only
    contend for them, and a thousand would each import torch until the memory is gone."""
    value = positive_int(text)
    most = usable_cores()
    if value > most:
        raise argparse.ArgumentTypeError(f"expected at most {most} (the cores this machine lets it use), got {value}")
    return value


def seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer seed, got {text!r}") from None
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"expected a seed in [0, 2**32), got {value}")
    return value


def finite_positive(text: str, what: str = "number") -> float:
    """A finite number > 0: a timeout, budget or size of 0, nan or inf would fail or disable every check."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a {what}, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite {what} > 0, got {text}")
    return value


def positive_seconds(text: str) -> float:
    """A finite number of seconds > 0."""
    return finite_positive(text, "number of seconds")
