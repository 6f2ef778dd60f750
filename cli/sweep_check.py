"""The sweep's check stage worker: runs ``mha-verify check`` for one class after another in one
process, so that a sweep pays the interpreter, torch's import and the fork server's imports once
per worker instead of once per class (about 7 s of CPU a class on this 2-core machine, half a
quick class's cost: benchmarks/bench_sweep_classes.py --sweep).

Its one argument names the sweep's folder (shown by ``ps``; nothing reads it). Reads one JSON
line per class on stdin, the ``check`` command's arguments (a list of strings);
answers one JSON line on stdout, ``{"code": exit code, "stderr": its last lines}``. Nothing of the
class runs in this process: ``check`` imports, builds and judges the target in workers forked
from the fork server (:mod:`mha_verify.isolation`), as it does from the command line. The parent
(:mod:`mha_verify.sweep`) kills this process's group past the class's timeout and starts another.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys


def run_one(argv: list[str]) -> dict[str, object]:
    """``mha-verify check`` with ``argv``: its exit code and the last lines it wrote to stderr."""
    from mha_verify.cli import main as cli_main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        try:
            code = cli_main(argv)
        except SystemExit as exc:  # argparse's usage error, or a target's sys.exit in this process
            code = exc.code if isinstance(exc.code, int) else 2
    return {"code": code, "stderr": err.getvalue()[-4000:]}


def main() -> int:
    from mha_verify.exit_codes import EXIT_TERMINATED

    out = sys.stdout
    sys.stdout = sys.stderr  # what runs here must not interleave with the JSON lines
    for line in sys.stdin:
        argv = json.loads(line)
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            answer: dict[str, object] = {"code": 2, "stderr": "the sweep sent something other than arguments"}
        else:
            answer = run_one(argv)
        out.write(json.dumps(answer) + "\n")
        out.flush()
        if answer["code"] == EXIT_TERMINATED:  # SIGTERM: the sweep is ending, and so does its worker
            return EXIT_TERMINATED
    return 0


if __name__ == "__main__":
    sys.exit(main())
