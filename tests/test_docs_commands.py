"""Every command the README and docs/ show is checked against the code, so the docs cannot drift.

Commands are the lines of ```sh (bash, console, shell) blocks, continuations joined, and the
``run:`` steps of ```yaml blocks. Each is checked by what it is (a rule per kind, below; a
command of no known kind fails, so a new kind of command needs a rule, not an exemption):

* ``mha-verify ...``: parsed by the CLI's own parser in the fast tier (every flag and choice
  must exist; ``<placeholders>`` and ``${{ }}`` expressions stand for a value), and run in the
  deep tier, in a temporary folder for every path under /tmp, with its exit code checked: 0,
  or the code a trailing ``# exits N`` states. A block after ``<!-- docs: record -->`` is a
  record of what was run for a report (hours of sweeps): parsed, never run. So are the steps of
  a ```yaml workflow and a command naming ``mypkg``, the docs' name for the reader's own
  package: they run in the reader's repository. A command whose library is not installed is
  skipped with the reason.
* ``pip install ...``: every file (-c, -r) and extra it names exists; the Quick start's two
  commands are the ones CI runs itself (.ci/run), so they are not run twice.
* ``python -m pytest`` / ``pytest``: the suite itself, not run from within it: every marker
  (-m) it selects is declared, and every ``--mha-*`` option is one the plugin registers.
* ``tox -e NAME``: NAME is an environment of tox.ini. ``ruff check ...`` runs (seconds; skipped,
  with the reason, where the dev extra is not installed); ``mypy`` runs in the deep tier.
  ``python -m benchmarks.X`` / ``python benchmarks/x.py``: the module exists (benchmarks print
  ratios; they are not tests).
* shell set-up (``python -m venv``, ``. .venv/bin/activate``, ``export NAME=...``) changes the
  shell, and is said so.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
import tomllib

from mha_verify.cli import build_parser, with_subcommand
from tests.source_modules import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w*)\s*$")
_RECORD = "<!-- docs: record -->"


class Command(NamedTuple):
    where: str  # README.md:46
    text: str
    record: bool  # a record of a past run, or a workflow step for the reader's repository: parsed, not run


def _commands(path: Path, root: Path = ROOT) -> list[Command]:
    out: list[Command] = []
    lines = path.read_text().splitlines()
    lang: str | None = None
    record = False
    pending, start = "", 0
    for no, line in enumerate(lines, 1):
        fence = _FENCE.match(line)
        if fence and lang is None:
            lang = fence.group(1)
            record = any(_RECORD in prev for prev in lines[max(0, no - 3):no - 1])
            continue
        if fence:
            lang = None
            continue
        if lang in ("sh", "bash", "console", "shell"):
            text = line.removeprefix("$ ").strip()
            if not pending:
                start = no
            if text.endswith("\\"):
                pending += text[:-1].rstrip() + " "
                continue
            text, pending = (pending + text).strip(), ""
            if text and not text.startswith("#"):
                out.append(Command(f"{path.relative_to(root)}:{start}", text, record))
        elif lang == "yaml":
            step = re.match(r"^\s*-?\s*run:\s*(.*)$", line)
            if step:
                text = step.group(1).strip()
                if text in (">", "|"):  # a folded block: the indented lines that follow
                    indent = len(line) - len(line.lstrip()) + 2
                    body = []
                    for more in lines[no:]:
                        if more.strip() and len(more) - len(more.lstrip()) < indent:
                            break
                        body.append(more.strip())
                    text = " ".join(b for b in body if b)
                out.append(Command(f"{path.relative_to(root)}:{no}", text, True))
    return out


ALL = [c for path in DOCS for c in _commands(path)]


def _quick_start() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("## Quick start", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.splitlines() if line.strip()]


def _parts(command: str) -> list[list[str]]:
    """The simple commands of a line (split at && and ;), each without its trailing comment."""
    command = re.sub(r"\$\{\{[^}]*\}\}", "1", command)  # GitHub expressions stand for a value
    words = shlex.split(command, comments=True)
    parts, cur = [], []
    for w in words:
        if w in ("&&", ";", "||"):
            parts.append(cur)
            cur = []
        else:
            cur.append(w)
    return [p for p in [*parts, cur] if p]


def _expected_exit(command: str) -> int:
    m = re.search(r"#\s*exits\s+(\d+)", command)
    return int(m.group(1)) if m else 0


def _env_prefix(words: list[str]) -> list[str]:
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        words = words[1:]
    return words


def _kind(words: list[str]) -> str:
    words = _env_prefix(words)
    head = words[0]
    if head == "mha-verify":
        return "mha-verify"
    if head == "pip" and words[1:2] == ["install"]:
        return "pip"
    if head == "pytest" or words[:3] == ["python", "-m", "pytest"]:
        return "pytest"
    if head == "tox":
        return "tox"
    if head == "ruff":
        return "ruff"
    if head == "mypy":
        return "mypy"
    if (words[:2] == ["python", "-m"] and words[2].startswith("benchmarks.")) or \
            (head == "python" and len(words) > 1 and words[1].startswith("benchmarks/")):
        return "benchmark"
    if words[:3] == ["python", "-m", "venv"] or head in (".", "source", "export"):
        return "shell"
    return "unknown"


def _ids(c: Command) -> str:
    return c.where


def _parse_cli(words: list[str]) -> None:
    args = [re.sub(r"<[^>]*>", "x", w) for w in _env_prefix(words)[1:]]
    parser = build_parser()
    try:
        parser.parse_args(with_subcommand(args))
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise AssertionError(f"the CLI's parser refuses {shlex.join(words)!r}") from None


_DECLARED = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _markers() -> set[str]:
    return {m.split(":", 1)[0].strip() for m in _DECLARED["tool"]["pytest"]["ini_options"]["markers"]}


def _plugin_options() -> set[str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    return set(re.findall(r"--mha-[a-z-]+", proc.stdout))


def _check_static(words: list[str], quick_start: list[str], command: str) -> str | None:
    """The fast tier's check of one simple command; returns what was checked, or fails."""
    kind = _kind(words)
    words = _env_prefix(words)
    if kind == "mha-verify":
        _parse_cli(words)
        return "parsed"
    if kind == "pip":
        for flag, value in itertools.pairwise(words):
            if flag in ("-c", "-r"):
                assert (ROOT / value).is_file(), f"{command!r} names {value}, which does not exist"
        extras = set(_DECLARED["project"]["optional-dependencies"])
        for w in words:
            m = re.fullmatch(r"\.(?:\[([\w,]+)\])?", w)
            if m and m.group(1):
                assert set(m.group(1).split(",")) <= extras, f"{command!r}: no such extra in pyproject"
        return "quick start (CI runs it)" if command in quick_start else "files and extras exist"
    if kind == "pytest":
        for flag, value in itertools.pairwise(words[words.index("pytest") + 1:]):
            if flag == "-m":
                named = set(re.findall(r"\w+", value)) - {"not", "and", "or"}
                assert named <= _markers(), f"{command!r} selects undeclared markers {named - _markers()}"
        wanted = {w.split("=")[0] for w in words if w.startswith("--mha-")}
        if wanted:
            assert wanted <= _plugin_options(), f"{command!r}: the plugin has no {wanted - _plugin_options()}"
        return "markers and options exist"
    if kind == "tox":
        envs = set(re.findall(r"^\[testenv:([\w-]+)\]", (ROOT / "tox.ini").read_text(), re.M))
        name = words[words.index("-e") + 1]
        assert name in envs, f"{command!r}: tox.ini has no environment {name}"
        return "tox env exists"
    if kind == "benchmark":
        if words[1] == "-m":
            module = ROOT / f"{words[2].replace('.', '/')}.py"
            assert module.is_file(), f"{command!r}: no {module.relative_to(ROOT)}"
        else:
            assert (ROOT / words[1]).is_file(), f"{command!r}: no {words[1]}"
        return "module exists"
    if kind in ("ruff", "mypy", "shell"):
        return kind
    raise AssertionError(f"{command!r} is a command of no known kind: give it a rule in this test")


def test_the_docs_show_commands() -> None:
    """The scan has teeth: it finds the README's and each page's commands (none found would pass all)."""
    assert len(ALL) >= 15, [c.where for c in ALL]
    assert {c.where.split(":")[0] for c in ALL} >= {"README.md", "docs/cli.md", "docs/development.md",
                                                    "docs/past-one-machine.md"}
    assert _quick_start() == [c.text for c in ALL if c.where.startswith("README.md")][:2]


@pytest.mark.parametrize("command", ALL, ids=_ids)
def test_each_command_names_what_exists(command: Command) -> None:
    quick = _quick_start()
    checked = [_check_static(words, quick, command.text) for words in _parts(command.text)]
    assert checked, f"{command.where}: nothing to check in {command.text!r}"
    if any(_kind(w) == "ruff" for w in _parts(command.text)):
        ruff = _env_prefix(next(w for w in _parts(command.text) if _kind(w) == "ruff"))
        if shutil.which("ruff") is None:  # .ci/run installs the dev extra, and runs ruff, after the tests
            pytest.skip("ruff is not installed here (the dev extra installs it)")
        proc = subprocess.run([*ruff, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr


RUNNABLE = [c for c in ALL if not c.record and "mypkg" not in c.text
            and all(_kind(w) in ("mha-verify", "mypy") for w in _parts(c.text))]


def _library(command: str) -> str | None:
    m = re.search(r"--target\s+([A-Za-z_]\w*)\.", command) or re.search(r"\bsweep\s+(\w+)", command)
    return m.group(1) if m else None


@pytest.mark.serial
@pytest.mark.deep
@pytest.mark.parametrize("command", RUNNABLE, ids=_ids)
def test_each_command_runs(command: Command, tmp_path: Path) -> None:
    library = _library(command.text)
    if library and importlib.util.find_spec(library) is None:
        pytest.skip(f"{library} is not installed here (tests/ecosystem/requirements.txt installs it)")
    text = command.text.replace("/tmp/", f"{tmp_path}/")
    # commands of one block share their /tmp files (an export, then its validation): run the block's
    # earlier commands first, in the same folder
    block = [c for c in RUNNABLE if c.where.split(":")[0] == command.where.split(":")[0]]
    needs = [c for c in block[:block.index(command)]
             if any(f.replace("/tmp/", f"{tmp_path}/") in text for f in re.findall(r"/tmp/[\w.-]+", c.text))]
    # nothing is written into the repository: no bytecode beside the targets it imports
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    for earlier in needs:
        made = subprocess.run(["bash", "-c", earlier.text.replace("/tmp/", f"{tmp_path}/")], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=900)
        assert made.returncode == _expected_exit(earlier.text), (
            f"{earlier.where}, which {command.where} needs, exited {made.returncode}\n{made.stderr[-3000:]}")
    proc = subprocess.run(["bash", "-c", text], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == _expected_exit(command.text), (
        f"{command.where}: {command.text!r} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def test_parse_has_teeth() -> None:
    """A flag the CLI does not have is refused by the fast tier's parse."""
    with pytest.raises(AssertionError, match="refuses"):
        _parse_cli(["mha-verify", "check", "--no-such-flag"])
    with pytest.raises(AssertionError, match="no known kind"):
        _check_static(["curl", "x"], [], "curl x")


def test_a_continued_line_and_a_yaml_step_are_one_command(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("```sh\nmha-verify check \\\n  --profile quick  # exits 1\n```\n\n"
                    "```yaml\n      - run: >\n          mha-verify check\n          --profile ci\n```\n")
    found = [c.text for c in _commands(page, root=tmp_path)]
    assert found == ["mha-verify check --profile quick  # exits 1", "mha-verify check --profile ci"]
    assert _expected_exit(found[0]) == 1

