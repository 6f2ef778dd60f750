"""The exit codes of every ``mha-verify`` subcommand, in one place (the README's "Exit codes" lists them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mha_verify.properties.engine.results import CheckResult

EXIT_OK = 0  # every check passed (or was declared, warned or not applicable, with at least one pass)
EXIT_FAIL = 1  # a check failed, or nothing was verified
EXIT_USAGE = 2  # a usage or input error: one line on stderr, no traceback, no partial file
EXIT_ERROR = 3  # a check of mha-verify itself raised (and none failed): no verdict; a defect of mha-verify to report
EXIT_INTERRUPTED = 130  # interrupted by the user (SIGINT)
EXIT_TERMINATED = 143  # ended by SIGTERM (a CI cancelling the job), every worker process ended too


def usage_error(message: str) -> int:
    """Say a usage error on one line of stderr (control characters escaped); the exit code for it."""
    import sys

    from mha_verify.escape import printable

    print(printable(f"mha-verify: error: {message}"), file=sys.stderr)
    return EXIT_USAGE


def verdicts_exit(results: Sequence[CheckResult], *, passing: tuple[str, ...] = ("pass", "declared", "finding")) -> int:
    """The exit code of a run's verdicts: 1 if a check failed; else 3 if a check of mha-verify raised
    (each said on one line of stderr: the run has no verdict there, and is never green); else 1 if
    no check's verdict is in ``passing`` (nothing was verified, said on stderr); else 0."""
    import sys

    from mha_verify.escape import printable

    for r in results:
        if r.errored:
            print(printable(f"mha-verify: error: {r.stage}/{r.name}: {(r.reason or 'raised').splitlines()[0][:300]}"),
                  file=sys.stderr)
    if any(r.failed for r in results):
        return EXIT_FAIL
    if any(r.errored for r in results):
        return EXIT_ERROR
    if not any(r.verdict in passing for r in results):
        print("mha-verify: nothing was verified: no check passed (every one failed, warned or was not "
              "applicable); this is not a pass", file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK
