"""Run ``mha-verify ARGS`` for a test: in this process (the unit tier), or as a real process where the
process itself is what is tested (signals, a target that kills its process, the command end to end).

Both return a ``subprocess.CompletedProcess``, so a test reads ``returncode``, ``stdout`` and ``stderr``
the same way whichever it uses. In this process a run costs what its checks cost; a new process pays
about 3.5 s of interpreter, torch and onnxruntime imports before it does anything.

``tests/conftest.py`` hands :func:`run_cli` to tests as the ``cli`` fixture.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import traceback
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path

from tests.source_modules import ROOT


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: object = None, line: str | None = None) -> None:
    """Warnings go to the redirected stderr, as a process of its own prints them."""
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


@contextlib.contextmanager
def _process_like(cwd: Path, env: Mapping[str, str] | None) -> Iterator[None]:
    """The working folder, environment and warning filters a new Python process would start with;
    all restored afterwards."""
    old_cwd, old_env = Path.cwd(), dict(os.environ)
    os.chdir(cwd)
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    try:
        with warnings.catch_warnings():
            # Python's own default filters (pytest's are stricter and would record, not print); changing
            # the filters also forgets which warnings a previous run already printed
            warnings.resetwarnings()
            warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
                warnings.simplefilter("ignore", category)
            warnings.showwarning = _show_warning
            yield
    finally:
        os.chdir(old_cwd)
        if env is not None:
            os.environ.clear()
            os.environ.update(old_env)


def run_cli(*args: str, cwd: Path = ROOT, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``mha-verify ARGS`` as ``main(argv)`` in this process: its exit code, stdout and stderr.

    An exception that escapes ``main`` is printed as the interpreter would and gives exit code 1, so a
    test that says "never a traceback" sees one exactly as it would from a process of its own.
    """
    from mha_verify.cli import main

    out, err = io.StringIO(), io.StringIO()
    with _process_like(cwd, env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's own exit
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
        except Exception:
            print(traceback.format_exc(), file=sys.stderr, end="")
            code = 1
    return subprocess.CompletedProcess(["mha-verify", *args], code, out.getvalue(), err.getvalue())


def run_cli_process(*args: str, cwd: Path = ROOT, env: Mapping[str, str] | None = None,
                    timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``mha-verify ARGS`` in a process of its own (``python -m mha_verify.cli``)."""
    return subprocess.run([sys.executable, "-m", "mha_verify.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=None if env is None else dict(env))
