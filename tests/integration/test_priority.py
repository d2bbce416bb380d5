"""Priority levels: strict across levels, the fair order inside one, every limit held
across levels, bounded aging on the server's clock, and bad levels refused before any
write. Logical clocks throughout (explicit now_ms)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from tests.state import keyspace

from fairq.errors import InvalidLimitError
from fairq.keys import Environment
from fairq.models import Delivery, LevelCount
from fairq.store import RunQueue

T0 = 1_000_000
ORDERS = ["age", "fair"]


async def fresh(make_queue: Any, env: Environment, order: str, **queue_options: Any) -> RunQueue:
    rq: RunQueue = await make_queue(vtime={"enabled": order == "fair"})
    await rq.set_env_limits(env, concurrency=100)
    await rq.set_queue_options(env, "q", order=order, **queue_options)
    return rq


async def drain_one_by_one(rq: RunQueue, env: Environment, now: int, n: int) -> list[Delivery]:
    """n dequeues of one run, each acked before the next (one slot in use at a time)."""
    out: list[Delivery] = []
    for i in range(n):
        got = await rq.dequeue(1, env=env, queues=["q"], now_ms=now + i)
        if not got:
            break
        out += got
        await rq.ack(got, now_ms=now + i)
    return out


@pytest.mark.parametrize("order", ORDERS)
async def test_every_level_1_run_starts_before_any_level_2_run(
    make_queue: Any, env: Environment, order: str
) -> None:
    """Level 2 runs queued a minute earlier still wait for every ready level-1 run; the
    default level (3) comes after both, level 5 last."""
    rq = await fresh(make_queue, env, order)
    level_of = {}
    for i in range(30):
        level = [2, 1, 3, 5, 2, 1][i % 6]
        run = f"r{i}"
        level_of[run] = level
        await rq.enqueue(env, "q", run, None, concurrency_key=f"k{i % 4}",
                         available_at_ms=T0 - 60_000 * level, now_ms=T0,
                         priority=None if level == 3 else level)  # fmt: skip
    served = [level_of[d.run_id] for d in await drain_one_by_one(rq, env, T0, 40)]
    assert served == sorted(served)
    assert Counter(served) == {1: 10, 2: 10, 3: 5, 5: 5}


@pytest.mark.parametrize("order", ORDERS)
async def test_a_capped_level_1_key_leaves_its_slots_to_level_2_work(
    make_queue: Any, env: Environment, order: str
) -> None:
    """Key k (cap 1) has three level-1 runs and one of level 5: one call serves one k run
    and every level-2 run of key j; the cap holds across k's levels."""
    rq = await fresh(make_queue, env, order, max_per_key=10)
    await rq.set_key_concurrency(env, "q", "k", 1)
    for i in range(3):
        await rq.enqueue(env, "q", f"k1-{i}", None, concurrency_key="k", priority=1, now_ms=T0)
    await rq.enqueue(env, "q", "k5", None, concurrency_key="k", priority=5, now_ms=T0)
    for i in range(4):
        await rq.enqueue(env, "q", f"j2-{i}", None, concurrency_key="j", priority=2, now_ms=T0)
    got = [d.run_id for d in await rq.dequeue(10, env=env, queues=["q"], now_ms=T0 + 1)]
    assert got[0] == "k1-0"
    assert sorted(got[1:]) == [f"j2-{i}" for i in range(4)]
    # nothing more of k while its one slot is held, at any level
    assert await rq.dequeue(10, env=env, queues=["q"], now_ms=T0 + 2) == []


@pytest.mark.parametrize("order", ORDERS)
async def test_tenant_and_total_caps_hold_across_levels(
    make_queue: Any, env: Environment, order: str
) -> None:
    rq = await fresh(make_queue, env, order, total=5, max_per_key=10)
    await rq.set_tenant_concurrency(env, "q", "T", 2)
    for level in (1, 2, 3, 4, 5):
        for i in range(3):
            await rq.enqueue(env, "q", f"t{level}-{i}", None, concurrency_key=f"a{level}",
                             tenant="T", priority=level, now_ms=T0)  # fmt: skip
            await rq.enqueue(env, "q", f"u{level}-{i}", None, concurrency_key=f"u{level}-{i}",
                             priority=level, now_ms=T0)  # fmt: skip
    got = await rq.dequeue(50, env=env, queues=["q"], now_ms=T0 + 1)
    assert len(got) == 5  # the queue's total cap, across levels
    assert sum(d.tenant == "T" for d in got) == 2  # T's cap, across levels
    # strict: the five are of level 1, then level 2 (T's two slots go to its level-1 key)
    assert sorted(d.run_id for d in got if d.tenant == "T") == ["t1-0", "t1-1"]
    assert sorted(d.run_id for d in got if d.tenant is None) == ["u1-0", "u1-1", "u1-2"]


@pytest.mark.parametrize("order", ORDERS)
async def test_a_key_rate_limit_holds_across_levels(
    make_queue: Any, env: Environment, order: str
) -> None:
    """Key k at 1 run/s (burst 1) with runs at levels 1 and 4: over 10 logical seconds of
    dequeues every 100 ms, at most 1 + 10 of its runs start, levels together."""
    rq = await fresh(make_queue, env, order)
    await rq.set_rate_limit(env, "q", 1.0, burst=1, key="k")
    for i in range(20):
        await rq.enqueue(env, "q", f"r{i}", None, concurrency_key="k",
                         priority=1 if i % 2 else 4, now_ms=T0)  # fmt: skip
    started = 0
    for step in range(100):
        got = await rq.dequeue(10, env=env, queues=["q"], now_ms=T0 + step * 100)
        started += len(got)
        await rq.ack(got, now_ms=T0 + step * 100)
    assert 10 <= started <= 11


@pytest.mark.parametrize("level", [1, 4])
async def test_shares_inside_a_level_do_not_grow_with_keys(
    make_queue: Any, env: Environment, level: int
) -> None:
    """Inside one level the two-level fair order holds: tenant A with one key and tenant B
    with nine get 50 % each (+-5 %) of 200 one-by-one serves, while tenant C's backlog at
    a lower level (a higher number) waits for the level to drain."""
    rq = await fresh(make_queue, env, "fair")
    for i in range(200):
        await rq.enqueue(env, "q", f"a{i}", None, concurrency_key="a", tenant="A",
                         priority=level, now_ms=T0)  # fmt: skip
        await rq.enqueue(env, "q", f"b{i}", None, concurrency_key=f"b{i % 9}", tenant="B",
                         priority=level, now_ms=T0)  # fmt: skip
        await rq.enqueue(env, "q", f"c{i}", None, concurrency_key="c", tenant="C",
                         priority=level + 1, now_ms=T0 - 10_000)  # fmt: skip
    served = Counter(d.tenant for d in await drain_one_by_one(rq, env, T0 + 1, 200))
    assert served["C"] == 0
    assert abs(served["A"] / 200 - 0.5) <= 0.05, served
    # the level's other 200 runs, then the level below
    assert {d.tenant for d in await drain_one_by_one(rq, env, T0 + 1000, 200)} == {"A", "B"}
    assert {d.tenant for d in await drain_one_by_one(rq, env, T0 + 2000, 10)} == {"C"}


@pytest.mark.parametrize("order", ORDERS)
async def test_a_waiting_run_moves_up_one_level_at_its_bound(
    make_queue: Any, env: Environment, order: str
) -> None:
    """max_wait_promote = 10 s: tenant B's level-2 run waits behind tenant A's level-1
    backlog until it has waited 10 s, then moves to level 1 and starts in the first call
    after (calls every 250 ms: within 0.25 s of its bound); a level-3 run of C moves up
    one level at 10 s and one more at 20 s (and no further than level 1)."""
    rq = await fresh(make_queue, env, order, max_wait_promote=10)
    for i in range(400):
        await rq.enqueue(env, "q", f"a{i}", None, concurrency_key=f"a{i % 3}", tenant="A",
                         priority=1, now_ms=T0 + i * 50)  # fmt: skip
    await rq.enqueue(env, "q", "b", None, concurrency_key="b", tenant="B", priority=2,
                     now_ms=T0)  # fmt: skip
    await rq.enqueue(env, "q", "c", None, concurrency_key="c", tenant="C", now_ms=T0)
    started: dict[str, int] = {}
    for step in range(1, 120):
        now = T0 + step * 250
        got = await rq.dequeue(1, env=env, queues=["q"], now_ms=now)
        for d in got:
            started[d.run_id] = now
        await rq.ack(got, now_ms=now)
    assert T0 + 10_000 <= started["b"] <= T0 + 10_250
    assert T0 + 20_000 <= started["c"] <= T0 + 20_250


@pytest.mark.parametrize("order", ORDERS)
async def test_requeued_runs_keep_their_level(
    make_queue: Any, env: Environment, order: str
) -> None:
    """A level-1 run that is nacked comes back at level 1 (before older level-3 runs); a
    cancelled queued level-1 run leaves its level's queue; queue_stats counts every level."""
    rq = await fresh(make_queue, env, order)
    await rq.enqueue(env, "q", "hi", None, priority=1, now_ms=T0)
    await rq.enqueue(env, "q", "gone", None, concurrency_key="g", priority=1, now_ms=T0)
    await rq.enqueue(env, "q", "lo", None, available_at_ms=T0 - 60_000, now_ms=T0)
    stats = await rq.queue_stats(env, "q")
    assert stats.queued == 3
    assert await rq.level_counts(env, "q") == {1: LevelCount(2, 0), 3: LevelCount(1, 0)}
    assert (await rq.cancel(env, "gone")).value == "cancelled"
    (first,) = await rq.dequeue(1, env=env, queues=["q"], now_ms=T0 + 1)
    assert first.run_id == "hi"
    await rq.nack(first, retry_at_ms=T0 + 2, now_ms=T0 + 1)
    (again,) = await rq.dequeue(1, env=env, queues=["q"], now_ms=T0 + 3)
    assert again.run_id == "hi"
    (last,) = await rq.dequeue(1, env=env, queues=["q"], now_ms=T0 + 4)
    assert last.run_id == "lo"
    assert (await rq.queue_stats(env, "q")).queued == 0


async def test_a_level_the_queue_does_not_have_is_refused_and_nothing_is_written(
    make_queue: Any, env: Environment
) -> None:
    rq = await fresh(make_queue, env, "fair", priority_levels=3)
    await rq.enqueue(env, "q", "ok", None, priority=3, now_ms=T0)
    before = await keyspace(rq)
    with pytest.raises(InvalidLimitError, match="priority 4 out of range"):
        await rq.enqueue(env, "q", "bad", None, priority=4, now_ms=T0)
    with pytest.raises(InvalidLimitError):
        await rq.enqueue(env, "q", "bad", None, priority=0, now_ms=T0)
    with pytest.raises(InvalidLimitError):
        await rq.set_queue_options(env, "q", priority_levels=10)
    assert await keyspace(rq) == before
    # a queue of 3 levels: a run that names none gets level 2, the middle one
    await rq.enqueue(env, "q", "mid", None, now_ms=T0)
    await rq.enqueue(env, "q", "low", None, priority=3, available_at_ms=T0 - 5_000, now_ms=T0)
    got = [d.run_id for d in await rq.dequeue(3, env=env, queues=["q"], now_ms=T0 + 1)]
    assert got == ["mid", "ok", "low"] or got == ["mid", "low", "ok"]


async def test_stats_and_the_dashboard_show_runs_per_level(
    make_queue: Any, env: Environment
) -> None:
    """The overview's queue row (what `fairq stats --json` prints), the stats table and
    the queue page's data give queued / running per level once a queue uses levels."""
    from rich.console import Console

    from fairq.commands.stats import render
    from fairq.dashboard.views import load_overview, load_queue_detail

    rq = await fresh(make_queue, env, "fair")
    await rq.enqueue(env, "q", "plain", None, now_ms=T0)
    overview = await load_overview(rq, env=env, now_ms=T0)
    assert "levels" not in overview.environments[0].queues[0].to_json()  # one level: none
    for i in range(3):
        await rq.enqueue(env, "q", f"hi{i}", None, concurrency_key=f"k{i}", priority=1, now_ms=T0)
    await rq.enqueue(env, "q", "low", None, priority=5, now_ms=T0)
    got = await rq.dequeue(1, env=env, queues=["q"], now_ms=T0 + 1)
    assert [d.run_id for d in got] == ["hi0"]
    overview = await load_overview(rq, env=env, now_ms=T0 + 2)
    row = overview.environments[0].queues[0].to_json()
    assert row["levels"] == [
        {"level": 1, "queued": 2, "running": 1},
        {"level": 3, "queued": 1, "running": 0},
        {"level": 5, "queued": 1, "running": 0},
    ]
    console = Console(width=200, record=True)
    console.print(render(overview))
    assert "1: 2 / 1  3: 1 / 0  5: 1 / 0" in console.export_text()
    detail = await load_queue_detail(rq, env, "q", now_ms=T0 + 2)
    assert detail.queue.by_level == ((1, 2, 1), (3, 1, 0), (5, 1, 0))


async def test_the_queue_page_shows_its_levels(make_queue: Any, env: Environment) -> None:
    import httpx

    from fairq.dashboard.app import create_app

    rq = await fresh(make_queue, env, "age")
    await rq.enqueue(env, "q", "a", None, priority=1, now_ms=T0)
    await rq.enqueue(env, "q", "b", None, priority=4, now_ms=T0)
    transport = httpx.ASGITransport(app=create_app(rq, token=None, allowed_hosts=["dash"]))
    async with httpx.AsyncClient(transport=transport, base_url="http://dash") as client:
        page = (await client.get(f"/queues/{env.id}/q")).text
    assert 'data-level="1">1: 1</span>' in page and 'data-level="4">4: 1</span>' in page


async def test_a_backfilled_run_moves_up_one_level_per_bound_from_its_enqueue(
    make_queue: Any, env: Environment
) -> None:
    """A level-5 run stamped ten minutes in the past waits one bound per level from when it
    was queued: at level 4 after 10 s, 3 after 20 s, not at level 1 on the first call."""
    rq = await fresh(make_queue, env, "age", max_wait_promote=10)
    await rq.enqueue(env, "q", "old", None, priority=5, available_at_ms=T0 - 600_000,
                     now_ms=T0)  # fmt: skip
    for at, level in ((T0 + 1, 5), (T0 + 10_000, 4), (T0 + 15_000, 4), (T0 + 20_000, 3)):
        # a dequeue of keyed runs only: it promotes, and serves nothing
        assert await rq.dequeue_from_queue(env, "q", keyed=True, max_count=1, now_ms=at) == []
        assert await rq.level_counts(env, "q") == {level: LevelCount(1, 0)}, at
