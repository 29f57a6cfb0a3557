"""What every fenced store promises, and the error it raises.

A store holds records by key. Each record carries the highest fencing token
seen for its key, a value (any JSON) and a revision (incremented by every
accepted change). ``write(key, token, value)`` and ``fence(key, token)`` are
refused with ``StaleTokenError`` when ``token`` is lower than the record's
token; an equal token is accepted (the same attempt may write again, or retry).
The check and the raise of the token happen in one transaction with the data,
so no interleaving of writers, in any number of processes, lets a lower token
overwrite what a higher one wrote.
"""

from __future__ import annotations

import abc
import contextlib
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

MAX_TOKEN = 2**63 - 1  # tokens are stored as signed 64-bit integers
MAX_OWED_FENCES = 4096  # fences a store object remembers it could not make


@contextlib.contextmanager
def needs_extra(extra: str, what: str) -> Iterator[None]:
    """Import a store's driver, which agentq-agent installs only as an extra: when it is
    missing, say which extra brings it (the SDK itself needs nothing but the standard
    library)."""
    try:
        yield
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(
            f"{what} needs the {err.name!r} package, which is not installed: "
            f"pip install 'agentq-agent[{extra}]'",
            name=err.name,
        ) from err


class StaleTokenError(Exception):
    """A write carried a fencing token lower than one the store has already seen."""

    def __init__(self, key: str, token: int, highest: int) -> None:
        super().__init__(
            f"write to {key!r} with fencing token {token} refused: the store has already seen "
            f"token {highest} for it (a newer attempt owns it; stop and discard this work)"
        )
        self.key = key
        self.token = token
        self.highest = highest


@dataclass(frozen=True)
class Record:
    key: str
    token: int
    value: Any
    revision: int


def check_token(token: object) -> int:
    """A fencing token must be an integer in [1, 2**63-1] (not a bool, not a string)."""
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"a fencing token is an integer, not {type(token).__name__}")
    if not 1 <= token <= MAX_TOKEN:
        raise ValueError(f"fencing token {token} is out of range [1, {MAX_TOKEN}]")
    return token


def check_key(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise ValueError(f"a key is a non-empty string, not {key!r}")
    if len(key) > 1024:
        raise ValueError("a key is at most 1024 characters")
    return key


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
UNSET: Any = object()


def check_identifier(name: str) -> str:
    if not _IDENTIFIER.fullmatch(name):
        raise ValueError(f"{name!r} is not a plain SQL identifier (letters, digits, '_')")
    return name


@dataclass
class Transaction:
    """An open fenced transaction: ``connection`` for your own statements,
    ``previous`` the record before it; set ``value`` to store one with the token."""

    connection: Any
    previous: Record | None
    value: Any = UNSET


class FencedStore(abc.ABC):
    """A key-value store whose writes are fenced by token, per key."""

    @abc.abstractmethod
    def write(self, key: str, token: int, value: Any) -> Record:
        """Store ``value`` under ``key`` unless a higher token was seen; the new record."""

    @abc.abstractmethod
    def fence(self, key: str, token: int) -> Record:
        """Raise the key's token to ``token`` without writing a value (claim the key at
        the start of an attempt, so an older attempt's later write is refused)."""

    @abc.abstractmethod
    def read(self, key: str) -> Record | None:
        """The record under ``key``, or None."""

    @abc.abstractmethod
    def records(self) -> list[Record]:
        """Every record, by key (for inspection and tests; not for large stores)."""

    def ref(self, key: str) -> str:
        """A reference to ``key`` in this store, for a report's ``resultRef``."""
        return key

    def owe_fence(self, key: str, token: int) -> None:
        """``fence(key, token)`` could not be made (the store was away): this object
        refuses every later write or fence of ``key`` with a lower token itself
        (``StaleTokenError``), trying the fence again first -- a revoked attempt's late
        write is refused even when the revocation's fence did not reach the store."""
        owed: dict[str, int] = self.__dict__.setdefault("_owed_fences", {})
        with self.__dict__.setdefault("_owed_lock", threading.Lock()):
            if key not in owed and len(owed) >= MAX_OWED_FENCES:
                owed.pop(next(iter(owed)))  # the oldest: bounded whatever the agent runs
            owed[key] = max(owed.get(key, 0), token)

    def _refuse_owed(self, key: str, token: int) -> None:
        """Called before every change of ``key``: refused if a fence owed on it is above
        ``token`` (see ``owe_fence``)."""
        owed: dict[str, int] | None = self.__dict__.get("_owed_fences")
        if not owed:
            return
        highest = owed.get(key)
        if highest is None or token >= highest:
            return
        with contextlib.suppress(Exception):  # the store may still be away: refused anyway
            self.fence(key, highest)
            with self.__dict__.setdefault("_owed_lock", threading.Lock()):
                if owed.get(key) == highest:  # not raised meanwhile by another thread
                    del owed[key]
        raise StaleTokenError(key, token, highest)

    def close(self) -> None:  # noqa: B027 - backends without resources need not override it
        """Release connections."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class TransactionalStore(FencedStore):
    """A backend whose ``transaction(key, token)`` checks and raises the token with the
    data in one database transaction (SQLite, PostgreSQL): ``write`` and ``fence`` are
    that transaction with and without a value."""

    @abc.abstractmethod
    def transaction(self, key: str, token: int) -> contextlib.AbstractContextManager[Transaction]:
        """Open a fenced transaction on ``key`` (raises ``StaleTokenError`` if ``token`` is
        below the highest seen); committed when the block ends."""

    def write(self, key: str, token: int, value: Any) -> Record:
        self._refuse_owed(key, token)
        with self.transaction(key, token) as tx:
            tx.value = value
            previous = tx.previous
        return Record(key, token, value, (previous.revision if previous else 0) + 1)

    def fence(self, key: str, token: int) -> Record:
        self._refuse_owed(key, token)
        with self.transaction(key, token) as tx:
            previous = tx.previous
        return Record(
            key,
            token,
            previous.value if previous else None,
            (previous.revision if previous else 0) + 1,
        )
