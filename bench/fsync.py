"""What ``FAIRQ_FSYNC=always`` costs: enqueue-like write throughput with ``appendfsync
always`` vs ``everysec`` on the embedded server.

Two embedded servers (append-only file on, one per policy, each on its own unix socket and
data directory) receive the same workload; repetitions alternate between them (A B, B A,
...) so drift in the machine's load hits both alike. Each enqueue writes what a queued run
needs: an ``HSET`` of a small JSON payload and a ``ZADD`` into a queue. Two shapes:

* ``one_by_one``: one enqueue per round trip (``MULTI`` of the two commands), the
  worst case for ``always`` (one fsync per enqueue);
* ``pipelined``: ``--batch`` enqueues per round trip, as ``enqueue_many`` does
  (the server fsyncs once per batch).

Prints one JSON document: enqueues/s per policy (median of the repetitions, and each
run), and the ratio ``everysec / always``. The data directories go under ``--dir`` (default
the system temporary directory): on tmpfs fsync is free and the ratio means nothing, so
the file system type is reported too.

Usage::

    python bench/fsync.py
    python bench/fsync.py --reps 7 --enqueues 4000 --dir ~/.local/state
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from fairq.server import EmbeddedServer

POLICIES = ("always", "everysec")


def filesystem_of(path: Path) -> str:
    """The type of the file system holding ``path`` (from /proc/self/mounts)."""
    best, kind = "", "unknown"
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return kind
    target = str(path.resolve())
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = fields[1]
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) > len(best):
            best, kind = mount, fields[2]
    return kind


def payload(i: int) -> str:
    return json.dumps({"to": f"user{i}@example.com", "template": "welcome", "n": i, "x": "." * 64})


def run_once(client: redis.Redis, tag: str, enqueues: int, batch: int) -> float:
    """Enqueues per second for ``enqueues`` enqueues, ``batch`` per round trip."""
    started = time.perf_counter()
    for first in range(0, enqueues, batch):
        pipe = client.pipeline(transaction=True)
        for i in range(first, min(first + batch, enqueues)):
            run = f"{tag}:{i}"
            pipe.hset(f"run:{run}", mapping={"payload": payload(i), "status": "queued"})
            pipe.zadd(f"queue:{tag}", {run: float(i)})
        pipe.execute()
    return enqueues / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="repetitions per policy and shape")
    parser.add_argument("--enqueues", type=int, default=2000, help="enqueues per repetition")
    parser.add_argument("--batch", type=int, default=50, help="enqueues per pipelined call")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()
    if args.reps < 1 or args.enqueues < 1 or args.batch < 1:
        parser.error("--reps, --enqueues and --batch must be positive")

    base = Path(tempfile.mkdtemp(prefix="fqfs", dir=args.dir))
    servers = {
        policy: EmbeddedServer(
            unix_socket=base / f"{policy}.sock",
            data_dir=base / policy,
            appendonly=True,
            appendfsync=policy,
        )
        for policy in POLICIES
    }
    shapes = {"one_by_one": 1, "pipelined": args.batch}
    runs: dict[str, dict[str, list[float]]] = {s: {p: [] for p in POLICIES} for s in shapes}
    try:
        for server in servers.values():
            server.start()
        clients = {p: redis.Redis.from_url(s.url) for p, s in servers.items()}
        for policy, client in clients.items():  # warm up: connections, first AOF writes
            run_once(client, f"warm-{policy}", 200, args.batch)
        for rep in range(args.reps):
            order = POLICIES if rep % 2 == 0 else tuple(reversed(POLICIES))
            for shape, batch in shapes.items():
                for policy in order:
                    ops = run_once(clients[policy], f"{shape}-{rep}", args.enqueues, batch)
                    runs[shape][policy].append(ops)
        for client in clients.values():
            client.close()
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(base, ignore_errors=True)

    report: dict[str, Any] = {
        "filesystem": filesystem_of(args.dir),
        "cpus": os.cpu_count(),
        "reps": args.reps,
        "enqueues_per_rep": args.enqueues,
        "batch": args.batch,
        "commands_per_enqueue": ["HSET", "ZADD"],
    }
    for shape in shapes:
        medians = {p: statistics.median(runs[shape][p]) for p in POLICIES}
        report[shape] = {
            **{
                p: {
                    "median_enqueues_per_s": round(medians[p]),
                    "runs": [round(x) for x in runs[shape][p]],
                }
                for p in POLICIES
            },
            "ratio_everysec_over_always": round(medians["everysec"] / medians["always"], 2),
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
