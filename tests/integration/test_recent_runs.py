"""A queue's recent list: what ack and expiry record per finished run, read back whole
(attempts counts the failed attempts before the one that finished)."""

from __future__ import annotations

import json
from typing import Any

from fairq import RunStatus
from fairq.keys import Environment
from fairq.models import Finish
from fairq.store import RunQueue
from fairq.store.readers import RecentRun


async def test_finished_runs_are_listed_newest_first_with_every_field(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    # a key and a tenant with spaces and other bytes an encoded name escapes
    await rq.enqueue(
        env, "q", "r-1", {"i": 1}, concurrency_key="user 1/é", tenant="acme corp", now_ms=1_000
    )
    await rq.enqueue(env, "q", "r.2", {"i": 2}, now_ms=1_000)
    (keyed,) = await rq.dequeue_from_queue(env, "q", keyed=True, max_count=1, now_ms=2_000)
    (keyless,) = await rq.dequeue_from_queue(env, "q", keyed=False, max_count=1, now_ms=2_500)
    await rq.finish([Finish(keyed, "failed")], now_ms=2_750)
    await rq.finish([Finish(keyless, "completed")], now_ms=4_000)

    assert await rq.recent_runs(env, "q") == [
        RecentRun("r.2", RunStatus.COMPLETED, 4_000, 0, 1_500, None, None),
        RecentRun("r-1", RunStatus.FAILED, 2_750, 0, 750, "user 1/é", "acme corp"),
    ]
    assert [r.run_id for r in await rq.recent_runs(env, "q", limit=1)] == ["r.2"]


async def test_an_expired_run_is_listed_without_a_run_time(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "late", ttl_ms=100, now_ms=1_000)
    assert await rq.expire_ttl(now_ms=1_200) == 1
    assert await rq.recent_runs(env, "q") == [
        RecentRun("late", RunStatus.EXPIRED, 1_200, 0, None, None, None)
    ]


async def test_entries_earlier_versions_wrote_as_json_are_still_read(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "new", now_ms=1_000)
    (d,) = await rq.dequeue_from_queue(env, "q", max_count=1, now_ms=1_000)
    await rq.ack([d], now_ms=1_010)
    old = {"run": "old", "status": "cancelled", "at": 900, "attempts": 2,
           "duration_ms": None, "key": "", "tenant": ""}  # fmt: skip
    await rq.client.rpush(rq.keys.queue(env, "q").recent, json.dumps(old))
    assert await rq.recent_runs(env, "q") == [
        RecentRun("new", RunStatus.COMPLETED, 1_010, 0, 10, None, None),
        RecentRun("old", RunStatus.CANCELLED, 900, 2, None, None, None),
    ]
