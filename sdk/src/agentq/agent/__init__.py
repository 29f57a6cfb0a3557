"""A small Python client of the sidecar's agent API (docs/agent-api.md).

    from agentq.agent import SidecarClient, LeaseLost

    client = SidecarClient()                      # $AGENTQ_SIDECAR_URL or 127.0.0.1:8700
                                                  # secret: $AGENTQ_SIDECAR_TOKEN_FILE
    for assignment in client.assignments():       # blocks, yields each new attempt once
        try:
            with client.hold(assignment) as lease:  # heartbeats from a background thread
                for step in plan(assignment.payload):
                    do(step)
                    lease.progress(f"step {step}")  # raises LeaseLost once fenced
                lease.complete({"answer": 42})
        except LeaseLost as lost:
            log(f"stopped: {lost}")                 # another attempt owns the task now

Only the standard library (``http.client``), so it drops into any agent. Any other
language uses the same API with plain HTTP. The client keeps its connections to the
sidecar open (HTTP keep-alive) and shares them between the threads that use it: a
thread takes an idle one or opens one, and gives it back after the answer. One that
the sidecar closed meanwhile (a restart, its idle timeout) is opened again.

``assignments()`` long-polls for new attempts only (``until=offers``): a report or
a heartbeat does not end its wait.

Every call carries the sidecar's secret (``Authorization: Bearer``), read from its
token file: ``token_file``, else ``$AGENTQ_SIDECAR_TOKEN_FILE``, else
/run/agentq/sidecar-token (the pod's shared volume). It is read again for each
request, so a restarted sidecar's new secret is picked up; a 401 answered to a
secret that has since changed is sent again once with the new one.

The heartbeat thread beats every third of the task's heartbeat interval. When
the sidecar answers 409 (the lease was lost, the token is stale, or the operator
revoked the claim: ``Cancelled``, a ``LeaseLost``) the lease is marked lost: the
next ``progress()``, ``check()``, ``complete()`` or ``fail()`` raises ``LeaseLost``.
With ``hold(..., interrupt=True)`` the exception is also
raised asynchronously in the thread that entered the ``with`` block (it arrives
when that thread next runs Python code; a blocking C call finishes first). When
the sidecar cannot be reached until past the lease deadline, the lease is
presumed lost too (the operator will have reclaimed it). ``complete()`` and
``fail()`` always ask the sidecar, which is the only judge of the claim.

Budgets (docs/budgets.md): ``lease.record_usage("openai", requests=1, tokens=812)``
after each call to a provider adds to the attempt's running total, which the
heartbeats and the report send (cumulative); ``lease.throttled("openai", 20)`` when
the provider answered 429 with ``retry-after: 20`` pauses that budget for every
agent.

``drain()`` is for an agent told to stop (SIGTERM: its pod is scaled down or
evicted): the operator gives this worker no new task while the sidecar keeps
renewing the claims it holds, so the agent finishes them (or fails them,
retryable) and then exits, and no claim is reclaimed for the pod's going away.
"""

from __future__ import annotations

import ctypes
import datetime
import http.client
import json
import os
import select
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from agentq.fencing.base import StaleTokenError

DEFAULT_URL = "http://127.0.0.1:8700"
DEFAULT_TOKEN_FILE = "/run/agentq/sidecar-token"
TOKEN_FILE_ENV = "AGENTQ_SIDECAR_TOKEN_FILE"


class AgentError(Exception):
    """The sidecar refused a request; ``status`` and ``code`` say how."""

    def __init__(self, status: int, code: str, message: str, body: dict[str, Any]) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.body = body


class LeaseLost(AgentError):
    """The attempt's lease is lost or its token is stale: stop working on it now."""


class Cancelled(LeaseLost):
    """The operator revoked the claim: the task was cancelled (``code`` ``Cancelled``) or
    its activeDeadlineSeconds passed (``DeadlineExceeded``). Stop working on it.
    ``fence_token`` is above the attempt's: the stores registered with
    ``HeldLease.fence_on_revoke`` are fenced with it, so this attempt's own later writes
    are refused."""

    @property
    def fence_token(self) -> int | None:
        token = self.body.get("fenceToken")
        return token if isinstance(token, int) and not isinstance(token, bool) else None


# The 409 codes of a revoked claim (the sidecar's Cancelled / DeadlineExceeded).
REVOKED_CODES = frozenset({"Cancelled", "DeadlineExceeded"})


class LeaseLostInterrupt(LeaseLost):
    """LeaseLost raised asynchronously in the agent's thread (``hold(interrupt=True)``)."""

    def __init__(self) -> None:
        super().__init__(
            409,
            "LeaseLost",
            "the lease was lost (raised in this thread by the heartbeat thread)",
            {},
        )


# A report the sidecar could not take (503) is sent again after this, doubling up to the max.
REPORT_RETRY_FIRST = 0.5
REPORT_RETRY_MAX = 5.0
# How many attempts ``assignments()`` remembers having handed out.
SEEN_MEMORY = 4096
# Idle connections kept open to the sidecar, and for how long: well under the
# sidecar's own idle timeout (aiohttp's 75 s), so it does not close one as it is sent.
IDLE_CONNECTIONS = 8
IDLE_SECONDS = 30.0
# What the sidecar takes (docs/budgets.md, "Bad input"): usage per attempt and budget,
# and the longest pause a throttle asks (a longer retry-after is sent as this much).
MAX_USAGE_REQUESTS = 1_000_000_000
MAX_USAGE_TOKENS = 1_000_000_000_000
MAX_RETRY_AFTER_SECONDS = 3600.0


class SidecarUnavailable(Exception):
    """The sidecar could not be reached or is not serving (not ready, shutting down)."""


@dataclass(frozen=True)
class Assignment:
    """One attempt of a task granted to this worker."""

    task: str
    namespace: str
    worker: str
    token: int
    attempt: int
    payload: Any
    uid: str | None
    lease_duration_seconds: float
    heartbeat_interval_seconds: float
    lease_deadline: datetime.datetime | None
    raw: dict[str, Any] = field(repr=False, compare=False)
    # The AgentBudgets the task names (its spec.budgets), whose usage the agent reports;
    # None from a sidecar that does not say.
    budgets: tuple[str, ...] | None = None

    @classmethod
    def of(cls, body: dict[str, Any]) -> Assignment:
        deadline = body.get("leaseDeadline")
        budgets = body.get("budgets")
        return cls(
            task=str(body["task"]),
            namespace=str(body.get("namespace") or ""),
            worker=str(body.get("worker") or ""),
            token=int(body["token"]),
            attempt=int(body.get("attempt") or 0),
            payload=body.get("payload"),
            uid=body.get("uid"),
            lease_duration_seconds=float(body.get("leaseDurationSeconds") or 30),
            heartbeat_interval_seconds=float(body.get("heartbeatIntervalSeconds") or 10),
            lease_deadline=_parse_time(deadline) if isinstance(deadline, str) else None,
            raw=body,
            budgets=(
                tuple(str(b.get("name")) for b in budgets if isinstance(b, dict))
                if isinstance(budgets, list)
                else None
            ),
        )


def _parse_time(text: str) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


class SidecarClient:
    """The agent API at ``url`` (default ``$AGENTQ_SIDECAR_URL``, else 127.0.0.1:8700),
    with the secret in ``token_file`` (default ``$AGENTQ_SIDECAR_TOKEN_FILE``, else
    /run/agentq/sidecar-token) or ``token`` itself."""

    def __init__(
        self,
        url: str | None = None,
        *,
        timeout: float = 10.0,
        token_file: str | os.PathLike[str] | None = None,
        token: str | None = None,
    ) -> None:
        self.url = (url or os.environ.get("AGENTQ_SIDECAR_URL") or DEFAULT_URL).rstrip("/")
        self.timeout = timeout
        self.token_file = os.fspath(
            token_file or os.environ.get(TOKEN_FILE_ENV) or DEFAULT_TOKEN_FILE
        )
        self._token = token
        self._read: str | None = None  # the token file's contents as last read
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http:// URL: {self.url!r}")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        # Idle keep-alive connections (with when each was given back), the newest last;
        # any thread takes one. Forgotten in a forked child: they are the parent's.
        self._idle: list[tuple[http.client.HTTPConnection, float]] = []
        self._idle_lock = threading.Lock()
        # A client dropped without close() closes its idle connections when collected.
        weakref.finalize(self, _close_idle, self._idle)
        self._pid = os.getpid()
        # False once the sidecar refused ``until`` (an older sidecar): plain long polls.
        self._offers_only = True

    def close(self) -> None:
        """Close the idle connections (the client stays usable: it opens new ones)."""
        with self._idle_lock:
            idle = self._idle[:]
            self._idle.clear()
        _close_idle(idle)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def secret(self) -> str | None:
        """The secret to send: ``token`` if given, else the token file's contents, read
        once and again after a 401 (None while the file is missing: the sidecar then
        answers 401 and says why)."""
        if self._token is not None:
            return self._token
        if self._read is None:
            self._reread()
        return self._read

    def _reread(self) -> str | None:
        if self._token is not None:
            return self._token
        try:
            with open(self.token_file, encoding="utf-8") as file:
                self._read = file.read().strip() or None
        except OSError:
            self._read = None
        return self._read

    # -- raw requests ----------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """One request; the JSON answer on 2xx. 409 raises LeaseLost, other 4xx/5xx
        AgentError (503: SidecarUnavailable), a connection failure SidecarUnavailable."""
        secret = self.secret()
        try:
            return self._send(method, path, body, timeout, secret)
        except AgentError as err:
            # A restarted sidecar made a new secret after ours was read: once more with it.
            fresh = self._reread() if err.status == 401 else None
            if fresh not in (secret, None):
                return self._send(method, path, body, timeout, fresh)
            raise

    def _send(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        timeout: float | None,
        secret: str | None,
    ) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if secret is not None:
            headers["Authorization"] = f"Bearer {secret}"
        try:
            status, reason, raw = self._exchange(
                method, self._prefix + path, data, headers, timeout or self.timeout
            )
            if 200 <= status < 300:
                answer: dict[str, Any] = json.loads(raw or b"{}")
                return answer
        # http.client.HTTPException: an answer cut short or garbled (IncompleteRead,
        # BadStatusLine), e.g. the sidecar restarting mid-answer; not an OSError.
        except (http.client.HTTPException, OSError, ValueError) as err:
            raise SidecarUnavailable(f"{method} {self.url}{path}: {err}") from err
        try:
            decoded = json.loads(raw) if raw else {}
            if not isinstance(decoded, dict):
                decoded = {"message": str(decoded)[:500]}
        except ValueError:
            decoded = {"message": raw[:500].decode(errors="replace")}
        code = str(decoded.get("error") or reason)
        message = str(decoded.get("message") or "")
        if status == 409:
            kind = Cancelled if code in REVOKED_CODES else LeaseLost
            raise kind(status, code, message, decoded)
        if status == 503:
            raise SidecarUnavailable(f"503 {code}: {message}")
        raise AgentError(status, code, message, decoded)

    def _exchange(
        self, method: str, target: str, data: bytes | None, headers: dict[str, str], timeout: float
    ) -> tuple[int, str, bytes]:
        """One request on a kept-alive connection: (status, reason, body).

        A connection the sidecar closed while it was idle fails as the request is sent
        or before any answer: the request is sent once more on a new connection. Every
        call of the API may be repeated (a report is idempotent).
        """
        conn, reused = self._checkout(timeout)
        try:
            try:
                conn.request(method, target, body=data, headers=headers)
                response = conn.getresponse()
            except (ConnectionResetError, ConnectionAbortedError, BrokenPipeError):
                # (http.client.RemoteDisconnected is a ConnectionResetError.)
                if not reused:
                    raise
                conn.close()
                self.close()  # the others are as old: the sidecar may have restarted
                conn = self._connect(timeout)
                conn.request(method, target, body=data, headers=headers)
                response = conn.getresponse()
            raw = response.read()
        except BaseException:
            conn.close()
            raise
        if response.will_close:
            conn.close()
        else:
            self._checkin(conn)
        return response.status, response.reason, raw

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        return kind(self._host, self._port, timeout=timeout)

    def _checkout(self, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        """An idle connection (True) or a new one (False), with ``timeout``."""
        now = time.monotonic()
        stale: list[http.client.HTTPConnection] = []
        found = None
        with self._idle_lock:
            if self._pid != os.getpid():
                self._idle.clear()
                self._pid = os.getpid()
            while self._idle and found is None:
                conn, since = self._idle.pop()
                if now - since < IDLE_SECONDS and not _dropped(conn):
                    found = conn
                else:
                    stale.append(conn)
        for conn in stale:
            conn.close()
        if found is None:
            return self._connect(timeout), False
        found.timeout = timeout
        if found.sock is not None:
            found.sock.settimeout(timeout)
        return found, True

    def _checkin(self, conn: http.client.HTTPConnection) -> None:
        surplus = None
        with self._idle_lock:
            if self._pid != os.getpid():
                surplus = conn
            else:
                self._idle.append((conn, time.monotonic()))
                if len(self._idle) > IDLE_CONNECTIONS:
                    surplus = self._idle.pop(0)[0]  # the one idle the longest
        if surplus is not None:
            surplus.close()

    # -- assignments ------------------------------------------------------------------------

    def list(
        self, *, wait: float = 0.0, after: int | None = None, until: str | None = None
    ) -> tuple[int, list[Assignment]]:
        """(version, assignments). ``wait`` long-polls until the list differs from ``after``
        (``until="offers"``: until an attempt is offered, or withdrawn, after it)."""
        query: dict[str, str] = {}
        if wait:
            query["wait"] = f"{wait:g}"
        if after is not None:
            query["after"] = str(after)
        if until is not None:
            query["until"] = until
        path = "/v1/assignments" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        answer = self.request("GET", path, timeout=(wait or 0) + self.timeout)
        items = [Assignment.of(a) for a in answer.get("assignments") or []]
        return int(answer.get("version") or 0), items

    def assignments(
        self, *, poll: float = 20.0, stop: threading.Event | None = None
    ) -> Iterator[Assignment]:
        """Every new attempt granted to this worker, once each, as they come (blocks).

        Waits out a sidecar that is starting, not ready, briefly unreachable or failing
        to answer (5xx). Its long polls end only when something is offered (or withdrawn),
        not at each report or heartbeat (``until=offers``; a sidecar that does not know
        the parameter gets plain long polls).
        """
        # Every attempt handed out, oldest first, bounded. Not only those the last listing
        # showed: a restarted sidecar lists an attempt only once it has read its task
        # again. Tokens are never reused, so remembering is never wrong.
        seen: dict[tuple[str, int], None] = {}
        version: int | None = None
        while stop is None or not stop.is_set():
            until = "offers" if self._offers_only and version is not None else None
            try:
                version, items = self.list(wait=poll, after=version, until=until)
            except (SidecarUnavailable, AgentError) as err:
                if isinstance(err, AgentError) and err.status == 400 and until is not None:
                    self._offers_only = False  # an older sidecar: it refuses ``until``
                    continue
                if isinstance(err, AgentError) and err.status < 500:
                    raise  # a request the sidecar will never take: this client's bug
                # Starting, away, or failed to answer (a 500): a listing changes nothing,
                # so it is asked again.
                version = None
                time.sleep(0.5)
                continue
            for item in items:
                key = (item.task, item.token)
                if key not in seen and item.raw.get("state") == "active":
                    seen[key] = None
                    while len(seen) > SEEN_MEMORY:
                        del seen[next(iter(seen))]
                    yield item

    def drain(self) -> dict[str, Any]:
        """Ask that this worker get no new task (the pod goes away); its claims are kept."""
        return self.request("POST", "/v1/drain", {})

    # -- one attempt ---------------------------------------------------------------------------

    def heartbeat(
        self,
        task: str,
        token: int,
        progress: str | None = None,
        *,
        usage: Usage | None = None,
        throttled: tuple[str, float] | None = None,
    ) -> dict[str, Any]:
        """A heartbeat; ``usage`` is the attempt's usage so far (cumulative:
        ``{"<budget>": {"requests": n, "tokens": n}}``), ``throttled`` a provider's 429
        as ``(budget, retry-after seconds)``."""
        body: dict[str, Any] = {"token": token}
        if progress is not None:
            body["progress"] = progress
        _add_budget_fields(body, usage, throttled)
        return self.request("POST", f"/v1/assignments/{_quote(task)}/heartbeat", body)

    def complete(
        self,
        task: str,
        token: int,
        result: Any = None,
        *,
        result_ref: str | None = None,
        usage: Usage | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"token": token}
        if result is not None:
            body["result"] = result
        if result_ref is not None:
            body["resultRef"] = result_ref
        _add_budget_fields(body, usage, None)
        return self.request("POST", f"/v1/assignments/{_quote(task)}/complete", body)

    def fail(
        self,
        task: str,
        token: int,
        reason: str,
        message: str = "",
        *,
        retryable: bool = True,
        usage: Usage | None = None,
        throttled: tuple[str, float] | None = None,
    ) -> dict[str, Any]:
        body = {"token": token, "reason": reason, "message": message, "retryable": retryable}
        _add_budget_fields(body, usage, throttled)
        return self.request("POST", f"/v1/assignments/{_quote(task)}/fail", body)

    def hold(
        self, assignment: Assignment, *, interrupt: bool = False, beat_seconds: float | None = None
    ) -> HeldLease:
        """A context manager that heartbeats ``assignment`` until it is left."""
        return HeldLease(self, assignment, interrupt=interrupt, beat_seconds=beat_seconds)


# An attempt's usage as the API takes it: {"<budget>": {"requests": n, "tokens": n}}.
Usage = dict[str, dict[str, int]]


def _add_budget_fields(
    body: dict[str, Any], usage: Usage | None, throttled: tuple[str, float] | None
) -> None:
    if usage:
        body["usage"] = usage
    if throttled is not None:
        budget, seconds = throttled
        body["throttled"] = {"budget": budget, "retryAfterSeconds": seconds}


def _amount(value: object, name: str, limit: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        raise ValueError(f"{name} must be an integer from 0 to {limit}, not {value!r}")
    return value


def _quote(task: str) -> str:
    return urllib.parse.quote(task, safe="")


def _close_idle(idle: list[tuple[http.client.HTTPConnection, float]]) -> None:
    for conn, _ in idle:
        conn.close()


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle connection was closed by the sidecar: an idle socket that reads
    (an end of file, or bytes nobody asked for) is of no more use."""
    sock = conn.sock
    if sock is None:
        return True
    try:
        if hasattr(select, "poll"):  # select() takes no descriptor above 1023
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            return bool(poller.poll(0))
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _fence_or_owe(store: Any, key: str, token: int) -> None:
    """A revocation's fence of ``key``: made now, or -- the store away -- owed by the store
    object (``FencedStore.owe_fence``), which then refuses this attempt's later writes
    itself. One a newer attempt made already is as good."""
    try:
        store.fence(key, token)
    except StaleTokenError:
        return  # a newer attempt fenced it higher
    except Exception:  # any store's error: the fence is owed
        owe = getattr(store, "owe_fence", None)
        if callable(owe):
            owe(key, token)


class HeldLease:
    """Heartbeats one attempt from a background thread while the ``with`` block runs."""

    def __init__(
        self,
        client: SidecarClient,
        assignment: Assignment,
        *,
        interrupt: bool = False,
        beat_seconds: float | None = None,
    ) -> None:
        self.client = client
        self.assignment = assignment
        self.interrupt = interrupt
        self.beat_seconds = beat_seconds or max(0.1, assignment.heartbeat_interval_seconds / 3)
        self.lost: LeaseLost | None = None
        self.finished = False
        self._progress: str | None = None
        self._sent_progress: str | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._thread: threading.Thread | None = None
        self._deadline = time.monotonic() + max(
            0.0,
            (assignment.lease_deadline - datetime.datetime.now(datetime.UTC)).total_seconds()
            if assignment.lease_deadline
            else assignment.lease_duration_seconds,
        )
        self._injected = False
        self._fence: list[tuple[Any, tuple[str, ...]]] = []  # (store, keys) to fence
        # The attempt's usage so far, per budget [requests, tokens]; what the last accepted
        # heartbeat sent, and a total the sidecar refused (not sent again unchanged).
        self._usage: dict[str, list[int]] = {}
        self._usage_lock = threading.Lock()
        self._usage_sent: Usage = {}
        self._usage_refused: Usage | None = None
        self.usage_error: AgentError | None = None

    def fence_on_revoke(self, store: Any, *keys: str) -> None:
        """When the claim is revoked (``Cancelled``), fence ``keys`` of ``store`` (an
        ``agentq.fencing`` store) with the revocation's token: this attempt's later writes
        to them are refused with StaleTokenError, even from a thread that did not hear."""
        self._fence.append((store, keys))

    # -- context manager --------------------------------------------------------------------

    def __enter__(self) -> Self:
        self._owner = threading.get_ident()
        self._beat()  # the first beat at once: it is what starts the attempt (Running)
        self._raise_if_lost()
        self._thread = threading.Thread(
            target=self._run, name=f"agentq-heartbeat-{self.assignment.task}", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        with self._lock:
            owner, self._owner = self._owner, None
            if self._injected and owner is not None:
                # Not delivered yet: withdraw it, so it cannot fire after the block.
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(owner), None)
        if self._thread is not None:
            self._thread.join(timeout=self.client.timeout + 1)

    # -- what the agent calls -------------------------------------------------------------

    def check(self) -> None:
        """Raise LeaseLost if the lease is lost (or presumed lost)."""
        self._raise_if_lost()

    def progress(self, marker: str) -> None:
        """Set the progress marker (sent with the next heartbeat); raises LeaseLost if lost."""
        self._raise_if_lost()
        self._progress = marker

    def record_usage(self, budget: str, requests: int = 1, tokens: int = 0) -> Usage:
        """Add what one call to a provider spent to the attempt's usage of ``budget`` (an
        AgentBudget the task names); the heartbeats and the report send the running total
        (cumulative for the attempt). Returns the attempt's usage so far. ValueError for a
        budget the task does not name or a negative, non-integer or absurd amount."""
        _amount(requests, "requests", MAX_USAGE_REQUESTS)
        _amount(tokens, "tokens", MAX_USAGE_TOKENS)
        self._check_budget(budget)
        with self._usage_lock:
            total = self._usage.setdefault(budget, [0, 0])
            new = (total[0] + requests, total[1] + tokens)
            _amount(new[0], f"the attempt's requests of {budget}", MAX_USAGE_REQUESTS)
            _amount(new[1], f"the attempt's tokens of {budget}", MAX_USAGE_TOKENS)
            total[:] = new
        return self.usage()

    def usage(self) -> Usage:
        """The attempt's usage so far, as the API takes it."""
        with self._usage_lock:
            return {b: {"requests": r, "tokens": t} for b, (r, t) in sorted(self._usage.items())}

    def throttled(self, budget: str, retry_after: float) -> dict[str, Any]:
        """The provider of ``budget`` answered 429 with ``retry-after: retry_after``
        seconds: the operator pauses the budget for every agent that long (at most
        an hour a report: a longer one is sent as an hour). Sent at once, with the usage
        so far; raises LeaseLost if the claim is no longer ours, ValueError for a budget
        the task does not name or a retry-after not above 0."""
        self._raise_if_lost()
        self._check_budget(budget)
        if isinstance(retry_after, bool) or not isinstance(retry_after, int | float):
            raise ValueError(f"retry_after must be a number of seconds, not {retry_after!r}")
        if not retry_after > 0:
            raise ValueError(f"retry_after must be above 0 seconds, not {retry_after!r}")
        seconds = min(float(retry_after), MAX_RETRY_AFTER_SECONDS)
        usage = self.usage()
        try:
            answer = self.client.heartbeat(
                self.assignment.task,
                self.assignment.token,
                usage=usage,
                throttled=(budget, int(seconds) if seconds.is_integer() else seconds),
            )
        except LeaseLost as lost:
            self._mark_lost(lost, inject=False)
            raise
        self._usage_sent = usage
        return answer

    def complete(self, result: Any = None, *, result_ref: str | None = None) -> dict[str, Any]:
        """Report success (with the usage recorded). Raises LeaseLost (409) if the claim
        is no longer ours."""
        usage = self.usage()
        return self._report(
            lambda: self.client.complete(
                self.assignment.task,
                self.assignment.token,
                result,
                result_ref=result_ref,
                usage=usage or None,
            )
        )

    def fail(self, reason: str, message: str = "", *, retryable: bool = True) -> dict[str, Any]:
        """Report failure (with the usage recorded). Raises LeaseLost (409) if the claim
        is no longer ours."""
        usage = self.usage()
        return self._report(
            lambda: self.client.fail(
                self.assignment.task,
                self.assignment.token,
                reason,
                message,
                retryable=retryable,
                usage=usage or None,
            )
        )

    def _check_budget(self, budget: str) -> None:
        named = self.assignment.budgets
        if not isinstance(budget, str) or (named is not None and budget not in named):
            raise ValueError(
                f"task {self.assignment.task} does not name budget {budget!r} in its "
                f"spec.budgets ({', '.join(named or ()) or 'none'})"
            )

    def _report(self, send: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Send the report; while the sidecar cannot take it (503: the API server is away,
        or the sidecar restarts) send it again with backoff -- a report is idempotent --
        for as long as the heartbeat thread holds the lease. Giving up at the first 503
        abandoned finished work: the agent stopped beating and the claim expired."""
        delay = REPORT_RETRY_FIRST
        while True:
            try:
                answer = send()
            except LeaseLost as lost:
                self._mark_lost(lost, inject=False)
                raise
            except SidecarUnavailable:
                if self.lost is not None:
                    raise self.lost from None
                if self._stop.wait(delay):  # the block was left meanwhile
                    raise
                delay = min(delay * 2, REPORT_RETRY_MAX)
                continue
            self.finished = True
            self._stop.set()
            return answer

    # -- the heartbeat thread -----------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self.beat_seconds):
            self._beat()
            if self.lost is not None:
                return

    def _beat(self) -> None:
        if self.lost is not None or self.finished:
            return
        progress = self._progress
        usage = self.usage()
        send = usage if usage != self._usage_sent and usage != self._usage_refused else None
        try:
            try:
                answer = self.client.heartbeat(
                    self.assignment.task,
                    self.assignment.token,
                    progress if progress != self._sent_progress else None,
                    usage=send,
                )
            except AgentError as err:
                if send is None or err.code != "InvalidUsage":
                    raise
                # A total the sidecar will not take must not cost the lease: kept for
                # the caller to see, not sent again unchanged, and the beat sent without.
                self.usage_error = err
                self._usage_refused = send
                send = None
                answer = self.client.heartbeat(
                    self.assignment.task,
                    self.assignment.token,
                    progress if progress != self._sent_progress else None,
                )
        except LeaseLost as lost:
            self._mark_lost(lost, inject=True)
            return
        except (SidecarUnavailable, AgentError) as err:
            if time.monotonic() > self._deadline:
                self._mark_lost(
                    LeaseLost(
                        0,
                        "LeaseDeadlinePassed",
                        f"no heartbeat accepted before the lease deadline ({err})",
                        {},
                    ),
                    inject=True,
                )
            return
        self._sent_progress = progress
        if send is not None:
            self._usage_sent = send
        remaining = answer.get("leaseRemainingSeconds")
        if isinstance(remaining, int | float):
            self._deadline = time.monotonic() + float(remaining)

    def _mark_lost(self, lost: LeaseLost, *, inject: bool) -> None:
        if isinstance(lost, Cancelled) and lost.fence_token is not None:
            for store, keys in self._fence:
                for key in keys:
                    _fence_or_owe(store, key, lost.fence_token)
        with self._lock:
            if self.lost is None:
                self.lost = lost
            owner = self._owner
            if (
                inject
                and self.interrupt
                and owner is not None
                and owner != threading.get_ident()
                and not self._injected
            ):
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(owner), ctypes.py_object(LeaseLostInterrupt)
                )
                self._injected = True

    def _raise_if_lost(self) -> None:
        if self.lost is not None:
            raise self.lost
