"""Helpers of the fault suite: real ``fairq worker`` processes and their run ledgers.

A worker process runs ``python -m fairq worker faultapp:app`` (the real CLI entry point)
on an app module written into the test's directory. Its one task appends a line to a
per-process ledger file (``<pid>.log``, ``O_APPEND`` + ``os.write``: the line is in the
kernel when ``write`` returns, so a ``kill -9`` right after it loses nothing):

* ``S <run> <lease token>`` when the task starts a delivery,
* ``E <run> <lease token>`` when the task returns (before the worker acks).

The task returns its pid, kept as the run's result, so the store itself says which
process completed each run.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fairq.keys import Environment

APP_MODULE = """
import asyncio, os, pathlib
from fairq.app import Fairq
from fairq.config import RunQueueConfig
from fairq.worker import current_run

app = Fairq(os.environ["TEST_ENV"], config=RunQueueConfig.from_env())
LEDGER = pathlib.Path(os.environ["TEST_LEDGER"])
FAST = LEDGER / "fast"
_fd = None


def _write(line):
    global _fd
    if _fd is None:
        path = LEDGER / f"{os.getpid()}.log"
        _fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.write(_fd, line.encode())


@app.task(queue="work", keep_result=True)
async def work(payload):
    run = current_run()
    _write(f"S {run.run_id} {run.lease_token}\\n")
    if not FAST.exists():
        await asyncio.sleep(payload.get("ms", 0) / 1000)
    _write(f"E {run.run_id} {run.lease_token}\\n")
    return os.getpid()
"""


@dataclass(frozen=True, slots=True)
class Delivery:
    """One delivery of a run as its task saw it."""

    pid: int
    token: int
    ended: bool


@dataclass(slots=True)
class WorkerPool:
    """Worker processes of one app module, started and killed by the test."""

    directory: Path
    redis_url: str
    prefix: str
    env: Environment
    lease_ms: int
    concurrency: int = 4
    #: The app module the workers run (``faultapp.py``).
    app_source: str = APP_MODULE
    #: More environment variables of the worker processes.
    extra_env: dict[str, str] = field(default_factory=dict)
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    #: Each process's log file, by pid.
    logs: dict[int, Path] = field(default_factory=dict)
    killed: set[int] = field(default_factory=set)
    spawned: int = 0

    def __post_init__(self) -> None:
        (self.directory / "ledger").mkdir(parents=True, exist_ok=True)
        (self.directory / "logs").mkdir(exist_ok=True)
        (self.directory / "faultapp.py").write_text(self.app_source)

    @property
    def ledger(self) -> Path:
        return self.directory / "ledger"

    def spawn(self) -> int:
        """Start one worker process; returns its pid."""
        environ = {
            **os.environ,
            "FAIRQ_REDIS_URL": self.redis_url,
            "FAIRQ_PREFIX": self.prefix,
            "FAIRQ_LEASE_MS": str(self.lease_ms),
            "TEST_ENV": self.env.id,
            "TEST_LEDGER": str(self.ledger),
            **self.extra_env,
        }
        log_path = self.directory / "logs" / f"w{self.spawned}.log"
        log = open(log_path, "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "fairq", "worker", "faultapp:app",
             "--concurrency", str(self.concurrency), "--grace", "5"],
            cwd=self.directory, env=environ, stdout=log, stderr=log,
        )  # fmt: skip
        log.close()
        self.spawned += 1
        self.procs[proc.pid] = proc
        self.logs[proc.pid] = log_path
        return proc.pid

    def has_run(self, pid: int) -> bool:
        """Whether the process has started at least one task (it is connected and busy)."""
        return (self.ledger / f"{pid}.log").exists()

    def kill(self, pid: int) -> float:
        """``kill -9`` one worker and reap it; when it died (``time.time()``)."""
        proc = self.procs.pop(pid)
        proc.kill()
        proc.wait(10)
        self.killed.add(pid)
        return time.time()

    def log_text(self) -> str:
        """What every worker process wrote to its log so far."""
        return "".join(p.read_text(errors="replace") for p in (self.directory / "logs").glob("*"))

    def started(self, pid: int) -> bool:
        """Whether the process is up (it said so): a SIGTERM now stops it gracefully,
        where one during the interpreter's start kills it."""
        path = self.logs.get(pid)
        return path is not None and "fairq worker:" in path.read_text(errors="replace")

    def stop_all(self, timeout: float = 20.0) -> dict[int, int]:
        """SIGTERM every live worker once it is up (at most ``timeout`` s), wait for it
        (kill on timeout); pid -> return code."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not all(
            self.started(pid) for pid, proc in self.procs.items() if proc.poll() is None
        ):
            time.sleep(0.05)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        codes: dict[int, int] = {}
        deadline = time.monotonic() + timeout
        for pid, proc in self.procs.items():
            try:
                codes[pid] = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[pid] = proc.wait(10)
        self.procs.clear()
        return codes

    def deliveries(self) -> dict[str, list[Delivery]]:
        """Every logged delivery per run, by lease token."""
        starts: dict[tuple[str, int], int] = {}
        ends: set[tuple[str, int]] = set()
        for path in self.ledger.glob("*.log"):
            pid = int(path.stem)
            for line in path.read_text().splitlines():
                kind, run_id, token = line.split(" ")
                if kind == "S":
                    assert (run_id, int(token)) not in starts, f"token {token} of {run_id} twice"
                    starts[(run_id, int(token))] = pid
                else:
                    ends.add((run_id, int(token)))
        out: dict[str, list[Delivery]] = {}
        for (run_id, token), pid in sorted(starts.items(), key=lambda kv: kv[0]):
            out.setdefault(run_id, []).append(Delivery(pid, token, (run_id, token) in ends))
        return out


async def eventually(check: Callable[[], object], within: float, what: str) -> float:
    """Poll an async or plain check until truthy, within ``within`` s; returns the wait."""
    start = time.monotonic()
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return time.monotonic() - start
        if time.monotonic() - start > within:
            raise AssertionError(f"{what}: not within {within}s")
        await asyncio.sleep(0.05)


async def drained(rq: Any, env: Environment, queue: str = "work") -> bool:
    """Whether ``queue`` has nothing queued and nothing running."""
    stats = await rq.queue_stats(env, queue)
    return bool(stats.queued == 0 and stats.running == 0)
