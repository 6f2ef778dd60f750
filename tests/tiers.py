"""Run a test tier against its wall-clock budget (tests/tiers.toml), or check a run already made.

    python -m tests.tiers run TIER [--record] [-- EXTRA PYTEST ARGS]
    python -m tests.tiers check TIER --seconds S --junit FILE [--record]

``run`` runs the tier's command with a JUnit report, ``check`` reads the report of a run made by someone
else (.ci/run times the README's own test command and hands it here). Both print the tier's wall time
against its budget and its ten slowest tests, and exit 1 when the tier was over its budget or pytest
failed. ``--record`` writes each test's duration into tests/durations.json, so that what every test costs
is in the repository (docs/development.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import NamedTuple

import tomllib

ROOT = Path(__file__).resolve().parent.parent
TIERS = ROOT / "tests" / "tiers.toml"
DURATIONS = ROOT / "tests" / "durations.json"
SLOWEST = 10


class Tier(NamedTuple):
    name: str
    commands: list[list[str]]  # run in turn; the tier's wall time is theirs together
    budget_seconds: float


def tiers() -> dict[str, Tier]:
    table = tomllib.loads(TIERS.read_text())
    return {name: Tier(name, [list(c) for c in row["commands"]], float(row["budget_seconds"]))
            for name, row in table.items()}


def durations(junit: Path) -> dict[str, float]:
    """{node id: seconds} of every test case in a JUnit report written by pytest."""
    out: dict[str, float] = {}
    for case in ET.parse(junit).iter("testcase"):
        parts = case.get("classname", "").split(".")  # tests.test_cli, or tests.test_x.TestClass
        last = max((i for i, part in enumerate(parts) if part.startswith("test_")), default=len(parts) - 1)
        node = "::".join(["/".join(parts[: last + 1]) + ".py", *parts[last + 1:], case.get("name", "")])
        out[node] = float(case.get("time", "0"))
    return out


def report(tier: Tier, wall: float, tests: dict[str, float], pytest_code: int) -> int:
    """Print the verdict and the slowest tests; the exit code of the check."""
    over = wall > tier.budget_seconds
    print(f"tier {tier.name}: {len(tests)} tests, {wall:.0f} s of wall time against a budget of "
          f"{tier.budget_seconds:.0f} s ({wall / tier.budget_seconds:.0%}); test time {sum(tests.values()):.0f} s")
    print(f"the {SLOWEST} slowest:")
    for node, seconds in sorted(tests.items(), key=lambda kv: -kv[1])[:SLOWEST]:
        print(f"  {seconds:7.1f} s  {node}")
    if over:
        print(f"tier {tier.name} is over its budget: move or cheapen the slowest tests (tests/tiers.toml)",
              file=sys.stderr)
    if pytest_code != 0:
        print(f"tier {tier.name}: pytest exited {pytest_code}", file=sys.stderr)
    return 1 if over or pytest_code != 0 else 0


def record(tier: Tier, wall: float, tests: dict[str, float]) -> None:
    doc = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    doc[tier.name] = {"measured": datetime.date.today().isoformat(), "wall_seconds": round(wall, 1),
                      "budget_seconds": tier.budget_seconds, "tests": len(tests),
                      "durations": {k: round(v, 2) for k, v in sorted(tests.items(), key=lambda kv: -kv[1])}}
    tmp = DURATIONS.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, DURATIONS)


def main(argv: list[str] | None = None) -> int:
    known = tiers()
    parser = argparse.ArgumentParser(prog="python -m tests.tiers", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    run = sub.add_parser("run", help="run a tier and hold it to its budget")
    run.add_argument("tier", choices=sorted(known))
    run.add_argument("--record", action="store_true", help="write the durations into tests/durations.json")
    run.add_argument("extra", nargs="*", help="more pytest arguments, after --")
    check = sub.add_parser("check", help="hold a run already made to its tier's budget")
    check.add_argument("tier", choices=sorted(known))
    check.add_argument("--seconds", type=float, required=True, help="the run's wall time")
    check.add_argument("--junit", type=Path, required=True, help="the run's JUnit report (pytest --junitxml)")
    check.add_argument("--exit-code", type=int, default=0, help="pytest's exit code")
    check.add_argument("--record", action="store_true", help="write the durations into tests/durations.json")
    args = parser.parse_args(argv)
    tier = known[args.tier]
    if args.action == "check":
        if not args.junit.is_file():
            parser.error(f"--junit {str(args.junit)!r} is not a file")
        wall, tests, code = args.seconds, durations(args.junit), args.exit_code
    else:
        tests, code, wall = {}, 0, 0.0
        with tempfile.TemporaryDirectory() as tmp:
            for i, command in enumerate(tier.commands):
                junit = Path(tmp) / f"junit{i}.xml"
                print("+", shlex.join([*command, *args.extra]), flush=True)
                start = time.perf_counter()
                run = subprocess.run([sys.executable if command[0] == "python" else command[0], *command[1:],
                                      f"--junitxml={junit}", *args.extra], cwd=ROOT)
                wall += time.perf_counter() - start
                code = code or (0 if run.returncode == 5 else run.returncode)  # 5: this part selected nothing
                tests.update(durations(junit) if junit.is_file() else {})
    if args.record:
        record(tier, wall, tests)
    return report(tier, wall, tests, code)


if __name__ == "__main__":
    sys.exit(main())
