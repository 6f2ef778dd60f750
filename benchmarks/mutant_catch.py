"""Which property catches each one-bug mutant of tests/mutants.py, after how many examples.

    python -m benchmarks.mutant_catch [--profile ci] [--only NAME,...]

Prints a markdown table: mutant | property | verdict | examples checked before the failure |
seconds (including shrinking) | the shrunk counterexample. Run from the repository root.
"""

from __future__ import annotations

import argparse
import time

import torch

from mha_verify.properties.engine import profiles
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.targets.eager import Target
from tests.mutants import CATALOG, KERNEL_MUTANTS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="ci", choices=list(profiles.PROFILES))
    parser.add_argument("--only", default=None, help="comma-separated mutant names")
    args = parser.parse_args()
    torch.set_num_threads(1)
    settings = profiles.PROFILES[args.profile]
    table = {name: (cls, expected, torch.float32) for name, (cls, expected) in CATALOG.items()}
    table.update({name: (cls, expected, dtype) for name, (cls, expected, dtype, _) in KERNEL_MUTANTS.items()})
    names = args.only.split(",") if args.only else list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        parser.error(f"--only: unknown mutants {', '.join(unknown)}")
    print("| mutant | property | dtype | verdict | examples | seconds | counterexample |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        cls, expected, dtype = table[name]
        start = time.perf_counter()
        result = run_property(all_properties()[expected], Target(f"tests.mutants:{cls.__name__}", cls),
                              settings=settings, dtype=dtype)
        dtype_name = str(dtype).replace("torch.", "")
        print(f"| {name} | {expected} | {dtype_name} | {result.verdict} | {result.examples} | "
              f"{time.perf_counter() - start:.1f} | {result.counterexample or '-'} |", flush=True)


if __name__ == "__main__":
    main()
