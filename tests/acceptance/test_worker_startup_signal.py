"""``fairq worker``: a SIGTERM that arrives while the worker still starts up (importing the
app, reaching the server) stops it gracefully: exit status 0, no run taken. Before, the
signal's default action killed it (status -15), which a supervisor reported as a failed
child and a deploy as a crash.

The app module blocks its import until the test has sent the signal (it waits for a file
the test writes afterwards), so the signal lands during start-up on every run, with no
timing guesswork.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fairq.keys import Environment
from fairq.store import RunQueue

APP_MODULE = """
import os, pathlib, time
from fairq import Fairq

GATE = pathlib.Path(os.environ["TEST_GATE"])
(GATE.parent / "importing").touch()
while not GATE.exists():  # the test sends SIGTERM, then opens the gate
    time.sleep(0.01)

app = Fairq(os.environ["TEST_ENV"])


@app.task(queue="startup")
async def startup(payload):
    (GATE.parent / "ran").touch()
"""


def wait_for(path: Path, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} did not appear in time"
        time.sleep(0.02)


async def test_a_sigterm_during_start_up_stops_the_worker_gracefully(
    tmp_path: Path, make_queue: object, redis_url: str, prefix: str, env: Environment
) -> None:
    rq: RunQueue = await make_queue()  # type: ignore[operator]
    await rq.enqueue(env, "startup", "r1", {})
    (tmp_path / "gateapp.py").write_text(APP_MODULE)
    gate = tmp_path / "gate"
    environ = {**os.environ, "FAIRQ_REDIS_URL": redis_url, "FAIRQ_PREFIX": prefix,
               "TEST_ENV": env.id, "TEST_GATE": str(gate)}  # fmt: skip
    proc = await asyncio.to_thread(
        subprocess.Popen,
        [sys.executable, "-m", "fairq", "worker", "gateapp:app", "--grace", "5"],
        cwd=tmp_path, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # Given a worker still importing its app
        await asyncio.to_thread(wait_for, tmp_path / "importing")
        # When it is asked to stop then, and its start-up goes on
        proc.send_signal(signal.SIGTERM)
        gate.touch()
        out, err = await asyncio.to_thread(proc.communicate, timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    # Then it exits cleanly, having taken no run
    assert proc.returncode == 0, (proc.returncode, out, err)
    assert not (tmp_path / "ran").exists()
    stats = await rq.queue_stats(env, "startup")
    assert (stats.queued, stats.running) == (1, 0)
