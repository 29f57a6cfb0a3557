"""The client as blocking calls: ``Client`` and ``Task`` run ``AsyncClient``'s coroutines
on an event loop of their own, in a daemon thread, so they work from any thread and
beside (not inside) an event loop of the caller's."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import types
from collections.abc import AsyncGenerator, Awaitable, Coroutine, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from agentq import kube
from agentq.client.aio import AsyncClient, AsyncTask
from agentq.client.outcome import Outcome

Body = dict[str, Any]
T = TypeVar("T")
# How long an interrupted call waits for its coroutine to end (it was cancelled).
CANCEL_WAIT = 5.0


class _Loop:
    """An event loop of our own in a daemon thread: the sync API's calls run there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._background: set[asyncio.Task[Any]] = set()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="agentq-client", daemon=True
        )
        self.thread.start()

    @property
    def here(self) -> bool:
        """Whether the caller runs on the loop's own thread (where waiting on it would
        never end)."""
        return threading.current_thread() is self.thread

    def run(self, coroutine: Awaitable[T]) -> T:
        if self.here:
            if asyncio.iscoroutine(coroutine):
                coroutine.close()
            raise RuntimeError("agentq.client.Client called from its own event loop's thread")
        call = _Call(self.loop, coroutine)
        try:
            return call.result()
        except BaseException:
            # Ctrl-C while waiting: stop the request too, and wait (bounded) until the
            # coroutine has really ended, so what it held (an async generator's step,
            # a connection) is free when the KeyboardInterrupt goes on, unchanged.
            call.cancel(timeout=CANCEL_WAIT)
            raise

    def soon(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        """Run ``coroutine`` on the loop without waiting for it (from the loop's thread)."""
        task = self.loop.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


class _Call(Generic[T]):
    """One awaitable run as a task on ``loop``, waited on from another thread.

    Unlike ``run_coroutine_threadsafe``'s future, whose ``cancel()`` reports "cancelled"
    at once while the task still runs, ``cancel`` here waits until the task is done.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, awaitable: Awaitable[T]) -> None:
        self._loop = loop
        self._future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._ended = threading.Event()  # the task is done (result, error or cancelled)
        self._task: asyncio.Task[T] | None = None
        loop.call_soon_threadsafe(self._start, awaitable)

    def _start(self, awaitable: Awaitable[T]) -> None:  # on the loop
        self._task = self._loop.create_task(_awaited(awaitable))
        self._task.add_done_callback(self._settle)

    def _settle(self, task: asyncio.Task[T]) -> None:  # on the loop
        try:
            if task.cancelled():
                self._future.cancel()
            elif (error := task.exception()) is not None:
                self._future.set_exception(error)
            else:
                self._future.set_result(task.result())
        finally:
            self._ended.set()

    def result(self) -> T:
        return self._future.result()

    def cancel(self, timeout: float) -> bool:
        """Cancel the task and wait up to ``timeout`` seconds for it to end; whether it did."""
        if not self._ended.is_set() and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self._cancel)
        return self._ended.wait(timeout)

    def _cancel(self) -> None:  # on the loop; after _start (callbacks run in order)
        if self._task is not None:
            self._task.cancel()


class Client:
    """Submit, follow and cancel AgentTasks (blocking calls; any thread).

    The same arguments as ``AsyncClient``; use it as a context manager or ``close()`` it.
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
        self.aio = AsyncClient(
            config,
            kubeconfig=kubeconfig,
            context=context,
            namespace=namespace,
            api=api,
            timeout=timeout,
        )
        self.namespace = self.aio.namespace
        self._loop = _Loop()

    def close(self) -> None:
        if not self._loop.loop.is_closed():
            self._loop.run(self.aio.close())
            self._loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, coroutine: Awaitable[T]) -> T:
        return self._loop.run(coroutine)

    def submit(self, manifest: Mapping[str, Any] | None = None, **kwargs: Any) -> Task:
        """See ``AsyncClient.submit``."""
        return Task(self, self._run(self.aio.submit(manifest, **kwargs)))

    def task(self, name: str, namespace: str | None = None) -> Task:
        """The handle of an existing task (no request made)."""
        return Task(self, self.aio.task(name, namespace))

    def tasks(
        self,
        selector: str | None = None,
        *,
        namespace: str | None = None,
        all_namespaces: bool = False,
    ) -> list[Task]:
        """The tasks matching the label ``selector`` (every task without one)."""
        found = self._run(
            self.aio.tasks(selector, namespace=namespace, all_namespaces=all_namespaces)
        )
        return [Task(self, t) for t in found]

    def get(self, name: str, namespace: str | None = None) -> Body:
        return self._run(self.aio.get(name, namespace))

    def cancel(self, name: str, namespace: str | None = None) -> Body:
        return self._run(self.aio.cancel(name, namespace))

    def as_completed(
        self,
        tasks: Iterable[Task | str] | None = None,
        *,
        selector: str | None = None,
        namespace: str | None = None,
        all_namespaces: bool = False,
        timeout: float | None = None,
    ) -> Iterator[Outcome]:
        """See ``AsyncClient.as_completed``."""
        outcomes = self.aio.as_completed(
            _unwrap(tasks),
            selector=selector,
            namespace=namespace,
            all_namespaces=all_namespaces,
            timeout=timeout,
        )
        try:
            while True:
                try:
                    yield self._run(outcomes.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            # Left early, or collected as garbage: stop the watches. Garbage may be
            # collected on the loop's own thread, which must not wait on itself.
            if self._loop.loop.is_closed():
                pass
            elif self._loop.here:
                self._loop.soon(outcomes.aclose())
            elif not _stepping(outcomes):
                self._run(outcomes.aclose())
            # else: a step interrupted (Ctrl-C) is still being cancelled after
            # CANCEL_WAIT; closing it now would raise RuntimeError over the
            # KeyboardInterrupt. The step's cancel ends it, and its watches with it.

    def wait_all(
        self,
        tasks: Iterable[Task | str] | None = None,
        *,
        selector: str | None = None,
        namespace: str | None = None,
        all_namespaces: bool = False,
        timeout: float | None = None,
    ) -> list[Outcome]:
        """See ``AsyncClient.wait_all``."""
        return self._run(
            self.aio.wait_all(
                _unwrap(tasks),
                selector=selector,
                namespace=namespace,
                all_namespaces=all_namespaces,
                timeout=timeout,
            )
        )


def _stepping(generator: AsyncGenerator[Any, Any]) -> bool:
    """Whether a step of ``generator`` is under way on the loop (``aclose`` would raise)."""
    return isinstance(generator, types.AsyncGeneratorType) and generator.ag_running


def _unwrap(tasks: Iterable[Task | str] | None) -> list[AsyncTask | str] | None:
    if tasks is None:
        return None
    return [t.aio if isinstance(t, Task) else t for t in tasks]


class Task:
    """The handle of one AgentTask (blocking calls)."""

    def __init__(self, client: Client, aio: AsyncTask) -> None:
        self.client = client
        self.aio = aio

    def __repr__(self) -> str:
        return repr(self.aio)

    @property
    def name(self) -> str:
        return self.aio.name

    @property
    def namespace(self) -> str:
        return self.aio.namespace

    @property
    def body(self) -> Body:
        """The task as last read (no request)."""
        return self.aio.body

    def get(self) -> Body:
        return self.client._run(self.aio.get())

    def status(self) -> Body:
        """``status`` now (one GET)."""
        return self.client._run(self.aio.status())

    def cancel(self) -> bool:
        """See ``AsyncTask.cancel``."""
        return self.client._run(self.aio.cancel())

    def outcome(self, timeout: float | None = None) -> Outcome:
        return self.client._run(self.aio.outcome(timeout))

    def wait(self, timeout: float | None = None) -> Any:
        """See ``AsyncTask.wait``."""
        return self.client._run(self.aio.wait(timeout))
