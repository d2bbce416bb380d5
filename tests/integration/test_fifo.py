"""Runs queued together (one batch, or one after another within a millisecond) are served
first-in, first-out: in the age order, and inside a key in the fair order."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from fairq import Fairq, RunQueueConfig, TriggerItem
from fairq.keys import Environment


@pytest.fixture(params=["age", "fair"])
async def app(
    request: pytest.FixtureRequest, redis_url: str, prefix: str, env: Environment
) -> AsyncIterator[Fairq]:
    config = RunQueueConfig(prefix=prefix).with_vtime(enabled=request.param == "fair")
    application = Fairq(env, url=redis_url, config=config)
    yield application
    await application.aclose()


async def served_ids(app: Fairq, queue: str, keyed: bool) -> list[str]:
    rq = await app.queue()
    out: list[str] = []
    while batch := await rq.dequeue_from_queue(app.env, queue, keyed=keyed, max_count=64):
        out += [d.run_id for d in batch]
        await rq.ack(batch)
    return out


async def test_a_batch_is_served_in_the_order_it_was_triggered(app: Fairq) -> None:
    @app.task(queue="batch")
    async def job(payload: int) -> None: ...

    handles = await job.trigger_many(list(range(300)))
    assert await served_ids(app, "batch", keyed=False) == [h.run_id for h in handles]


async def test_runs_of_one_key_are_served_in_the_order_they_were_triggered(app: Fairq) -> None:
    @app.task(queue="keyed")
    async def job(payload: int) -> None: ...

    handles = await job.trigger_many([TriggerItem(i, concurrency_key="acct-1") for i in range(200)])
    handles += [await job.trigger(i, concurrency_key="acct-1") for i in range(50)]
    assert await served_ids(app, "keyed", keyed=True) == [h.run_id for h in handles]


async def test_triggers_awaited_one_after_another_are_served_in_order(app: Fairq) -> None:
    @app.task(queue="serial")
    async def job(payload: int) -> None: ...

    handles = [await job.trigger(i) for i in range(100)]
    assert await served_ids(app, "serial", keyed=False) == [h.run_id for h in handles]
