"""The blocking API's own enqueue path (``Task.trigger_sync`` on one server): the calling
thread sends the script on a blocking connection, threads share script calls when one
is in flight for their queue, and every caller gets its own result or error."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from tests.integration.commandstats import reset_stats, script_calls
from tests.state import run_state

from fairq.app import Fairq
from fairq.config import RunQueueConfig
from fairq.errors import PayloadError, QueueSizeLimitExceededError
from fairq.keys import Environment
from fairq.models import EnqueueStatus
from fairq.server import is_cluster_url
from fairq.store import RunQueue


async def noop(payload: Any) -> None:
    return None


@pytest.fixture
def app(redis_url: str, prefix: str, env: Environment) -> Iterator[Fairq]:
    application = Fairq(env, url=redis_url, config=RunQueueConfig(prefix=prefix))
    yield application
    application.close()


async def test_trigger_sync_enqueues_from_the_calling_thread(
    app: Fairq, redis_url: str, make_queue: Any, env: Environment
) -> None:
    task = app.task(queue="blk")(noop)
    handles = [task.trigger_sync({"i": i}) for i in range(5)]
    assert [h.status for h in handles] == [EnqueueStatus.ENQUEUED] * 5
    rq: RunQueue = await make_queue()
    for h in handles:
        assert await run_state(rq, env, h.run_id) == "queued"
    if not is_cluster_url(redis_url):
        assert app.sync._blocking is not None  # the blocking path, not the loop thread
    else:
        assert app.sync._blocking is None  # a cluster keeps the event-loop path


async def test_threads_waiting_on_a_call_in_flight_share_one_script_call(
    app: Fairq, redis_url: str, make_queue: Any, env: Environment
) -> None:
    """The leader's call is held by the server (CLIENT PAUSE WRITE); 7 threads trigger
    meanwhile and wait; when it returns, the first of them sends all 7 in one call."""
    if is_cluster_url(redis_url):
        pytest.skip("the blocking path is for one server")
    task = app.task(queue="blk2")(noop)
    task.trigger_sync("warm")  # connected, scripts loaded
    blocking = app.sync._blocking
    assert blocking is not None
    rq: RunQueue = await make_queue()
    await reset_stats(rq.client)
    results: dict[int, Any] = {}

    def trigger(i: int) -> None:
        results[i] = task.trigger_sync({"i": i}, run_id=f"t{i}")

    leader = threading.Thread(target=trigger, args=(0,))
    others = [threading.Thread(target=trigger, args=(i,)) for i in range(1, 8)]
    # long: a pause that lifted itself while the threads start would let the leader's
    # call return before they wait; lifted below once they do (or a check failed)
    await rq.client.execute_command("CLIENT", "PAUSE", "30000", "WRITE")
    try:
        leader.start()
        deadline = time.monotonic() + 5
        while (env, 0, "blk2") not in blocking._sending:  # the leader's call is in flight
            assert time.monotonic() < deadline
            await asyncio.sleep(0.005)
        for t in others:
            t.start()
        while len(blocking._waiting.get((env, 0, "blk2"), [])) < 7:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.005)
    finally:
        await rq.client.execute_command("CLIENT", "UNPAUSE")
    for t in [leader, *others]:
        await asyncio.to_thread(t.join, 10)
    assert sorted(results) == list(range(8))
    assert all(results[i].run_id == f"t{i}" for i in range(8))
    assert all(results[i].status is EnqueueStatus.ENQUEUED for i in range(8))
    assert await script_calls(rq.client) == 2
    assert (await rq.queue_stats(env, "blk2")).queued == 9


async def test_each_caller_gets_its_own_refusal(
    app: Fairq, make_queue: Any, env: Environment
) -> None:
    """A payload that is not JSON fails its caller before anything is sent; a full queue
    refuses only the runs past its limit."""
    task = app.task(queue="blk3")(noop)
    rq: RunQueue = await make_queue()
    await rq.set_queue_size_limit(env, "blk3", 2)
    with pytest.raises(PayloadError):
        task.trigger_sync({"bad": object()})
    assert task.trigger_sync(1).status is EnqueueStatus.ENQUEUED
    assert task.trigger_sync(2).status is EnqueueStatus.ENQUEUED
    with pytest.raises(QueueSizeLimitExceededError):
        task.trigger_sync(3)
    assert (await rq.queue_stats(env, "blk3")).queued == 2


async def test_a_fair_queue_and_a_forgotten_library(
    app: Fairq, make_queue: Any, env: Environment
) -> None:
    """The age build refuses a queue another process set to the fair order, and the run
    goes through the fair build (and is served); after FUNCTION FLUSH the library is
    loaded again."""
    rq: RunQueue = await make_queue()
    await rq.set_queue_options(env, "blk4", order="fair")
    task = app.task(queue="blk4")(noop)
    handle = task.trigger_sync(1, concurrency_key="k1")
    assert handle.status is EnqueueStatus.ENQUEUED
    (served,) = await rq.dequeue(1, env=env, queues=["blk4"])
    assert served.run_id == handle.run_id and served.concurrency_key == "k1"
    await rq.client.function_flush()
    assert task.trigger_sync(2).status is EnqueueStatus.ENQUEUED
