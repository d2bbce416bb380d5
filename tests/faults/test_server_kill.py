"""``kill -9`` of the server under load, restarted on the same address with its data.

The test runs its own embedded Valkey (append-only file, ``appendfsync always``) on a
fixed port. Producers in the test process keep enqueueing and record every enqueue the
server acknowledged; two real ``fairq worker`` processes keep draining. The server is
killed outright mid-load and started again on the same port and data directory.

Durability contract shown here: with ``appendfsync always`` a write is on disk before
the server replies, so **no acknowledged enqueue is lost** (asserted). With the shared
server's default ``everysec`` the append-only file is fsynced once a second, so a
``kill -9`` of the *process* still loses nothing (the kernel has the writes), but a
machine crash may lose the acknowledged writes of the last second or two; this test
does not simulate a machine crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from tests.faults._procs import WorkerPool, drained, eventually

from fairq.config import RunQueueConfig
from fairq.errors import FairqError
from fairq.keys import Environment
from fairq.outcomes import RunStatus
from fairq.server import EmbeddedServer, connect, free_port
from fairq.store import RunQueue

PRODUCERS = 3
LEASE_MS = 2000
#: Load before the kill, downtime, load after the restart (s).
BEFORE_S, DOWN_S, AFTER_S = 1.5, 0.5, 1.5
#: How long workers may take to resume after the restart (s): their reconnect backoff
#: is capped at 2 s.
RESUME_S = 8.0


def _server(port: int, data: Path) -> EmbeddedServer:
    return EmbeddedServer(port=port, data_dir=data, appendonly=True, appendfsync="always")


async def _produce(
    url: str, prefix: str, env: Environment, name: str, stop: asyncio.Event, acked: list[str]
) -> int:
    """Enqueue until ``stop``; keep the ids the server acknowledged. Returns the number of
    enqueues that failed (their fate is unknown to the producer, so nothing is claimed)."""
    rq = RunQueue(await connect(url), RunQueueConfig(prefix=prefix, lease_ms=LEASE_MS))
    failed = 0
    n = 0
    try:
        while not stop.is_set():
            run_id = f"{name}-{n}"
            n += 1
            try:
                await rq.enqueue(env, "work", run_id, {"ms": 5})
            except FairqError:
                failed += 1
                await asyncio.sleep(0.02)
                continue
            acked.append(run_id)
            await asyncio.sleep(0.002)
    finally:
        await rq.close()
    return failed


async def test_kill_9_of_the_server_loses_no_acknowledged_enqueue_and_workers_resume(
    prefix: str, env: Environment, tmp_path: Path
) -> None:
    """Every enqueue acknowledged before, around and after the kill completes; both
    worker processes (never restarted) lease runs again within seconds of the restart;
    nothing is left queued or running."""
    port = free_port()
    data = tmp_path / "data"
    server = _server(port, data).start()
    url = server.url
    restarted: EmbeddedServer | None = None
    pool = WorkerPool(tmp_path / "w", url, prefix, env, LEASE_MS, concurrency=8)
    stop = asyncio.Event()
    acked: list[str] = []
    producers: list[asyncio.Task[int]] = []
    try:
        workers = [pool.spawn() for _ in range(2)]
        producers = [
            asyncio.create_task(_produce(url, prefix, env, f"p{i}", stop, acked))
            for i in range(PRODUCERS)
        ]
        await eventually(
            lambda: all(pool.has_run(p) for p in workers), 15, "both workers run tasks"
        )
        await asyncio.sleep(BEFORE_S)
        before = len(acked)
        # kill -9 the server mid-load
        assert server.process is not None
        server.process.kill()
        server.process.wait(10)
        await asyncio.sleep(DOWN_S)
        restarted = _server(port, data).start()
        back = time.monotonic()
        sizes = {p: (pool.ledger / f"{p}.log").stat().st_size for p in workers}
        # each worker process resumes by itself: its ledger grows again
        resumed = await eventually(
            lambda: all((pool.ledger / f"{p}.log").stat().st_size > sizes[p] for p in workers),
            RESUME_S,
            "both workers lease runs again after the restart",
        )
        await asyncio.sleep(AFTER_S)
        stop.set()
        failed = sum(await asyncio.gather(*producers))
        check = RunQueue(await connect(url), RunQueueConfig(prefix=prefix, lease_ms=LEASE_MS))
        try:
            await eventually(lambda: drained(check, env), 30, "the queue drains after the restart")
            infos = []
            for i in range(0, len(acked), 100):
                infos += await asyncio.gather(*(check.get_run(env, r) for r in acked[i : i + 100]))
            lost = [r for r, info in zip(acked, infos, strict=True) if info is None]
            not_done = [
                (r, info.status)
                for r, info in zip(acked, infos, strict=True)
                if info is not None and info.status is not RunStatus.COMPLETED
            ]
            assert lost == [], f"{len(lost)} acknowledged enqueues lost: {lost[:5]}"
            assert not_done == []
            assert (await check.env_stats(env)).running == 0
            assert sum([await check.client.zcard(s.leases) for s in check.keys.shards()]) == 0
        finally:
            await check.close()
        codes = pool.stop_all()
        assert all(code == 0 for code in codes.values()), codes
        assert before > 0 and len(acked) > before
        print(
            f"\n{len(acked)} acknowledged enqueues ({before} before the kill), {failed} "
            f"refused while down, 0 lost; workers resumed {resumed:.2f}s after the restart "
            f"({time.monotonic() - back:.1f}s since)"
        )
    finally:
        stop.set()
        for task in producers:
            with contextlib.suppress(Exception):
                await task
        pool.stop_all()
        for s in (server, restarted):
            if s is not None:
                s.stop()
