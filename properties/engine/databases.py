"""Where the example database lives: ``--database`` is a folder (local, or shared storage such as
NFS) or a Redis URL, opened as Hypothesis's own backends, and read with distrust.

- a folder: :class:`hypothesis.database.DirectoryBasedExampleDatabase`. Hypothesis writes each
  entry as its own file named by its hash (create, then rename), so processes and machines that
  mount one folder can write to it side by side.
- ``redis://[[user]:password@]host[:port][/db][?password=...]``, ``rediss://`` (TLS) or
  ``unix:///path/redis.sock[?password=...]``: :class:`hypothesis.extra.redis.RedisExampleDatabase`
  (needs the ``redis`` package: ``pip install 'mha-verify[redis]'``). Entries expire after
  :data:`REDIS_EXPIRY` without use, so that a database shared by a whole CI fleet does not grow
  forever; a failure a run replays is renewed.

Either way the checks key their entries by property and target (:mod:`.keyed_database`): a
counterexample found by one shard, worker or machine is replayed first by every later run of
that check on that target, wherever it runs.

A shared database is input anyone with write access to it controls, and only a cache: the checks
read it through :class:`GuardedDatabase`, which skips what is not an entry Hypothesis wrote (a
FIFO, a huge file, a Redis key of another type, a server gone) with one :class:`DatabaseWarning`,
so that a poisoned database can neither hang a check nor fail it in the target's name. Its
password is never shown: :func:`redact` and :func:`mask_secrets` hide it wherever it is written.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import warnings
from collections.abc import Iterable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote, unquote_plus, urlsplit

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
#: entries unused this long are dropped by Redis (Hypothesis's default is 8 days; a nightly
#: search feeding a weekly release gate needs longer)
REDIS_EXPIRY = timedelta(days=30)
#: our keys in a Redis shared with other tools
REDIS_PREFIX = b"mha-verify-example:"
#: the largest entry read: Hypothesis's own are choice sequences of a few hundred bytes
MAX_ENTRY_BYTES = 1 << 20

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
#: query parameters that carry a secret: password, ssl_password, passwd, pwd, auth, token, ...
_SECRET_PARAM = re.compile(r"pass|pwd|auth|token|secret|credential", re.IGNORECASE)
_HIDDEN = "***"


def is_redis(spec: str) -> bool:
    return spec.startswith(REDIS_SCHEMES)


def _split(spec: str) -> tuple[str, str | None, str, str, str] | None:
    """(scheme://, credentials or None, host and path, "?" or "", query) of a URL; None for a folder.

    The credentials run to the LAST ``@`` of the URL: a password may hold an unescaped ``@``
    (or ``/``, ``?``), and a host never does. A path or query holding one is shown shorter,
    never a password longer.
    """
    scheme = _URL.match(spec)
    if scheme is None:
        return None
    rest = spec[scheme.end():]
    credentials, at, rest = rest.rpartition("@")
    where, sep, query = rest.partition("?")
    return scheme.group(), credentials if at else None, where, sep, query


def _secret_params(query: str) -> Iterator[tuple[int, int]]:
    """(start, end) in ``query`` of the value of each parameter whose name says it is a secret."""
    start = 0
    for part in re.split(r"[&;]", query):
        name, eq, _ = part.partition("=")
        if eq and _SECRET_PARAM.search(unquote_plus(name)):
            yield start + len(name) + 1, start + len(part)
        start += len(part) + 1


def _secrets(spec: str) -> list[str]:
    """Every password ``spec`` holds, as written and as decoded, longest first."""
    parts = _split(spec)
    if parts is None:
        return []
    _, credentials, _, _, query = parts
    raw = [query[a:b] for a, b in _secret_params(query)]
    if credentials:
        raw += [credentials, credentials.partition(":")[2]]
    with contextlib.suppress(ValueError):  # not a URL urllib can parse: ours stands
        raw.append(urlsplit(spec).password or "")  # what the redis library takes, where it parses otherwise
    found = {s for r in raw for s in (r, unquote(r), unquote_plus(r), unquote(unquote_plus(r))) if s}
    return sorted(found, key=len, reverse=True)


def redact(spec: str) -> str:
    """``spec`` with the credentials of a URL hidden: it is printed, and written into reports.

    The user and password before the host, and the value of every query parameter named like a
    secret (``password``, ``ssl_password``, ``pwd``, ``auth``, ``token``, any case).

    >>> redact("redis://:s3cret@db.example:6379/0")
    'redis://***@db.example:6379/0'
    >>> redact("redis://db.example:6379/0?password=s3cret&socket_timeout=5")
    'redis://db.example:6379/0?password=***&socket_timeout=5'
    >>> redact("/shared/examples")
    '/shared/examples'
    """
    parts = _split(spec)
    if parts is None:
        return spec
    scheme, credentials, where, sep, query = parts
    for a, b in reversed(list(_secret_params(query))):
        query = query[:a] + _HIDDEN + query[b:]
    shown = scheme + ("" if credentials is None else f"{_HIDDEN}@" if credentials else "@") + where + sep + query
    return _replace(shown, _secrets(spec))


def _replace(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, _HIDDEN)
    return text


def mask_secrets(text: str, spec: str) -> str:
    """``text`` (a message, an exception's words) with ``spec`` shown redacted and every password
    of ``spec`` hidden wherever it appears: a library's own message may echo the URL."""
    return _replace(text.replace(spec, redact(spec)), _secrets(spec))


def _redis_client(spec: str, **options: float) -> Any:  # redis.Redis; the package is optional
    try:
        import redis
    except ImportError:
        raise ValueError(f"--database {redact(spec)!r} is a Redis URL, and the redis package is not installed: "
                         "pip install 'mha-verify[redis]'") from None
    try:
        return redis.Redis.from_url(spec, **options)
    except ValueError as exc:
        raise ValueError(mask_secrets(f"--database {redact(spec)!r} is not a Redis URL redis can use: {exc}",
                                      spec)) from None


def open_database(spec: str) -> ExampleDatabase:
    """The Hypothesis database ``spec`` names (see the module docstring); ValueError naming it
    when it cannot be used. Opening connects nothing: a Redis client connects on first use."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"database must be a folder or a Redis URL, got database={spec!r}")
    if not is_redis(spec):
        return DirectoryBasedExampleDatabase(spec)
    client = _redis_client(spec)
    from hypothesis.extra.redis import RedisExampleDatabase

    return RedisExampleDatabase(client, expire_after=REDIS_EXPIRY, key_prefix=REDIS_PREFIX)


def prepare(spec: str, *, timeout: float = 5.0) -> None:
    """Make the database usable before any check runs: create the folder, or reach the Redis
    server (one PING). ValueError (a usage error) naming it, password hidden, if it cannot be."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"--database must be a folder or a Redis URL, got {spec!r}")
    if not is_redis(spec):
        try:
            Path(spec).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(mask_secrets(f"--database {redact(spec)!r}: cannot create the folder: "
                                          f"{exc.strerror or exc}", spec)) from None
        return
    import redis

    client = _redis_client(spec, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        client.ping()
    except (redis.RedisError, OSError) as exc:
        raise ValueError(mask_secrets(f"--database {redact(spec)!r}: cannot reach the Redis server: {exc}",
                                      spec)) from None
    except (TypeError, ValueError) as exc:  # a query option the client does not take (?foo=1)
        raise ValueError(mask_secrets(f"--database {redact(spec)!r} is not a Redis URL redis can use: {exc}",
                                      spec)) from None
    finally:
        client.close()


class DatabaseWarning(UserWarning):
    """The example database could not be read or written, or held an entry that is not one
    Hypothesis wrote: skipped, and the check goes on without it."""


#: the databases already warned about in this process (by name): one warning each
_WARNED: set[str] = set()


class _NotAnEntryError(Exception):
    """A file in a folder database that is no entry of Hypothesis's: why, in words."""


def _read_entry(path: Path) -> bytes:
    """The bytes of a folder database's entry file; _NotAnEntryError or OSError where it is not a
    regular file of at most MAX_ENTRY_BYTES. A FIFO or a device is never opened (so it cannot
    block, or stream forever), and a file swapped for one after the look is never read."""

    def check(st: os.stat_result) -> None:
        if not stat.S_ISREG(st.st_mode):
            raise _NotAnEntryError(f"{path} is not a regular file (mode {stat.filemode(st.st_mode)})")
        if st.st_size > MAX_ENTRY_BYTES:
            raise _NotAnEntryError(f"{path} is larger than {MAX_ENTRY_BYTES} bytes ({st.st_size})")

    check(os.lstat(path))
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags)
    try:
        check(os.fstat(fd))
        chunks, size = [], 0
        while chunk := os.read(fd, MAX_ENTRY_BYTES + 1 - size):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_ENTRY_BYTES:
                raise _NotAnEntryError(f"{path} is larger than {MAX_ENTRY_BYTES} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _describe(db: ExampleDatabase) -> tuple[str, list[str]]:
    """A name for ``db`` that holds no password, and the passwords its messages must not show."""
    if isinstance(db, DirectoryBasedExampleDatabase):
        return str(db.path), []
    try:
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError:  # no redis package: db is no Redis database
        return repr(db), []
    if not isinstance(db, RedisExampleDatabase):
        return repr(db), []
    pool = db.redis.connection_pool
    kw = pool.connection_kwargs
    secrets = sorted({str(kw[k]) for k in ("password", "ssl_password") if kw.get(k)}, key=len, reverse=True)
    if "path" in kw:
        return f"unix://{kw['path']}?db={kw.get('db', 0)}", secrets
    scheme = "rediss" if "SSL" in pool.connection_class.__name__ else "redis"
    return f"{scheme}://{kw.get('host')}:{kw.get('port')}/{kw.get('db', 0)}", secrets


def _reads_folder(db: ExampleDatabase) -> bool:
    """Whether ``db`` reads its entries with Hypothesis's folder fetch (that trusts every file)."""
    return isinstance(db, DirectoryBasedExampleDatabase) and type(db).fetch is DirectoryBasedExampleDatabase.fetch


class GuardedDatabase(ExampleDatabase):
    """``inner`` as a cache that may hold anything: whatever its backend raises (OSError, a
    Redis error, a decoding ValueError), and every entry larger than :data:`MAX_ENTRY_BYTES`,
    is skipped with one :class:`DatabaseWarning` per database and process. A folder's entries
    are read only where they are regular files within the limit.

    >>> from hypothesis.database import InMemoryExampleDatabase
    >>> inner = InMemoryExampleDatabase()
    >>> GuardedDatabase(inner).save(b"k", b"1")
    >>> list(GuardedDatabase(inner).fetch(b"k"))
    [b'1']
    """

    def __init__(self, inner: ExampleDatabase) -> None:
        super().__init__()
        if not isinstance(inner, ExampleDatabase):
            raise TypeError(f"inner must be a hypothesis ExampleDatabase, got inner={inner!r}")
        self.inner = inner
        self.name, self._secrets = _describe(inner)

    def _skip(self, problem: str) -> None:
        if self.name in _WARNED:
            return
        _WARNED.add(self.name)
        said = _replace(f"example database {self.name!r}: {problem}; skipped, as is every later problem of this "
                        "database in this process: it is a cache, and the check goes on without it", self._secrets)
        with contextlib.suppress(DatabaseWarning):  # an error filter (-W error) must not fail the check for it
            warnings.warn(DatabaseWarning(said), stacklevel=2)

    def _failed(self, what: str, exc: Exception) -> None:
        self._skip(f"{what} raised {type(exc).__name__}: {str(exc)[:300]!r}")

    def _folder_entries(self, key: bytes) -> Iterator[bytes]:
        assert isinstance(self.inner, DirectoryBasedExampleDatabase)
        folder = self.inner._key_path(key)  # the layout Hypothesis's own fetch reads
        try:
            st = os.lstat(folder)
        except FileNotFoundError:  # nothing stored under this key
            return
        if not stat.S_ISDIR(st.st_mode):
            raise _NotAnEntryError(f"{folder} is not a folder (mode {stat.filemode(st.st_mode)})")
        for name in os.listdir(folder):
            try:
                yield _read_entry(folder / name)
            except FileNotFoundError:  # deleted (or moved) by another run since the listing
                continue
            except (_NotAnEntryError, OSError) as exc:
                self._skip(str(exc) if isinstance(exc, _NotAnEntryError) else f"{name}: {exc}")

    def fetch(self, key: bytes) -> Iterable[bytes]:
        try:
            for value in self._folder_entries(key) if _reads_folder(self.inner) else self.inner.fetch(key):
                if not isinstance(value, bytes):
                    self._skip(f"an entry is {type(value).__name__}, not bytes")
                elif len(value) > MAX_ENTRY_BYTES:
                    self._skip(f"an entry is larger than {MAX_ENTRY_BYTES} bytes ({len(value)})")
                else:
                    yield value
        except _NotAnEntryError as exc:
            self._skip(str(exc))
        except Exception as exc:  # the backend's own error, whatever its kind: the cache is unusable
            self._failed("reading an entry", exc)

    def save(self, key: bytes, value: bytes) -> None:
        try:
            self.inner.save(key, value)
        except Exception as exc:  # as in fetch
            self._failed("saving an entry", exc)

    def delete(self, key: bytes, value: bytes) -> None:
        try:
            self.inner.delete(key, value)
        except Exception as exc:  # as in fetch
            self._failed("deleting an entry", exc)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        try:
            self.inner.move(src, dest, value)
        except Exception as exc:  # as in fetch
            self._failed("moving an entry", exc)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GuardedDatabase) and self.inner == other.inner

    def __hash__(self) -> int:
        return hash((GuardedDatabase, self.name))

    def __repr__(self) -> str:
        return f"GuardedDatabase({self.inner!r})"
