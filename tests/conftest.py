"""Shared fixtures: one real server per test session (embedded Valkey, or FAIRQ_REDIS_URL),
and a fresh key prefix per test."""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from fairq.config import RunQueueConfig
from fairq.keys import Environment
from fairq.server import EmbeddedServer, connect
from fairq.store import RunQueue

_counter = itertools.count()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    url = os.environ.get("FAIRQ_REDIS_URL")
    if url:
        yield url
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
