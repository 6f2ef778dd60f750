"""The example database is hostile input: its credentials never reach an output, and a poisoned
entry (a FIFO, a huge file, a Redis key of the wrong type) is skipped with one warning, never
blamed on the target nor allowed to hang or fail the check of a correct layer."""

from __future__ import annotations

import os
import shutil
import subprocess
import warnings
from collections.abc import Iterable
from pathlib import Path

import pytest
from hypothesis import settings as Settings
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase, InMemoryExampleDatabase

from mha_verify.properties.engine import profiles
from mha_verify.properties.engine.databases import (
    MAX_ENTRY_BYTES,
    REDIS_PREFIX,
    DatabaseWarning,
    GuardedDatabase,
    mask_secrets,
    redact,
)
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.targets.eager import load_target
from tests.cli_run import run_cli, run_cli_process
from tests.redis_server import free_port, redis_server

ROOT = Path(__file__).resolve().parent.parent
SECRET = "s3cret"
CHECK = ["check", "--no-export", "--only", "oracle_agreement", "--max-examples", "3", "--jobs", "1"]
#: a run that fails, so that the reports carry the replay command with its --database
FAILING = ["check", "--no-export", "--only", "fully_masked_rows", "--max-examples", "10", "--jobs", "1",
           "--target", "tests/fixtures/seed_000.py:MultiHeadAttention"]


def cli(*args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """In this process; in a process of its own where a hang is what could happen (``timeout``)."""
    return run_cli(*args) if timeout is None else run_cli_process(*args, timeout=timeout)


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "DatabaseWarning" in line]


# --- credentials ------------------------------------------------------------------------------

#: (URL, the secrets in it): every form a Redis password can take in a URL
URLS = [
    pytest.param("redis://:s3cret@127.0.0.1:{port}/0", [SECRET], id="userinfo"),
    pytest.param("redis://127.0.0.1:{port}/0?password=s3cret", [SECRET], id="query"),
    pytest.param("redis://127.0.0.1:{port}/0?db=0&PassWord=s3cret&socket_timeout=5", [SECRET], id="query-case"),
    pytest.param("redis://user:p@ss-s3cret@127.0.0.1:{port}/0", ["p@ss-s3cret", "ss-s3cret"], id="at-in-password"),
    pytest.param("redis://:s%33cret@127.0.0.1:{port}/0", [SECRET, "s%33cret"], id="percent-encoded"),
    pytest.param("rediss://:s3cret@127.0.0.1:{port}/0?ssl_password=s3cret", [SECRET], id="rediss"),
    pytest.param("redis://127.0.0.1:{port}/0?auth=s3cret&pwd=s3cret&token=s3cret", [SECRET], id="auth-pwd-token"),
    pytest.param("unix:///tmp/mha-verify-no-such.sock?db=0&password=s3cret", [SECRET], id="unix"),
    pytest.param("redis://127.0.0.1:{port}/0?no_such_option=1&password=s3cret", [SECRET], id="unknown-option"),
]


@pytest.mark.parametrize(("url", "secrets"), URLS)
def test_redact_hides_every_form_of_password(url: str, secrets: list[str]) -> None:
    shown = redact(url.format(port=6379))
    assert not [s for s in secrets if s in shown], shown
    assert "127.0.0.1:6379/0" in shown or "/tmp/mha-verify-no-such.sock" in shown, shown  # where it points stays
    message = f"could not connect with {url.format(port=6379)}; AUTH {secrets[0]} failed"
    assert not [s for s in secrets if s in mask_secrets(message, url)], mask_secrets(message, url)


def test_redact_leaves_the_rest_alone() -> None:
    assert redact("/shared/examples") == "/shared/examples"
    assert redact("redis://db.example:6379/0?socket_timeout=5") == "redis://db.example:6379/0?socket_timeout=5"
    assert redact("REDIS://:pw@h:1/0") == "REDIS://***@h:1/0"
    assert mask_secrets("nothing secret here", "redis://h:1/0") == "nothing secret here"


def _assert_hidden(got: subprocess.CompletedProcess[str], secrets: list[str], files: Iterable[Path]) -> None:
    __tracebackhide__ = True
    for where, text in [("stdout", got.stdout), ("stderr", got.stderr),
                        *((str(f), f.read_text()) for f in files if f.exists())]:
        found = [s for s in secrets if s in text]
        assert not found, f"{where} shows {found}:\n{text[-2000:]}"


@pytest.mark.integration
@pytest.mark.parametrize(("url", "secrets"), URLS)
def test_unreachable_redis_shows_no_password(url: str, secrets: list[str], tmp_path: Path) -> None:
    """Nothing listens on the port: a usage error (the redis package missing is one too), one line."""
    files = [tmp_path / "R.json", tmp_path / "R.xml", tmp_path / "R.html"]
    got = cli(*CHECK, "--database", url.format(port=free_port()), "--report", str(files[0]),
              "--junit", str(files[1]), "--html", str(files[2]))
    assert got.returncode == 2, got.stdout + got.stderr
    assert len(got.stderr.strip().splitlines()) == 1 and "Traceback" not in got.stderr, got.stderr
    _assert_hidden(got, secrets, files)
    assert not [f for f in files if f.exists()]


@pytest.mark.integration  # starts a redis-server
@pytest.mark.parametrize(("form", "config", "secrets"), [
    pytest.param("redis://127.0.0.1:{port}/0?password=s3cret", ["--requirepass", SECRET], [SECRET], id="query"),
    pytest.param("redis://user:p@ss-s3cret@127.0.0.1:{port}/0",
                 ["--user", "user", "on", ">p@ss-s3cret", "~*", "&*", "+@all"], ["p@ss-s3cret", "ss-s3cret"],
                 id="at-in-password"),
])
def test_reports_of_a_password_protected_redis_show_no_password(
        form: str, config: list[str], secrets: list[str], tmp_path: Path) -> None:
    """The server is reached and the check fails: every output is written, the replay command
    (with its --database) among them."""
    with redis_server(tmp_path, *config) as port:
        files = [tmp_path / "R.json", tmp_path / "R.xml", tmp_path / "R.html"]
        got = cli(*FAILING, "--database", form.format(port=port), "--report", str(files[0]),
                  "--junit", str(files[1]), "--html", str(files[2]))
    assert got.returncode == 1, got.stdout + got.stderr
    assert all(f.exists() for f in files) and "--database" in files[0].read_text(), got.stdout + got.stderr
    _assert_hidden(got, secrets, files)
    assert not _warnings(got.stderr), got.stderr  # the password was right: the database worked


# --- poisoned entries -------------------------------------------------------------------------

class _Recording(InMemoryExampleDatabase):
    def __init__(self) -> None:
        super().__init__()
        self.keys: list[bytes] = []

    def fetch(self, key: bytes) -> Iterable[bytes]:
        self.keys.append(key)
        return super().fetch(key)


@pytest.fixture(scope="module")
def primary_key() -> bytes:
    """The key under which CHECK looks for its stored failures first, learnt from a run of the
    same check here (Hypothesis keys by the source of the test function, which every run shares)."""
    db = _Recording()
    run_property(all_properties()["oracle_agreement"], load_target(),
                 settings=Settings(profiles.PROFILES["quick"], max_examples=1, database=db), seed=0)
    assert db.keys and b"oracle_agreement|" in db.keys[0], db.keys
    return db.keys[0]


def _entry_path(folder: Path, key: bytes) -> Path:
    """Where Hypothesis's folder database keeps an entry of ``key``: found by saving one through its
    public API and looking for the file."""
    marker = b"mha-verify-test-marker"
    DirectoryBasedExampleDatabase(folder).save(key, marker)
    (path,) = [p for p in folder.rglob("*") if p.is_file() and p.read_bytes() == marker]
    return path


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _huge(path: Path) -> None:
    with open(path, "wb") as f:
        f.truncate(1 << 30)  # sparse: 1 GiB of zeros, each a choice Hypothesis would decode


def _directory(path: Path) -> None:
    path.mkdir()
    (path / "inside").write_bytes(b"x")


def _unreadable(path: Path) -> None:
    path.write_bytes(b"\x00")
    path.chmod(0)


def _dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _key_folder_to_dev(path: Path) -> None:
    shutil.rmtree(path.parent)
    path.parent.symlink_to("/dev")  # Hypothesis would read every device in it, /dev/zero and /dev/urandom too


def _poisoned(folder: Path, key: bytes, poison) -> None:  # type: ignore[no-untyped-def]
    entry = _entry_path(folder, key)
    entry.unlink()
    poison(entry)


@pytest.mark.integration
@pytest.mark.parametrize("poison", [
    pytest.param(_fifo, id="fifo"),
    pytest.param(_huge, id="1GiB-file"),
    pytest.param(_directory, id="directory"),
    pytest.param(_unreadable, id="unreadable", marks=pytest.mark.skipif(
        hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads a file whatever its mode")),
    pytest.param(_dev_zero, id="symlink-to-dev-zero"),
    pytest.param(_key_folder_to_dev, id="key-folder-symlink-to-dev"),
])
def test_poisoned_folder_entry_is_skipped(poison, primary_key: bytes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The check passes, with one warning naming the folder (a hang was the worker's 60 s timeout: a failure)."""
    folder = tmp_path / "db"
    _poisoned(folder, primary_key, poison)
    got = cli(*CHECK, "--database", str(folder), timeout=120)
    assert got.returncode == 0, got.stdout + got.stderr
    said = _warnings(got.stderr)
    assert len(said) == 1 and str(folder) in said[0], got.stderr


@pytest.mark.integration
def test_fifo_entry_does_not_hang_a_check_in_process(primary_key: bytes, tmp_path: Path) -> None:
    """Without a worker (and its timeout) around the check, a FIFO read would block it for good."""
    folder = tmp_path / "db"
    _poisoned(folder, primary_key, _fifo)
    got = cli(*CHECK, "--no-isolation", "--database", str(folder), timeout=120)  # TimeoutExpired: it hung
    assert got.returncode == 0, got.stdout + got.stderr
    assert len(_warnings(got.stderr)) == 1, got.stderr


@pytest.mark.integration  # starts a redis-server
@pytest.mark.parametrize("kind", ["string", "list", "hash"])
def test_redis_key_of_the_wrong_type_is_skipped(kind: str, primary_key: bytes, tmp_path: Path) -> None:
    import redis

    with redis_server(tmp_path) as port:
        url = f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(url)
        key = REDIS_PREFIX + primary_key
        {"string": lambda: client.set(key, b"not a set"), "list": lambda: client.rpush(key, b"a", b"b"),
         "hash": lambda: client.hset(key, b"a", b"b")}[kind]()
        got = cli(*CHECK, "--database", url, timeout=120)
    assert got.returncode == 0, got.stdout + got.stderr
    assert "ResponseError" not in got.stdout, got.stdout
    said = _warnings(got.stderr)
    assert len(said) == 1 and f"127.0.0.1:{port}" in said[0], got.stderr


# --- the guard, in this process ---------------------------------------------------------------

class _Broken(ExampleDatabase):
    """Raises ``error`` from every call (lazily from fetch, as a generator does); named ``name``."""

    def __init__(self, error: Exception, name: str) -> None:
        super().__init__()
        self.error, self.name = error, name

    def __repr__(self) -> str:
        return f"_Broken({self.name!r})"

    def save(self, key: bytes, value: bytes) -> None:
        raise self.error

    def fetch(self, key: bytes) -> Iterable[bytes]:
        yield b"\x01"
        raise self.error

    def delete(self, key: bytes, value: bytes) -> None:
        raise self.error

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        raise self.error


@pytest.mark.parametrize("error", [OSError(5, "Input/output error"), ValueError("bad base64"),
                                   RuntimeError("WRONGTYPE Operation against a key")],
                         ids=["OSError", "ValueError", "backend-error"])
def test_backend_errors_are_one_warning(error: Exception) -> None:
    name = f"broken by {error!r}"
    guarded = GuardedDatabase(_Broken(error, name))
    with pytest.warns(DatabaseWarning, match=type(error).__name__) as said:
        assert list(guarded.fetch(b"k")) == [b"\x01"]
        guarded.save(b"k", b"v")
        guarded.delete(b"k", b"v")
        guarded.move(b"k", b"j", b"v")
        assert list(GuardedDatabase(_Broken(error, name)).fetch(b"k")) == [b"\x01"]  # the same database: said once
    assert len([w for w in said if issubclass(w.category, DatabaseWarning)]) == 1


def test_oversized_entries_are_skipped() -> None:
    inner = InMemoryExampleDatabase()
    inner.save(b"k", b"small")
    inner.save(b"k", b"x" * (MAX_ENTRY_BYTES + 1))
    with pytest.warns(DatabaseWarning, match="larger than"):
        assert list(GuardedDatabase(inner).fetch(b"k")) == [b"small"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(GuardedDatabase(InMemoryExampleDatabase()).fetch(b"k")) == []  # nothing wrong: nothing said


def test_folder_entries_read_only_when_regular_and_small(tmp_path: Path) -> None:
    """Every bad kind of entry in one key: the good one is read, the FIFO never blocks."""
    folder = tmp_path / "db"
    good = _entry_path(folder, b"k")
    for name, poison in [("fifo", _fifo), ("dir", _directory), ("zero", _dev_zero), ("huge", _huge)]:
        poison(good.with_name(name))
    with pytest.warns(DatabaseWarning, match="not a regular file|larger than") as said:
        got = list(GuardedDatabase(DirectoryBasedExampleDatabase(folder)).fetch(b"k"))
    assert got == [b"mha-verify-test-marker"]
    assert len(said) == 1 and str(folder) in str(said[0].message)


def test_errors_raised_as_warnings_do_not_reach_the_check() -> None:
    """``-W error`` (or pytest's filterwarnings=error) must not turn a bad cache into a failure of the target."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(GuardedDatabase(_Broken(OSError(5, "gone"), "raises its warning")).fetch(b"k")) == [b"\x01"]
