"""What the store keeps about runs and actions for the people operating fairq: the audit
list, a run's trace context, the attempts' tracebacks, the wait in the history, and the
settings in force on a queue."""

from __future__ import annotations

from typing import Any

import pytest

from fairq.keys import Environment
from fairq.models import EnqueueRequest
from fairq.store import RunQueue

T0 = 1_700_000_000_000


async def test_admin_actions_are_kept_newest_first_on_the_server_clock(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    await rq.record_audit(env, who="dashboard 127.0.0.1", action="pause", target="queue q",
                          now_ms=T0)  # fmt: skip
    await rq.record_audit(env, who="cli", action="limits", target="queue q",
                          detail="concurrency 5", now_ms=T0 + 5)  # fmt: skip
    log = await rq.audit_log(env)
    assert [(e.at_ms, e.who, e.action, e.target, e.detail) for e in log] == [
        (T0 + 5, "cli", "limits", "queue q", "concurrency 5"),
        (T0, "dashboard 127.0.0.1", "pause", "queue q", ""),
    ]
    await rq.record_audit(env, who="cli", action="resume", target="queue q")
    (latest,) = await rq.audit_log(env, limit=1)
    assert latest.action == "resume" and latest.at_ms > T0  # the server's clock


async def test_the_audit_list_is_bounded(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    for i in range(1005):
        await rq.record_audit(env, who="w", action="a", target=f"t{i}", now_ms=T0 + i)
    assert await rq.client.llen(rq.keys.env(env).audit) == 1000
    assert (await rq.audit_log(env, limit=1))[0].target == "t1004"
    assert 0 < await rq.client.ttl(rq.keys.env(env).audit) <= 30 * 86400


@pytest.mark.parametrize("fair", [False, True], ids=["age", "fair"])
async def test_a_trace_context_travels_with_the_run_across_retries(
    make_queue: Any, env: Environment, fair: bool
) -> None:
    rq: RunQueue = await make_queue(vtime={"enabled": fair})
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01;vendor=x"
    await rq.enqueue_many(
        [
            EnqueueRequest(env, "q", "traced", None, "k", trace_context=tp),
            EnqueueRequest(env, "q", "plain", None, "k"),
        ],
        now_ms=T0,
    )
    got = {d.run_id: d for d in await rq.dequeue(10, env=env, queues=["q"], now_ms=T0 + 1)}
    got |= {d.run_id: d for d in await rq.dequeue(10, env=env, queues=["q"], now_ms=T0 + 1)}
    assert got["traced"].trace_context == tp
    assert got["plain"].trace_context is None
    await rq.nack(got["traced"], retry_at_ms=T0 + 2, now_ms=T0 + 1)
    (again,) = [
        d
        for d in await rq.dequeue(10, env=env, queues=["q"], now_ms=T0 + 3)
        if d.run_id == "traced"
    ]
    assert again.trace_context == tp and again.lease_token == 2


async def test_a_retried_and_a_dead_lettered_attempt_keep_their_traceback(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "r", None, now_ms=T0)
    (d,) = await rq.dequeue(1, env=env, queues=["q"], now_ms=T0 + 1)
    await rq.nack(d, error="ValueError: one", traceback="Traceback 1\n  line", max_attempts=2,
                  retry_at_ms=T0 + 2, now_ms=T0 + 1)  # fmt: skip
    info = await rq.get_run(env, "r")
    assert info is not None and info.error == "ValueError: one"
    assert info.traceback == "Traceback 1\n  line"
    (d,) = await rq.dequeue(1, env=env, queues=["q"], now_ms=T0 + 3)
    await rq.nack(d, error="ValueError: two", traceback="Traceback 2", max_attempts=2,
                  now_ms=T0 + 3)  # fmt: skip
    (dead,) = await rq.dead_letters(env)
    assert (dead.error, dead.traceback) == ("ValueError: two", "Traceback 2")
    long = "x" * 50_000
    await rq.enqueue(env, "q", "r2", None, now_ms=T0)
    (d,) = await rq.dequeue(1, env=env, queues=["q"], now_ms=T0 + 1)
    await rq.nack(d, traceback=long, retry_at_ms=T0 + 2, now_ms=T0 + 1)
    info = await rq.get_run(env, "r2")
    assert info is not None and info.traceback is not None and len(info.traceback) == 16_000


async def test_the_history_sums_how_long_served_runs_waited(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "q", "a", None, now_ms=T0)
    await rq.enqueue(env, "q", "b", None, available_at_ms=T0 + 300, now_ms=T0)
    await rq.dequeue(10, env=env, queues=["q"], now_ms=T0 + 1000)
    bucket = (await rq.history(env, "q", window_ms=10_000, now_ms=T0 + 1000))[-1]
    assert (bucket.served, bucket.wait_ms) == (2, 1000 + 700)


async def test_queue_stats_show_the_fair_settings_in_force_and_what_the_queue_sets(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    await rq.set_env_options(env, quantum=2.0, join="behind_leader")
    await rq.set_queue_options(env, "q", window=5, order="fair", concurrency=3)
    st = await rq.queue_stats(env, "q")
    assert (st.quantum, st.window, st.join, st.arrival_cap) == (2.0, 5, "behind_leader", 1.0)
    assert st.options == {"window": "5", "order": "fair", "concurrency": "3"}
    es = await rq.env_stats(env)
    assert (es.quantum, es.window, es.join) == (2.0, 3, "behind_leader")
