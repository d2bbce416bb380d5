"""``fairq worker --processes N``: the supervisor restarts a child that dies and stops
every child gracefully on SIGTERM (the real entry point, real processes)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fairq.app import Fairq
from fairq.config import RunQueueConfig
from fairq.keys import Environment
from fairq.outcomes import RunStatus

APP_MODULE = """
import asyncio, os, pathlib
from fairq import Fairq

app = Fairq(os.environ["TEST_ENV"])
MARKS = pathlib.Path(os.environ["TEST_MARKS"])


@app.task(queue="supervised")
async def supervised(payload):
    (MARKS / f"{payload['n']}.{os.getpid()}.started").touch()
    await asyncio.sleep(payload["seconds"])
    return payload["n"]
"""


def children(pid: int) -> set[int]:
    """The live child processes of ``pid`` (Linux /proc)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found |= {int(c) for c in text}
    return found


def gone(pid: int) -> bool:
    """Whether a process exited (reaped, or a zombie waiting for its parent)."""
    status = Path(f"/proc/{pid}/status")
    return not status.exists() or "zombie" in status.read_text()


def wait_for(check: object, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


async def test_the_supervisor_restarts_a_killed_child_and_stops_all_gracefully(
    tmp_path: Path, redis_url: str, prefix: str, env: Environment
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    (tmp_path / "supapp.py").write_text(APP_MODULE)
    environ = {**os.environ, "FAIRQ_REDIS_URL": redis_url, "FAIRQ_PREFIX": prefix,
               "TEST_ENV": env.id, "TEST_MARKS": str(marks)}  # fmt: skip
    proc = await asyncio.to_thread(
        subprocess.Popen,
        [sys.executable, "-m", "fairq", "worker", "supapp:app", "--processes", "2",
         "--concurrency", "2", "--grace", "20"],
        cwd=tmp_path, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    client = Fairq(env, url=redis_url, config=RunQueueConfig(prefix=prefix))
    task = client.task(queue="supervised")(lambda payload: None)
    try:
        await asyncio.to_thread(wait_for, lambda: len(children(proc.pid)) == 2)
        first = children(proc.pid)
        victim = min(first)
        # When one child is killed outright
        os.kill(victim, signal.SIGKILL)
        # Then the supervisor starts another in its place
        await asyncio.to_thread(
            wait_for, lambda: len(children(proc.pid)) == 2 and victim not in children(proc.pid)
        )
        workers = children(proc.pid)
        assert len(workers & first) == 1

        # Given four runs in flight over both children and four more queued
        handles = [await task.trigger({"n": n, "seconds": 1.0}) for n in range(8)]
        await asyncio.to_thread(wait_for, lambda: len(list(marks.glob("*.started"))) >= 4)
        # When the supervisor gets SIGTERM
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.to_thread(proc.communicate, timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    # Then every child finished its in-flight runs and exited, and no run was lost
    assert proc.returncode == 0, stderr
    assert "restarting in" in stderr and "1 restart(s)" in stderr
    assert stderr.count("fairq worker stopped:") == 2
    started = {int(p.name.split(".")[0]) for p in marks.glob("*.started")}
    runners = {int(p.name.split(".")[1]) for p in marks.glob("*.started")}
    assert runners <= workers  # the replacement child ran runs too, or the other one
    statuses = {}
    for h in handles:
        info = await h.info()
        statuses[h.run_id] = RunStatus.COMPLETED if info is None else info.status
    done = [n for n, h in enumerate(handles) if statuses[h.run_id] is RunStatus.COMPLETED]
    assert set(done) == started  # every run that started completed
    assert all(
        statuses[h.run_id] is RunStatus.QUEUED for n, h in enumerate(handles) if n not in started
    )
    assert all(gone(pid) for pid in workers)
    await client.aclose()
