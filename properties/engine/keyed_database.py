"""An example database per (property, target), through Hypothesis's public database API.

Hypothesis keys its example database by the test function. The runner wraps one inner
function for every property and target, so every check would share one key: a failure of
``fully_masked_rows`` on one target would be replayed first for every other property and
target. ``keyed(settings, key)`` gives the check a database whose keys all start with its
own ``key``, a plain ``ExampleDatabase`` subclass (Hypothesis's documented way to write a
database) over whatever database the settings had, read through
:class:`~mha_verify.properties.engine.databases.GuardedDatabase`: a bad entry of a shared
database is skipped with a warning, never a failure of the check.
"""

from __future__ import annotations

from collections.abc import Iterable

from hypothesis import settings as Settings
from hypothesis.database import ExampleDatabase

from mha_verify.properties.engine.databases import GuardedDatabase


class PrefixedDatabase(ExampleDatabase):
    """``inner`` with every key prefixed by ``prefix`` and a NUL byte: disjoint key spaces per prefix,
    each read and written through a :class:`GuardedDatabase` of ``inner``.

    >>> from hypothesis.database import InMemoryExampleDatabase
    >>> inner = InMemoryExampleDatabase()
    >>> PrefixedDatabase(inner, b"a").save(b"k", b"1")
    >>> list(PrefixedDatabase(inner, b"b").fetch(b"k")), list(PrefixedDatabase(inner, b"a").fetch(b"k"))
    ([], [b'1'])
    """

    def __init__(self, inner: ExampleDatabase, prefix: bytes) -> None:
        super().__init__()
        if not isinstance(inner, ExampleDatabase):
            raise TypeError(f"inner must be a hypothesis ExampleDatabase, got inner={inner!r}")
        if not isinstance(prefix, bytes) or not prefix:
            raise ValueError(f"prefix must be non-empty bytes, got prefix={prefix!r}")
        self.inner, self.prefix = inner, prefix + b"\0"
        self._guarded = inner if isinstance(inner, GuardedDatabase) else GuardedDatabase(inner)

    def save(self, key: bytes, value: bytes) -> None:
        self._guarded.save(self.prefix + key, value)

    def fetch(self, key: bytes) -> Iterable[bytes]:
        return self._guarded.fetch(self.prefix + key)

    def delete(self, key: bytes, value: bytes) -> None:
        self._guarded.delete(self.prefix + key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self._guarded.move(self.prefix + src, self.prefix + dest, value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PrefixedDatabase) and (self.inner, self.prefix) == (other.inner, other.prefix)

    def __hash__(self) -> int:
        return hash((PrefixedDatabase, self.prefix))

    def __repr__(self) -> str:
        return f"PrefixedDatabase({self.inner!r}, {self.prefix[:-1]!r})"


def keyed(settings: Settings, key: str) -> Settings:
    """``settings`` whose example database holds ``key``'s entries apart from every other key's.

    Settings without a database (``database=None``, or derandomized: Hypothesis then stores
    nothing) are returned as they are.
    """
    if not key:
        raise ValueError(f"key must be a non-empty string, got key={key!r}")
    database = settings.database
    if database is None:
        return settings
    return Settings(settings, database=PrefixedDatabase(database, key.encode()))
