"""Shards: one gate's (or sweep's) tasks split over N machines, deterministically and balanced.

``--shard I/N`` runs the I-th of N parts (1-based, as GitHub Actions and pytest-split count).
The split depends only on the task list and N, never on the machine: every shard of a CI
matrix computes the same split, and ``mha-verify merge`` puts the parts back in the single
run's order.

Balance: longest processing time first (Graham's LPT rule). Tasks are taken by expected cost,
largest first, each given to the shard with the least cost so far (ties: the lowest index).
Its makespan is at most 4/3 of the best split's; with our costs (two exports of ~20 s
beside ~25 properties of 1-9 s at the ci profile) it is within a second of the best for N <= 4.

Expected costs are seconds per task as measured on the reference at the ci profile
(:data:`EXPECTED_SECONDS`, from ``mha-verify --report``): relative costs are what matter, and
a layer slower than the reference is slower on every task alike. A task the table does not
name (a property added later) costs the table's median.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

#: seconds per task of ``mha-verify --report`` on the reference, ci profile, 2 workers, this
#: project's 2-core CI machine (docs/past-one-machine.md for the command)
EXPECTED_SECONDS: dict[str, float] = {
    "lk_equals_lv": 1.1, "rows_sum_to_one": 1.3, "determinism": 1.4, "finite_large_inputs": 1.6,
    "dropout_off_in_eval": 2.0, "no_future_leak": 1.6, "prefix_consistency": 1.2, "grad_agreement": 6.8,
    "layout_independence": 1.2, "mask_zeroes_weights": 0.8, "masked_kv_invariance": 4.6,
    "masked_grad_zero": 1.3, "fully_masked_rows": 3.3, "bool_equals_additive": 2.4, "mask_broadcast": 2.4,
    "inference_mode_agreement": 1.9, "train_mode_agreement": 2.1, "oracle_agreement": 5.6, "head_split": 9.4,
    "gradcheck": 2.5, "query_permutation": 3.6, "key_permutation": 2.2, "batch_independence": 5.0,
    "export-dynamo": 31.8, "export-torchscript": 15.6,
}

MAX_SHARDS = 1000


@dataclass(frozen=True)
class Shard:
    """The ``index``-th of ``count`` shards, 1-based."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_SHARDS:
            raise ValueError(f"shard count must be in 1..{MAX_SHARDS}, got count={self.count}")
        if not 1 <= self.index <= self.count:
            raise ValueError(f"shard index must be in 1..{self.count}, got index={self.index}")

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    """``"I/N"`` as a Shard: argparse's type for ``--shard`` (a bad value is a one-line usage error)."""
    index, sep, count = text.partition("/")
    try:
        if not sep:
            raise ValueError
        shard = Shard(int(index), int(count))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected I/N with 1 <= I <= N <= {MAX_SHARDS} (the I-th of N shards), got {text!r}") from None
    return shard


def expected_cost(name: str, table: dict[str, float] | None = None) -> float:
    """Expected seconds of task ``name``: the table's, else the table's median (1.0 if it is empty)."""
    table = EXPECTED_SECONDS if table is None else table
    if name in table:
        return table[name]
    return statistics.median(table.values()) if table else 1.0


def assign(costs: Sequence[float], count: int) -> list[int]:
    """The shard (0-based) of each task, by longest processing time first.

    >>> assign([5, 1, 1, 3, 2], 2)
    [0, 0, 1, 1, 1]
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got count={count}")
    loads = [0.0] * count
    out = [0] * len(costs)
    for position in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        shard = min(range(count), key=lambda s: (loads[s], s))
        out[position] = shard
        loads[shard] += costs[position]
    return out


def select(names: Sequence[str], shard: Shard, costs: Sequence[float] | None = None) -> list[int]:
    """Positions (in ``names``' order) of the tasks that belong to ``shard``.

    ``costs`` default to :func:`expected_cost` of each name. Names must be distinct: they are what
    ``merge`` matches the parts by.
    """
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if list(names).count(n) > 1})
        raise ValueError(f"task names must be distinct to shard them, got duplicates {dup[:3]}")
    costs = [expected_cost(n) for n in names] if costs is None else list(costs)
    owners = assign(costs, shard.count)
    return [i for i, owner in enumerate(owners) if owner == shard.index - 1]
