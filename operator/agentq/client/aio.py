"""The client itself, on asyncio: ``AsyncClient`` (submit, get, list, cancel, wait) and
``AsyncTask``, one task's handle. Every request goes through ``agentq.kube.Client``.

Waiting is a LIST (or the create's answer) and then a WATCH from its
resourceVersion: per task name (a ``metadata.name`` field selector), per label
selector, or per namespace when many names are waited on there. A watch the server
ends is resumed from the last resourceVersion seen (bookmarks keep it current), a
``410 Gone`` lists again; failures after the first answer are retried after
``agentq.kube.Backoff``, a refusal (403, ...) is raised.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentq import GROUP, VERSION, kube, views
from agentq.client.manifest import check_manifest, task_manifest
from agentq.client.outcome import (
    FINAL,
    ApiError,
    End,
    ListTimeout,
    NoCluster,
    Outcome,
    TaskNotFound,
    Tracker,
    Unreachable,
    key_of,
)
from agentq.models import TASK_PLURAL

Body = dict[str, Any]

# The API server ends a watch after this; resuming costs one request.
WATCH_SECONDS = 290
PAGE = 500
RETRY_AFTER_MAX = 5.0  # the longest we wait on a 429/503's Retry-After before asking again
# Waiting on more names than this in one namespace takes one WATCH of the namespace
# (filtered here) instead of one WATCH per name.
WATCHES_PER_NAMESPACE = 8
# A timeout that ends before the first LIST answered waits for it, up to this long more,
# checking every FIRST_LOOK_POLL seconds.
FIRST_LOOK_GRACE = 30.0
FIRST_LOOK_POLL = 0.05
# A WATCH that ends with nothing said sooner than this is asked again after a backoff.
WATCH_HEALTHY = 10.0


def find_config(kubeconfig: str | None = None, context: str | None = None) -> kube.KubeConfig:
    """The API server as kubectl finds it: ``kubeconfig``, else ``$KUBECONFIG``, else
    ``~/.kube/config``, else the pod's service account. ``NoCluster`` says what was tried."""
    files = kube.config.kubeconfig_files(kubeconfig)
    if not any(f.exists() for f in files):
        in_pod = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
        if in_pod and kubeconfig is None and context is None:
            found = kube.in_cluster()
            if found is None:
                raise NoCluster("cannot use the pod's service account: no token mounted")
            return found
        shown = os.pathsep.join(str(f) for f in files)
        raise NoCluster(f"no kubeconfig found (looked for {shown})")
    try:
        return kube.from_kubeconfig(kubeconfig, context=context)
    except (kube.ConfigError, OSError, ValueError, TypeError) as err:
        shown = os.pathsep.join(str(f) for f in files if f.exists())
        raise NoCluster(f"cannot use kubeconfig {shown}: {err}") from err


class _Gone(Exception):
    """The resourceVersion a watch resumes from was compacted: list again."""


class _Retry(Exception):
    """A failure worth retrying after a backoff (no answer, a 5xx, a 429)."""


def _path(namespace: str | None, name: str = "") -> str:
    return kube.object_path(GROUP, VERSION, namespace, TASK_PLURAL, name)


class AsyncClient:
    """Submit, follow and cancel AgentTasks (asyncio).

    ``config``: where the API server is (default: found as kubectl finds it, from
    ``kubeconfig`` / ``context``); ``namespace``: for names without one (default: the
    context's, else ``default``); ``api``: an ``agentq.kube.Client`` to use instead of
    making one (it is closed with this one all the same).
    """

    def __init__(
        self,
        config: kube.KubeConfig | None = None,
        *,
        kubeconfig: str | None = None,
        context: str | None = None,
        namespace: str | None = None,
        api: kube.Client | None = None,
        timeout: float = 30.0,
    ) -> None:
        if api is not None:
            config = api.config
        elif config is None:
            config = find_config(kubeconfig, context)
        self.config = config
        self.namespace = namespace or config.namespace or "default"
        self.api = api or kube.Client(config, timeout=timeout, connect=min(5.0, timeout))
        self.relists = 0  # watches resumed with a LIST after 410 Gone

    async def close(self) -> None:
        await self.api.close()
        await asyncio.sleep(0)  # the aborted connections' sockets close on the next turn

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- requests ---------------------------------------------------------------------------

    async def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        tolerate: tuple[int, ...] = (),
        idempotent: bool = True,
    ) -> Body | None:
        """One request; ``ApiError`` for a refusal, ``NoCluster`` without an answer. A 429
        or 503 with a Retry-After is asked again once; so is a request without an answer
        when ``idempotent`` (a create is not: it may have been done)."""
        for attempt in (1, 2):
            try:
                rsp = await self.api.request(
                    method, path, body=body, params=params, content_type=content_type
                )
            except kube.TransportError as err:
                if attempt == 1 and idempotent:
                    continue
                raise Unreachable(
                    f"cannot reach the API server at {self.api.server}: {err}"
                ) from err
            except kube.CredentialError as err:
                raise NoCluster(f"no credentials for {self.api.server}: {err}") from err
            if rsp.status in (429, 503) and rsp.retry_after is not None and attempt == 1:
                await asyncio.sleep(min(rsp.retry_after, RETRY_AFTER_MAX))
                continue
            break
        if rsp.ok:
            decoded = views.decode(rsp.raw) if rsp.raw else {}
            return decoded if isinstance(decoded, dict) else {}
        if rsp.status in tolerate:
            return None
        raise _api_error(rsp.status, rsp.raw)

    # -- submit, read, cancel ---------------------------------------------------------------

    async def submit(
        self,
        manifest: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
        generate_name: str | None = None,
        namespace: str | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        spec: Mapping[str, Any] | None = None,
        dry_run: bool = False,
        **fields: Any,
    ) -> AsyncTask:
        """Create an AgentTask: from ``manifest`` (a whole AgentTask), or from the keyword
        arguments (``SPEC_FIELDS``: ``required_capabilities``, ``cost``, ``payload``,
        ``lease_duration_seconds``, ..., ``active_deadline_seconds``,
        ``ttl_seconds_after_finished``; ``spec`` for others). Returns its handle.

        Raises ``ApiError`` with the API server's message when it refuses the task (an
        invalid value, an unknown field, a name taken), ``ManifestError`` when
        ``manifest`` is no AgentTask. ``dry_run``: validated by the API server, not stored.
        """
        if manifest is not None:
            extra = [
                k
                for k, v in {
                    "name": name,
                    "generate_name": generate_name,
                    "labels": labels,
                    "annotations": annotations,
                    "spec": spec,
                    **fields,
                }.items()
                if v is not None
            ]
            if extra:
                raise TypeError(f"give a manifest or fields, not both (got {', '.join(extra)})")
            body = check_manifest(manifest, namespace=namespace or None)
        else:
            body = task_manifest(
                name=name,
                generate_name=generate_name,
                labels=labels,
                annotations=annotations,
                spec=spec,
                **fields,
            )
        meta = body["metadata"]
        ns = str(meta.get("namespace") or namespace or self.namespace)
        meta["namespace"] = ns
        params = {"fieldValidation": "Strict"}
        if dry_run:
            params["dryRun"] = "All"
        # Not asked again without an answer: it may have been created.
        created = await self._call("POST", _path(ns), body, params=params, idempotent=False)
        assert created is not None
        return AsyncTask(self, ns, str(created["metadata"]["name"]), created, fresh=not dry_run)

    def task(self, name: str, namespace: str | None = None) -> AsyncTask:
        """The handle of an existing task (no request made)."""
        return AsyncTask(self, namespace or self.namespace, name)

    async def get(self, name: str, namespace: str | None = None) -> Body:
        """The task as the API server has it; ``TaskNotFound`` when there is none."""
        ns = namespace or self.namespace
        body = await self._call("GET", _path(ns, name), tolerate=(404,))
        if body is None:
            raise _not_found(ns, name)
        return body

    async def tasks(
        self,
        selector: str | None = None,
        *,
        namespace: str | None = None,
        all_namespaces: bool = False,
    ) -> list[AsyncTask]:
        """The tasks matching the label ``selector`` (every task without one)."""
        return [
            AsyncTask(self, *key_of(body), body)
            for body in await self._list(
                None if all_namespaces else (namespace or self.namespace), selector=selector
            )
        ]

    async def cancel(self, name: str, namespace: str | None = None) -> Body:
        """Set ``spec.cancel`` (a merge patch; idempotent) and return the task as patched.
        A finished task is left as it was (the operator notes the cancel came late)."""
        ns = namespace or self.namespace
        patched = await self._call(
            "PATCH",
            _path(ns, name),
            {"spec": {"cancel": True}},
            content_type=kube.MERGE_PATCH,
            tolerate=(404,),
        )
        if patched is None:
            raise _not_found(ns, name)
        return patched

    async def _list(self, namespace: str | None, *, selector: str | None = None) -> list[Body]:
        items, _ = await self._list_versioned(namespace, selector=selector)
        return items

    async def _list_versioned(
        self,
        namespace: str | None,
        *,
        selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[Body], str]:
        """A paginated LIST and its resourceVersion (to watch from)."""
        items: list[Body] = []
        version, cont = "", ""
        while True:
            params = _selectors(selector, field_selector)
            params["limit"] = str(PAGE)
            if cont:
                params["continue"] = cont
            listed = await self._call("GET", _path(namespace), params=params, tolerate=(410,))
            if listed is None:  # the continue token expired: start over
                items, version, cont = [], "", ""
                continue
            meta = listed.get("metadata") or {}
            version = version or str(meta.get("resourceVersion") or "")
            items.extend(i for i in listed.get("items") or [] if isinstance(i, dict))
            cont = str(meta.get("continue") or "")
            if not cont:
                return items, version

    # -- waiting ------------------------------------------------------------------------------

    async def as_completed(
        self,
        tasks: Iterable[AsyncTask | str] | None = None,
        *,
        selector: str | None = None,
        namespace: str | None = None,
        all_namespaces: bool = False,
        timeout: float | None = None,
    ) -> AsyncGenerator[Outcome, None]:
        """Each task's ``Outcome`` as it ends: the ``tasks`` (handles or names), or those
        matching the label ``selector`` when the wait begins. After ``timeout`` seconds
        (None: no limit; 0: look once) a ``Timeout`` for each task still going."""
        groups = self._groups(tasks, selector, namespace, all_namespaces)
        queue: asyncio.Queue[Outcome] = asyncio.Queue()
        for group in groups:
            group.tracker.on_end = queue.put_nowait
        loop = asyncio.get_running_loop()
        watch = timeout is None or timeout > 0  # 0: one look, no WATCH
        deadline = loop.time() + timeout if timeout and watch else None
        runners = [asyncio.ensure_future(self._follow(g, watch=watch)) for g in groups]
        getter: asyncio.Future[Outcome] | None = None
        try:
            while True:
                while not queue.empty():
                    yield queue.get_nowait()
                running = [r for r in runners if not r.done()]
                for runner in runners:
                    failure = runner.exception() if runner.done() else None
                    if failure is not None:
                        raise failure
                if not running:
                    break
                left = None if deadline is None else deadline - loop.time()
                if left is not None and left <= 0:
                    # Each task is looked at once before the timeout counts (for up to
                    # FIRST_LOOK_GRACE more): a LIST slower than the timeout must not
                    # report a Failed task, or one that does not exist, as "not
                    # finished: it is Pending".
                    looked = all(g.tracker.listings for g in groups)
                    if looked or -left > FIRST_LOOK_GRACE:
                        break
                    left = FIRST_LOOK_POLL
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait(
                    {getter, *running}, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
                if getter in done:
                    yield getter.result()
                else:
                    getter.cancel()
                getter = None
        finally:
            if getter is not None:
                getter.cancel()
            for runner in runners:
                runner.cancel()
            await asyncio.gather(*runners, return_exceptions=True)
        while not queue.empty():
            yield queue.get_nowait()
        for group in groups:
            if group.tracker.keys is None:
                # A selector's first LIST never answered: which tasks it matches is not
                # known, so "none matched" would be a guess.
                raise ListTimeout(
                    f"no answer to the LIST of agenttasks matching {group.label_selector!r}"
                    f" within {timeout or 0:g}s (and {FIRST_LOOK_GRACE:g}s more)",
                    selector=str(group.label_selector),
                    namespace=group.namespace,
                )
            for outcome in group.tracker.unfinished(timeout):
                yield outcome

    async def wait_all(
        self,
        tasks: Iterable[AsyncTask | str] | None = None,
        *,
        selector: str | None = None,
        namespace: str | None = None,
        all_namespaces: bool = False,
        timeout: float | None = None,
    ) -> list[Outcome]:
        """Every outcome of ``as_completed``, in the order of ``tasks`` (by namespace and
        name for a selector). Never raises for a task's outcome; see ``Outcome.value()``."""
        order: dict[tuple[str, str], int] = {}
        if tasks is not None:
            tasks = list(tasks)
            for i, t in enumerate(tasks):
                order.setdefault(self._key(t, namespace), i)
        outcomes = [
            o
            async for o in self.as_completed(
                tasks,
                selector=selector,
                namespace=namespace,
                all_namespaces=all_namespaces,
                timeout=timeout,
            )
        ]
        return sorted(
            outcomes, key=lambda o: (order.get((o.namespace, o.name), 0), o.namespace, o.name)
        )

    def _key(self, task: AsyncTask | str, namespace: str | None) -> tuple[str, str]:
        if isinstance(task, AsyncTask):
            return task.namespace, task.name
        return namespace or self.namespace, task

    def _groups(
        self,
        tasks: Iterable[AsyncTask | str] | None,
        selector: str | None,
        namespace: str | None,
        all_namespaces: bool,
    ) -> list[_Group]:
        """What to LIST and WATCH: one group per label selector, per name (a field
        selector), or per namespace when many names are waited on there."""
        if (tasks is None) == (selector is None):
            raise TypeError("wait for tasks (handles or names) or a label selector, not both")
        if selector is not None:
            ns = None if all_namespaces else (namespace or self.namespace)
            return [_Group(Tracker(), ns, label_selector=selector)]
        handles = list(tasks or [])
        seeds: dict[tuple[str, str], Body] = {}
        by_namespace: dict[str, list[str]] = {}
        for task in handles:
            ns, name = self._key(task, namespace)
            if name in by_namespace.setdefault(ns, []):
                continue
            by_namespace[ns].append(name)
            if isinstance(task, AsyncTask) and task._fresh and task.body:
                seeds[(ns, name)] = task.body
        groups = []
        for ns, names in by_namespace.items():
            if len(names) <= WATCHES_PER_NAMESPACE:
                for name in names:
                    seed = seeds.get((ns, name))
                    groups.append(
                        _Group(
                            Tracker([(ns, name)]),
                            ns,
                            field_selector=f"metadata.name={name}",
                            seeds=[seed] if seed else [],
                        )
                    )
                continue
            # Many names: one WATCH of the namespace for those known from their create,
            # from the oldest create on (a task finished and deleted before a LIST, as
            # with ttlSecondsAfterFinished 0, is still seen ending); one LIST and WATCH
            # for the others.
            known = [seeds[(ns, n)] for n in names if (ns, n) in seeds]
            since = _oldest(known)
            if since is None:  # resourceVersions that are not numbers: one watch each
                groups.extend(
                    _Group(
                        Tracker([key_of(s)]),
                        ns,
                        field_selector=f"metadata.name={key_of(s)[1]}",
                        seeds=[s],
                    )
                    for s in known
                )
            elif known:
                groups.append(_Group(Tracker(map(key_of, known)), ns, seeds=known, since=since))
            others = [n for n in names if (ns, n) not in seeds]
            if others:
                groups.append(_Group(Tracker((ns, n) for n in others), ns))
        return groups

    async def _follow(self, group: _Group, *, watch: bool) -> None:
        """LIST then WATCH until the group's tasks have ended: resumed from the last
        resourceVersion, listed again after a 410. Failures after the first answer are
        retried after a backoff; a refusal (403, ...) is raised."""
        tracker = group.tracker
        backoff = kube.Backoff(initial=0.2, maximum=5.0)
        version = ""
        for seed in group.seeds:
            tracker.seed(seed)
        if group.seeds:
            version = group.since or str(group.seeds[0]["metadata"].get("resourceVersion") or "")
        clock = asyncio.get_running_loop().time
        while not tracker.done:
            try:
                if not version:
                    items, version = await self._list_versioned(
                        group.namespace,
                        selector=group.label_selector,
                        field_selector=group.field_selector,
                    )
                    tracker.listed(items)
                    continue
                if not watch:
                    return
                opened = clock()
                resumed = await self._watch(group, version)
                if resumed != version or clock() - opened >= WATCH_HEALTHY:
                    backoff.reset()
                elif not tracker.done:
                    # Ended at once with nothing said (a proxy answering 200 and closing):
                    # asked again after a backoff, not in a storm of WATCHes.
                    await asyncio.sleep(backoff.next())
                version = resumed
            except _Gone:
                version = ""
                self.relists += 1
            except (_Retry, NoCluster, ApiError) as err:
                if tracker.listings == 0 and not isinstance(err, _Retry):
                    raise  # the first LIST failed: say so now, not after retrying forever
                if isinstance(err, ApiError) and err.status != 429 and err.status < 500:
                    raise  # a refusal (403, ...) does not go away by asking again
                await asyncio.sleep(backoff.next())

    async def _watch(self, group: _Group, version: str) -> str:
        """One WATCH from ``version``, until the group is done or the server ends it;
        returns the last resourceVersion seen."""
        params = _selectors(group.label_selector, group.field_selector)
        params.update(
            watch="1",
            resourceVersion=version,
            allowWatchBookmarks="true",
            timeoutSeconds=str(WATCH_SECONDS),
        )
        try:
            async with self.api.stream(
                _path(group.namespace), params=params, read_timeout=WATCH_SECONDS + 30
            ) as rsp:
                if rsp.status == 410:
                    raise _Gone()
                if rsp.status != 200:
                    raw = await rsp.read()
                    if rsp.status == 429 or rsp.status >= 500:
                        raise _Retry(f"WATCH: HTTP {rsp.status}")
                    raise _api_error(rsp.status, raw)
                ended = False
                try:
                    async for line in rsp.lines():
                        version = self._line(group, line, version)
                        if group.tracker.done:
                            break
                    else:
                        ended = True  # the server ended it: resume
                finally:
                    if not ended:
                        # Left early (done, timed out, cancelled): drop the connection
                        # now. Closing it would wait for a TLS goodbye that a loop about
                        # to stop may never finish, leaving its socket open.
                        _abort(rsp)
        except (kube.TransportError, kube.CredentialError) as err:
            raise _Retry(str(err)) from err
        return version

    @staticmethod
    def _line(group: _Group, line: bytes, version: str) -> str:
        """One watch line into the tracker; the resourceVersion to resume from."""
        if not line.strip():
            return version
        try:
            event = views.decode(line)
        except ValueError as err:
            raise _Retry(f"an undecodable watch line: {err}") from err
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Gone()
            raise _Retry(f"watch error: {obj.get('message')}")
        version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
        if kind != "BOOKMARK":
            group.tracker.event(str(kind), obj)
        return version


def _abort(stream: kube.Stream) -> None:
    connection = stream.response.connection
    transport = connection.transport if connection is not None else None
    if transport is not None:
        transport.abort()


@dataclass
class _Group:
    tracker: Tracker
    namespace: str | None
    label_selector: str | None = None
    field_selector: str | None = None
    seeds: list[Body] = field(default_factory=list)  # the creates' answers: no first LIST
    since: str = ""  # with several seeds: the oldest one's resourceVersion, to watch from


def _oldest(bodies: list[Body]) -> str | None:
    """The smallest resourceVersion of ``bodies`` ("" for none); None when one is not a
    number (etcd's are; a watch from the oldest create sees every later one's events)."""
    versions = [str(b["metadata"].get("resourceVersion") or "") for b in bodies]
    if not all(v.isdigit() for v in versions):
        return None
    return min(versions, key=int, default="")


def _not_found(namespace: str, name: str) -> TaskNotFound:
    error = Outcome(namespace, name, End.NOT_FOUND).exception()
    assert isinstance(error, TaskNotFound)
    return error


def _selectors(label: str | None, fields: str | None) -> dict[str, str]:
    params = {}
    if label:
        params["labelSelector"] = label
    if fields:
        params["fieldSelector"] = fields
    return params


def _api_error(status: int, raw: bytes) -> ApiError:
    text = raw.decode(errors="replace")
    try:
        body = views.decode(raw) if raw else {}
    except ValueError:
        body = {}
    return ApiError(status, body if isinstance(body, dict) else {}, text)


class AsyncTask:
    """The handle of one AgentTask (asyncio)."""

    def __init__(
        self,
        client: AsyncClient,
        namespace: str,
        name: str,
        body: Body | None = None,
        *,
        fresh: bool = False,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.name = name
        self.body: Body = body or {}  # as last read (the create's answer, a listing)
        self._fresh = fresh  # body is the create's answer: a wait starts watching from it

    def __repr__(self) -> str:
        return f"<AgentTask {self.namespace}/{self.name}>"

    async def get(self) -> Body:
        """The task now (one GET); ``TaskNotFound`` when it is gone."""
        self.body = await self.client.get(self.name, self.namespace)
        self._fresh = False
        return self.body

    async def status(self) -> Body:
        """``status`` now (one GET): ``phase``, ``worker``, ``attempt``, ``result``, ..."""
        return dict((await self.get()).get("status") or {})

    async def cancel(self) -> bool:
        """Ask for the task to be cancelled (``spec.cancel: true``); idempotent. True if
        it had not finished (it ends ``Cancelled``; a running attempt's agent is told at
        its next heartbeat) or was already Cancelled; False if it had finished otherwise
        (nothing changes)."""
        self.body = await self.client.cancel(self.name, self.namespace)
        self._fresh = False
        phase = (self.body.get("status") or {}).get("phase")
        return phase not in FINAL or phase == "Cancelled"

    async def outcome(self, timeout: float | None = None) -> Outcome:
        """Wait until the task ends (or ``timeout`` seconds pass) and say how."""
        outcomes = await self.client.wait_all([self], timeout=timeout)
        return outcomes[0]

    async def wait(self, timeout: float | None = None) -> Any:
        """Wait until the task ends; its ``status.result`` (see ``outcome()`` for
        ``resultRef``), or raise ``TaskFailed``, ``TaskDeadLettered``, ``TaskCancelled``,
        ``TaskNotFound``, ``TaskDeleted`` or ``WaitTimeout``."""
        return (await self.outcome(timeout)).value()
