"""Where the example database lives: ``--database`` is a folder (local, or shared storage such as
NFS) or a Redis URL, opened as Hypothesis's own backends.

- a folder: :class:`hypothesis.database.DirectoryBasedExampleDatabase`. Hypothesis writes each
  entry as its own file named by its hash (create, then rename), so processes and machines that
  mount one folder can write to it side by side.
- ``redis://[:password@]host[:port][/db]``, ``rediss://`` (TLS) or ``unix:///path/redis.sock``:
  :class:`hypothesis.extra.redis.RedisExampleDatabase` (needs the ``redis`` package:
  ``pip install 'mha-verify[redis]'``). Entries expire after :data:`REDIS_EXPIRY` without use,
  so that a database shared by a whole CI fleet does not grow forever; a failure a run replays
  is renewed.

Either way the checks key their entries by property and target (:mod:`.keyed_database`): a
counterexample found by one shard, worker or machine is replayed first by every later run of
that check on that target, wherever it runs.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
#: entries unused this long are dropped by Redis (Hypothesis's default is 8 days; a nightly
#: search feeding a weekly release gate needs longer)
REDIS_EXPIRY = timedelta(days=30)
#: our keys in a Redis shared with other tools
REDIS_PREFIX = b"mha-verify-example:"

_PASSWORD = re.compile(r"(?<=://)([^/@]*)@")


def is_redis(spec: str) -> bool:
    return spec.startswith(REDIS_SCHEMES)


def redact(spec: str) -> str:
    """``spec`` with the credentials of a URL hidden: it is printed, and written into reports.

    >>> redact("redis://:s3cret@db.example:6379/0")
    'redis://***@db.example:6379/0'
    >>> redact("/shared/examples")
    '/shared/examples'
    """
    return _PASSWORD.sub("***@", spec) if is_redis(spec) else spec


def _redis_client(spec: str, **options: float) -> Any:  # redis.Redis; the package is optional
    try:
        import redis
    except ImportError:
        raise ValueError(f"--database {redact(spec)!r} is a Redis URL, and the redis package is not installed: "
                         "pip install 'mha-verify[redis]'") from None
    try:
        return redis.Redis.from_url(spec, **options)
    except ValueError as exc:
        raise ValueError(f"--database {redact(spec)!r} is not a Redis URL redis can use: {exc}") from None


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
            raise ValueError(f"--database {spec!r}: cannot create the folder: {exc.strerror or exc}") from None
        return
    import redis

    client = _redis_client(spec, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise ValueError(f"--database {redact(spec)!r}: cannot reach the Redis server: {exc}") from None
    finally:
        client.close()
