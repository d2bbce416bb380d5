"""Shared fixtures: one real server per test session (embedded Valkey, or FAIRQ_REDIS_URL),
and a fresh key prefix per test.

``FAIRQ_TEST_CLUSTER=N`` runs the session against an N-master embedded Redis/Valkey
Cluster instead (``redis_url`` is then a ``redis+cluster://`` URL)."""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Callable, Iterator

import hypothesis  # noqa: F401 - imported (and rewritten by pytest) here, at the start
import pytest

from fairq.config import RunQueueConfig
from fairq.keys import Environment
from fairq.server import EmbeddedServer, connect
from fairq.store import RunQueue

_counter = itertools.count()


#: Environment variable: run the session against an embedded cluster of this many masters.
CLUSTER_ENV = "FAIRQ_TEST_CLUSTER"


def cluster_masters() -> int:
    """Masters of the session's embedded cluster (0: a single server)."""
    raw = os.environ.get(CLUSTER_ENV, "").strip()
    if not raw or raw == "0":
        return 0
    if not raw.isdigit():
        raise pytest.UsageError(f"{CLUSTER_ENV}={raw!r}: expected a number of masters")
    return int(raw)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """The session's server: FAIRQ_REDIS_URL, an embedded cluster (FAIRQ_TEST_CLUSTER=N),
    or one embedded Valkey."""
    url = os.environ.get("FAIRQ_REDIS_URL")
    if url:
        yield url
        return
    masters = cluster_masters()
    if masters:
        from fairq.cluster import EmbeddedCluster

        with EmbeddedCluster(masters) as cluster:
            yield cluster.url
        return
    with EmbeddedServer() as server:
        yield server.url


@pytest.fixture
def prefix() -> str:
    return f"t{os.getpid()}x{next(_counter)}"


@pytest.fixture
def env() -> Environment:
    return Environment("org1", "proj1", "prod")


@pytest.fixture
async def make_queue(redis_url: str, prefix: str) -> AsyncIterator[Callable[..., object]]:
    """Factory: ``await make_queue(**config_overrides)`` -> RunQueue on the test prefix."""
    made: list[RunQueue] = []

    async def factory(**overrides: object) -> RunQueue:
        import random

        vtime = overrides.pop("vtime", None)
        config = RunQueueConfig(prefix=prefix, **overrides)  # type: ignore[arg-type]
        if vtime is not None:
            config = config.with_vtime(**vtime)  # type: ignore[arg-type]
        rq = RunQueue(await connect(redis_url), config, rng=random.Random(7))
        made.append(rq)
        return rq

    yield factory
    for rq in made:
        await rq.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In the cluster run, skip the long tests that prove topology-independent logic (they
    run on the single server; every script keeps its keys in one slot either way)."""
    if not cluster_masters():
        return
    skip = pytest.mark.skip(reason="single_server: topology-independent; run on one server")
    for item in items:
        if item.get_closest_marker("single_server"):
            item.add_marker(skip)
