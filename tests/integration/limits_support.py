"""Shared helpers of the limit tests (test_limits*.py, test_rates.py,
test_borrow_and_charge.py): the two orders as a parameter, a queue factory per order,
batch enqueueing on a logical clock."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final, Literal

import pytest

from fairq.keys import Environment
from fairq.models import EnqueueRequest
from fairq.store import RunQueue

Order = Literal["age", "fair"]
MakeQueue = Callable[..., Awaitable[RunQueue]]

#: A logical clock origin (ms) far from 0 and from the server's real clock.
T0: Final = 1_000_000
#: Both orders, for ``pytest.mark.parametrize("order", ORDERS)``.
ORDERS: Final[list[Order]] = ["age", "fair"]

both_orders = pytest.mark.parametrize("order", ORDERS)


async def queue_for(make_queue: Any, order: Order, **config: Any) -> RunQueue:
    """A RunQueue on the test prefix whose default order is ``order``."""
    vtime = dict(config.pop("vtime", {}))
    vtime["enabled"] = order == "fair"
    rq: RunQueue = await make_queue(vtime=vtime, **config)
    return rq


async def enqueue_runs(
    rq: RunQueue,
    env: Environment,
    queue: str,
    prefix: str,
    count: int,
    *,
    key: str | None = None,
    tenant: str | None = None,
    at: int = T0,
) -> list[str]:
    """``count`` runs ``{prefix}{i}`` with scores ``at + i``, enqueued (one enqueue_many
    call) at ``at + count``: all are ready from then on."""
    requests = [
        EnqueueRequest(
            env, queue, f"{prefix}{i}", None, concurrency_key=key, tenant=tenant,
            available_at_ms=at + i,
        )
        for i in range(count)
    ]  # fmt: skip
    await rq.enqueue_many(requests, now_ms=at + count)
    return [r.run_id for r in requests]
