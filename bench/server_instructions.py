"""Server instructions per operation, counted by callgrind: deterministic A/B of scripts.

Wall-clock figures on a shared 2-core machine move by ±10 % between identical runs, so a
change that saves 3 % of a script's work cannot be seen with a timer. This benchmark runs
the embedded ``valkey-server`` under valgrind's callgrind with instrumentation off, does
each workload's warm-up (libraries loaded, data enqueued), switches instrumentation on
for the measured part only, and reports the server's instructions per operation: the
same figure twice in a row to within 0.1 %, whatever else the machine is doing. It
counts the server's user-space work (scripts, commands, request parsing), not the
kernel's (socket system calls), and not the client's.

Workloads (``--workloads``, comma-separated):

* ``trigger``: one awaited ``Task.trigger`` per run, keyless (per op: one run);
* ``trigger_fair``: the same in the fair order, each run with a key of 100 and a named
  tenant of 10 (per op: one run);
* ``drain``: ``dequeue_batch(10)`` + ``ack`` of a keyless queue, as a worker does (per
  op: one batch of 10);
* ``drain1``: the same one run at a time (per op: one run): a call's fixed cost, which
  ``drain`` spreads over ten;
* ``fair:KEYS:TENANTS`` / ``age:KEYS:TENANTS``: dequeue 10 + ack of keyed runs in the
  fair / age order, KEYS busy keys owned by TENANTS named tenants (0: each key its own),
  as ``bench/ck_throughput.py --tenants`` (per op: one batch of 10);
* ``spread:S:TENANTS``: ``dequeue_batch(10, env=...)`` + ``ack`` in the fair order of an
  environment spread over S partitions, TENANTS named tenants of weights 1, 2, 4 in turn
  (keyless runs), the worker's way: the partition view read included (per op: one batch
  of 10).

Two references for ``trigger``, what bounds it from below and what it is compared with:

* ``trigger_floor``: the same keyless runs, each sent with the enqueue script's own
  arguments to a floor script that runs the five commands a keyless enqueue must run
  (``TIME``, ``EXISTS`` of the environment's config, ``HSETEX FNX`` of the run's five
  fields, ``ZADD`` into the queue, ``ZADD LT CH`` of the queue's head) on the same key
  names, and nothing else: no checks, no state, no options (per op: one run);
* ``dramatiq_send``: Dramatiq's ``send`` of one message to its Redis broker, the peer
  ``bench/peers.py`` compares enqueues with (per op: one message; needs ``dramatiq``).

And the drain as ``bench/peers.py``'s drain trial runs it, for the other half of its
server-work column: a worker of 8 runs in flight started on a backlog, measured from its
start until the last run is finished (per op: one run), its libraries or scripts loaded
by an earlier worker:

* ``worker_drain``: fairq's ``Worker(concurrency=8)`` on keyless runs;
* ``dramatiq_drain``: Dramatiq's ``Worker(worker_threads=8)`` (needs ``dramatiq``).

``--against REF`` measures the same workloads on a git ref too (checked out into a
temporary worktree, imported instead of this checkout), and reports REF / this ratios.

    python bench/server_instructions.py [--workloads trigger,drain,fair:1000:100]
                                        [--n 2000] [--against HEAD~1]

With ``FAIRQ_CALLGRIND_KEEP=DIR`` each workload's profile is kept in DIR (one file per
checkout and workload) for ``callgrind_annotate``: where the server's time goes, by C
function. ``FAIRQ_BENCH_SERVER_ARGS`` adds options to the server's command line (e.g.
``--hash-max-listpack-entries 16``: what the hashes' compact encoding costs).

Needs valgrind (Debian package ``valgrind``); prints one JSON document. Not run in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

SCRIPT = os.path.abspath(__file__)
ROOT = Path(SCRIPT).resolve().parent.parent
DEFAULT_WORKLOADS = "trigger,drain,fair:1000:100,age:1000:100"
#: Batches (or triggers) run before instrumentation starts.
WARM_OPS = 20
T0 = 1_000_000


# --------------------------------------------------------------------------- the client


def _instrument(pid: int, on: bool) -> None:
    subprocess.run(
        ["callgrind_control", "-i", "on" if on else "off", str(pid)],
        check=True,
        stdout=subprocess.DEVNULL,
    )


async def _noop(payload: dict[str, Any]) -> None:
    return None


def _dramatiq_noop(payload: dict[str, Any]) -> None:
    return None


async def _client(workload: str, n: int, port: int, pid: int) -> int:
    """Run one workload against the server on ``port`` (callgrind ``pid``); returns the
    number of operations measured."""

    url = f"redis://127.0.0.1:{port}/0"
    if workload == "trigger_floor":
        return await _floor_client(n, url, pid)
    if workload == "dramatiq_send":
        return _dramatiq_client(n, url, pid)
    if workload == "worker_drain":
        return await _worker_drain_client(n, url, pid)
    if workload == "dramatiq_drain":
        return _dramatiq_drain_client(n, url, pid)
    if workload in ("trigger", "trigger_fair", "drain", "drain1"):
        return await task_cycles(workload, n, url, lambda on: _instrument(pid, on))
    if workload.startswith("spread:"):
        return await _spread_client(workload, n, url, pid)
    return await keyed_cycles(workload, n, url, lambda on: _instrument(pid, on))


async def task_cycles(workload: str, n: int, url: str, measuring: Callable[[bool], None]) -> int:
    """``trigger`` / ``trigger_fair``: ``n`` awaited ``Task.trigger`` calls; ``drain``:
    ``n`` runs queued, then ``dequeue_batch(10)`` + ``ack`` until they are served
    (``drain1``: ``dequeue_batch(1)``). After a warm-up, ``measuring(True)``, and
    ``measuring(False)`` at the end. Returns the operations measured (runs, or batches)."""
    from fairq import Fairq, RetryPolicy, RunQueueConfig

    fair = workload == "trigger_fair"
    config = RunQueueConfig().with_vtime(enabled=True) if fair else RunQueueConfig()
    app = Fairq(env="bench:instructions:run", url=url, config=config)
    task = app.task(queue="noop", retry=RetryPolicy(max_attempts=1))(_noop)

    def spread(i: int) -> dict[str, str]:
        return {"concurrency_key": f"k{i % 100}", "tenant": f"t{i % 10}"} if fair else {}

    batch = {"drain": 10, "drain1": 1}.get(workload, 0)
    runs = WARM_OPS * batch + n if batch else WARM_OPS * 10
    for i in range(runs):
        await task.trigger({"i": i, "t": 0.0}, run_id=f"w{i}", **spread(i))
    measured = 0
    if not batch:
        measuring(True)
        for i in range(n):
            await task.trigger({"i": i, "t": 0.0}, run_id=f"r{i}", **spread(i))
        measured = n
    else:
        rq = await app.queue()
        for i in range(WARM_OPS + n // batch):
            if i == WARM_OPS:
                measuring(True)
            served = await rq.dequeue_batch(batch, env=app.env, queues=["noop"])
            await rq.ack(served.deliveries)
            if i >= WARM_OPS:
                measured += 1
    measuring(False)
    await app.aclose()
    return measured


async def keyed_cycles(workload: str, n: int, url: str, measuring: Callable[[bool], None]) -> int:
    """``fair:KEYS:TENANTS`` / ``age:KEYS:TENANTS``: ``n`` keyed runs queued
    (:func:`load_keyed`), then dequeue 10 + ack until they are served; ``measuring(True)``
    once the first WARM_OPS batches are done, ``measuring(False)`` at the end. Returns the
    batches measured."""
    from fairq import RunQueueConfig
    from fairq.keys import Environment
    from fairq.server import connect
    from fairq.store import RunQueue

    order, keys_text, tenants_text = workload.split(":")
    keys, tenants = int(keys_text), int(tenants_text)
    config = RunQueueConfig(prefix="bi", default_env_concurrency=100_000)
    rq = RunQueue(
        await connect(url), config.with_vtime(enabled=order == "fair"), rng=random.Random(1)
    )
    env = Environment("bench", "p", "e")
    await load_keyed(rq, env, n, keys, tenants)
    done = batches = 0
    while done < n:
        if batches == WARM_OPS:
            measuring(True)
        batch = await rq.dequeue_from_queue(env, "bench", keyed=True, max_count=10, now_ms=T0 + n)
        await rq.ack(batch, now_ms=T0 + n)
        if not batch:
            break
        done += len(batch)
        batches += 1
    measuring(False)
    await rq.close()
    return batches - WARM_OPS


async def load_keyed(rq: Any, env: Any, n: int, keys: int, tenants: int) -> None:
    """Queue ``n`` runs of queue ``bench`` on ``keys`` keys owned by ``tenants`` named
    tenants (0: each key its own), run i due at T0 + i (the keyed workloads' data)."""
    from fairq.models import EnqueueRequest

    requests = [
        EnqueueRequest(env, "bench", f"r{i}", {"i": i}, f"k{i % keys}", available_at_ms=T0 + i,
                       tenant=f"t{i % keys % tenants}" if tenants else None)
        for i in range(n)
    ]  # fmt: skip
    for i in range(0, n, 1000):
        await rq.enqueue_many(requests[i : i + 1000], now_ms=T0)


async def _spread_client(workload: str, n: int, url: str, pid: int) -> int:
    """``spread:S:TENANTS``: batches of 10 of an environment spread over S partitions."""
    from fairq import RunQueueConfig
    from fairq.keys import Environment
    from fairq.models import EnqueueRequest
    from fairq.server import connect
    from fairq.store import RunQueue

    _, partitions_text, tenants_text = workload.split(":")
    partitions, tenants = int(partitions_text), int(tenants_text)
    config = RunQueueConfig(prefix="bs", shard_count=24, default_env_concurrency=100_000)
    rq = RunQueue(await connect(url), config.with_vtime(enabled=True), rng=random.Random(1))
    env = Environment("bench", "p", "spread")
    if partitions > 1:
        await rq.set_partitions(env, partitions)
    for t in range(tenants):
        if t % 3:
            await rq.set_tenant_weight(env, f"t{t}", (1, 2, 4)[t % 3])
    total = n + WARM_OPS * 10
    requests = [
        EnqueueRequest(env, "bench", f"r{i}", {}, tenant=f"t{i % tenants}") for i in range(total)
    ]
    for i in range(0, total, 1000):
        await rq.enqueue_many(requests[i : i + 1000])
    batches = 0
    while True:
        if batches == WARM_OPS:
            _instrument(pid, True)
        batch = await rq.dequeue_batch(10, env=env, queues=["bench"])
        await rq.ack(batch.deliveries)
        if not batch.deliveries:
            break
        batches += 1
    _instrument(pid, False)
    await rq.close()
    return batches - WARM_OPS


def floor_script(wake_channel: str) -> str:
    """The floor of a keyless enqueue: its five commands on its key names, built from the
    same schema tables as the scripts' (ARGV as the enqueue script's: context, env id,
    queue, schedule, tick, then the run's one argument), and, as the enqueue, the wake-up
    hint on ``wake_channel`` when the queue's head changed (it was empty: never in a
    backlog)."""
    from fairq import keys as K
    from fairq.store.run_hash import RUN_FIELDS

    f = {name: field.stored for name, field in RUN_FIELDS.items()}
    return f"""
local tag, env, queue = KEYS[1], ARGV[3], ARGV[4]
local t = redis.call('TIME')
local now = t[1] * 1000 + (t[2] - t[2] % 1000) / 1000
local id, payload = string.match(ARGV[7], '^([^ :]+) [^ ]* [^ ]* [^ ]* (.*)$')
if redis.call('EXISTS', tag .. ':e:' .. env .. ':{K.ENV_KEYS["config"]}') == 1 then
  return 'config'
end
redis.call('HSETEX', tag .. ':m:' .. env .. ':' .. id, 'FNX', 'FIELDS', 5,
  '{f["queue"]}', queue, '{f["payload"]}', payload, '{f["score"]}', now,
  '{f["enqueued_at"]}', now, '{f["state"]}', 'queued')
redis.call('ZADD', tag .. ':q:' .. env .. ':' .. queue .. ':{K.QUEUE_KEYS["queued"]}', now, id)
if redis.call('ZADD', tag .. ':{K.SHARD_KEYS["heads"]}', 'LT', 'CH', now,
    '{K.KIND_QUEUE}:' .. env .. ':' .. queue) == 1 then
  redis.call('PUBLISH', '{wake_channel}', 'work')
end
return '40 0 1'
"""


def floor_argv(rq: Any, env: Any, queue: str, run_id: str, payload: Any) -> list[Any]:
    """The floor script's ARGV for one keyless run: the enqueue script's own (context,
    env id, queue, schedule, tick, the run's one argument), encoded by the store."""
    from fairq.models import EnqueueRequest
    from fairq.store.enqueue import enqueue_args

    request = EnqueueRequest(env, queue, run_id, payload)
    args = enqueue_args(env, queue, [rq.encode_request(request)])
    argv: list[Any] = rq.script_argv("enqueue", "age", args, None)[1]
    return argv


async def _floor_client(n: int, url: str, pid: int) -> int:
    """``trigger_floor``: the ``trigger`` workload's runs, each one call of the floor
    script with the arguments the enqueue script gets, on fairq's script connection."""
    from fairq import Fairq

    app = Fairq(env="bench:instructions:run", url=url)
    rq = await app.queue()
    env, client = app.env, rq._script_client
    tag = rq.keys.tag_of(env, 0)
    sha = await rq.client.script_load(floor_script(rq.keys.wake_channel))

    def argv(run_id: str, i: int) -> list[Any]:
        return floor_argv(rq, env, "noop", run_id, {"i": i, "t": 0.0})

    for i in range(WARM_OPS * 10):
        await client.execute_command("EVALSHA", sha, 1, tag, *argv(f"w{i}", i))
    calls = [argv(f"r{i}", i) for i in range(n)]
    _instrument(pid, True)
    for args in calls:
        await client.execute_command("EVALSHA", sha, 1, tag, *args)
    _instrument(pid, False)
    if await rq.client.zcard(rq.keys.queue(env, "noop").queued) != WARM_OPS * 10 + n:
        raise SystemExit("the floor script did not queue every run")
    await app.aclose()
    return n


def _dramatiq_client(n: int, url: str, pid: int) -> int:
    """``dramatiq_send``: Dramatiq's ``send`` of one message per op to its Redis broker."""
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(url=url)
    actor = dramatiq.actor(_dramatiq_noop, broker=broker, actor_name="noop", max_retries=0)
    for i in range(WARM_OPS * 10):
        actor.send({"i": i, "t": 0.0})
    _instrument(pid, True)
    for i in range(n):
        actor.send({"i": i, "t": 0.0})
    _instrument(pid, False)
    broker.close()
    return n


async def _worker_drain_client(n: int, url: str, pid: int) -> int:
    """``worker_drain``: a fairq worker of 8 drains ``n`` queued runs, from its start."""
    from fairq import Fairq, RetryPolicy, Worker

    app = Fairq(env="bench:instructions:run", url=url)
    task = app.task(queue="noop", retry=RetryPolicy(max_attempts=1))(_noop)

    async def drain(runs: int, prefix: str, measured: bool) -> None:
        for i in range(runs):
            await task.trigger({"i": i, "t": 0.0}, run_id=f"{prefix}{i}")
        if measured:
            _instrument(pid, True)
        worker = Worker(app, concurrency=8)
        running = asyncio.create_task(worker.run())
        while worker.stats.completed < runs:  # noqa: ASYNC110 (its stats have no event)
            await asyncio.sleep(0.01)
        if measured:
            _instrument(pid, False)
        worker.stop()
        await running

    await drain(WARM_OPS * 10, "w", False)
    await drain(n, "r", True)
    await app.aclose()
    return n


def _dramatiq_drain_client(n: int, url: str, pid: int) -> int:
    """``dramatiq_drain``: a Dramatiq worker of 8 threads drains ``n`` sent messages, from
    its start."""
    import dramatiq
    from dramatiq import Worker
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(url=url)
    dramatiq.set_broker(broker)
    done: list[int] = []

    def count(payload: dict[str, Any]) -> None:
        done.append(1)

    actor = dramatiq.actor(count, broker=broker, actor_name="noop", max_retries=0)

    def drain(messages: int, measured: bool) -> None:
        done.clear()
        for i in range(messages):
            actor.send({"i": i, "t": 0.0})
        if measured:
            _instrument(pid, True)
        worker = Worker(broker, worker_threads=8)
        worker.start()
        while len(done) < messages:
            time.sleep(0.01)
        if measured:
            _instrument(pid, False)
        worker.stop()

    drain(WARM_OPS * 10, False)
    drain(n, True)
    broker.close()
    return n


# --------------------------------------------------------------------------- the server


def _wait_for(port: int, process: subprocess.Popen[bytes], limit_s: float = 120.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"valkey-server under callgrind exited ({process.returncode})")
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        time.sleep(0.1)
    raise SystemExit("valkey-server under callgrind did not answer")


def measure(source: Path, workload: str, n: int) -> dict[str, Any]:
    """Instructions per operation of ``workload`` with the fairq of ``source`` (a checkout)."""
    from fairq.server import EmbeddedServer, free_port

    port = free_port()
    with tempfile.TemporaryDirectory(prefix="fairq-instructions-") as work:
        out = os.path.join(work, "callgrind.out")
        # the embedded server's own command line (a scratch server), run under callgrind
        valkey = (
            EmbeddedServer(port=port, data_dir=Path(work)).command()
            + os.environ.get("EXTRA_SERVER_ARGS", "").split()
        )
        server = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no",
             f"--callgrind-out-file={out}", *valkey],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            _wait_for(port, server)
            env = dict(os.environ, PYTHONPATH=str(source / "src"))
            done = subprocess.run(
                [sys.executable, SCRIPT, "--client", workload, str(n), str(port), str(server.pid)],
                env=env, cwd=work, check=True, capture_output=True, text=True,
            )  # fmt: skip
            ops = int(done.stdout.strip().splitlines()[-1])
            with contextlib.suppress(Exception):
                import redis

                redis.Redis(port=port).shutdown(nosave=True)
            server.wait(timeout=300)
        finally:
            if server.poll() is None:
                server.kill()
        keep = os.environ.get("FAIRQ_CALLGRIND_KEEP")
        if keep:  # a directory to keep the profile in, for callgrind_annotate
            os.makedirs(keep, exist_ok=True)
            for path in glob.glob(out + "*"):
                shutil.copy(path, os.path.join(keep, f"{source.name}-{workload}.callgrind"))
        total = 0
        for path in glob.glob(out + "*"):
            with open(path) as f:
                for line in f:
                    if line.startswith(("totals:", "summary:")):
                        total = max(total, int(line.split()[1]))
    return {"ops": ops, "instructions_per_op": round(total / max(ops, 1))}


@contextlib.contextmanager
def worktree(ref: str) -> Iterator[Path]:
    """A temporary checkout of ``ref`` (removed afterwards)."""
    path = Path(tempfile.mkdtemp(prefix="fairq-ref-"))
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(path), ref],
        check=True,
        capture_output=True,
    )
    try:
        yield path
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
            capture_output=True,
        )
        shutil.rmtree(path, ignore_errors=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        workload, n, port, pid = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        print(asyncio.run(_client(workload, n, port, pid)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=DEFAULT_WORKLOADS)
    parser.add_argument("--n", type=int, default=2000, help="runs per workload")
    parser.add_argument("--against", help="a git ref to measure too (REF / this ratios)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("needs valgrind (callgrind): apt-get install valgrind")
    workloads = [w for w in args.workloads.split(",") if w]
    result: dict[str, Any] = {"n": args.n, "workloads": {}}
    with contextlib.ExitStack() as stack:
        sources = {"this": ROOT}
        if args.against:
            sources[args.against] = stack.enter_context(worktree(args.against))
        for workload in workloads:
            row = {name: measure(path, workload, args.n) for name, path in sources.items()}
            if args.against:
                ref = row[args.against]["instructions_per_op"]
                row["this_over_ref"] = round(row["this"]["instructions_per_op"] / ref, 4)
            result["workloads"][workload] = row
            print(workload, json.dumps(row), file=sys.stderr, flush=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
