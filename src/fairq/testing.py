"""pytest fixtures for integration tests of a fairq app: a private server and workers.

Enable the plugin in your ``conftest.py`` (or run ``pytest -p fairq.testing``)::

    pytest_plugins = ["fairq.testing"]

and use the fixtures (async tests need pytest-asyncio)::

    from myproject.tasks import app, build_report

    async def test_build_report(fairq_worker):
        await fairq_worker(app)                  # app -> private server, worker started
        handle = await build_report.trigger({"id": 7})
        assert await handle.wait(timeout=10) == {"id": 7, "pages": 3}

Fixtures:

* ``fairq_server`` (session): a private embedded Valkey (:class:`fairq.server.EmbeddedServer`)
  without persistence, started on first use and stopped at the end of the session. It
  never uses ``FAIRQ_REDIS_URL`` or the shared server, so tests cannot touch real data.
* ``fairq_url``: its URL.
* ``fairq_bind``: ``fairq_bind(app)`` points an app at the private server under a key
  prefix of its own for this test (so tests do not see each other's runs); the app's
  connection is closed when the test ends. Use it for tests that only trigger.
* ``fairq_worker``: ``await fairq_worker(app, **options)`` binds the app (as
  ``fairq_bind``) and starts a :class:`fairq.Worker` on the test's event loop; options
  are the worker's (``concurrency=``, ``queues=``, ``cancel_grace=``…). Call it again
  for more workers. When the test ends the workers stop (runs in flight get
  ``grace_period``, 5 s by default here) and an error a worker raised fails the test.

Bind (or start the worker) before the first trigger: a trigger made earlier goes to
the app's own server.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import pytest_asyncio

from fairq.app import Fairq
from fairq.server import EmbeddedServer
from fairq.worker import Worker

#: How long a stopping test worker waits for its runs by default (s).
TEST_GRACE_PERIOD = 5.0

_prefixes = itertools.count()


@pytest.fixture(scope="session")
def fairq_server() -> Iterator[EmbeddedServer]:
    """A private embedded Valkey for the test session."""
    with EmbeddedServer() as server:
        yield server


@pytest.fixture(scope="session")
def fairq_url(fairq_server: EmbeddedServer) -> str:
    """The private server's URL."""
    return fairq_server.url


class _Bindings:
    def __init__(self, url: str) -> None:
        self.url = url
        self.apps: dict[int, Fairq] = {}

    def bind(self, app: Fairq) -> Fairq:
        if not isinstance(app, Fairq):
            raise TypeError(f"fairq_bind needs a fairq.Fairq app, got {type(app).__name__}")
        if id(app) not in self.apps:
            app.use_server(self.url, prefix=f"fqtest{os.getpid()}x{next(_prefixes)}")
            self.apps[id(app)] = app
        return app

    async def close(self) -> None:
        for app in self.apps.values():
            await app.aclose()
            app.close()


@pytest_asyncio.fixture
async def fairq_bind(fairq_url: str) -> AsyncIterator[Callable[[Fairq], Fairq]]:
    """``fairq_bind(app)``: the app on the private server, under this test's prefix."""
    bindings = _Bindings(fairq_url)
    yield bindings.bind
    await bindings.close()


@pytest_asyncio.fixture
async def fairq_worker(
    fairq_bind: Callable[[Fairq], Fairq],
) -> AsyncIterator[Callable[..., Awaitable[Worker]]]:
    """``await fairq_worker(app, **options)``: a worker of the app, running until the test
    ends."""
    running: list[tuple[Worker, asyncio.Task[Any]]] = []

    async def start(app: Fairq, **options: Any) -> Worker:
        fairq_bind(app)
        options.setdefault("grace_period", TEST_GRACE_PERIOD)
        worker = Worker(app, **options)
        task = asyncio.create_task(worker.run(), name="fairq-test-worker")
        running.append((worker, task))
        # the worker has connected and applied the tasks' limits once it dequeues
        await asyncio.sleep(0)
        return worker

    yield start
    for worker, _ in running:
        worker.stop()
    errors: list[BaseException] = []
    for worker, task in running:
        try:
            await asyncio.wait_for(task, worker.grace_period + 10)
        except Exception as exc:
            errors.append(exc)
    if errors:
        raise errors[0]


__all__ = ["TEST_GRACE_PERIOD", "fairq_bind", "fairq_server", "fairq_url", "fairq_worker"]
