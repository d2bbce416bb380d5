"""One bad value never stops a real worker process.

* A schedule whose every tick fails (built by hand, past ``app.schedule``'s checks)
  beside a good one: the good one ticks every second all along, and the failure is
  logged.
* A long run (four leases long) whose task reports progress notes that are not valid
  Unicode, through ``progress()`` (refused) and straight into the worker's notes (dropped
  by the heartbeat): the run keeps its one lease to the end, and another run beside it
  too.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.faults._procs import WorkerPool, eventually

from fairq.keys import Environment
from fairq.models import EnqueueRequest
from fairq.outcomes import RunStatus
from fairq.store import RunQueue

SCHEDULES_APP = """
import os, pathlib
from fairq.app import Fairq, Schedule
from fairq.config import RunQueueConfig

app = Fairq(os.environ["TEST_ENV"], config=RunQueueConfig.from_env())
LEDGER = pathlib.Path(os.environ["TEST_LEDGER"])


@app.task(queue="tick")
async def tick(payload):
    with open(LEDGER / "ticks.log", "a") as f:
        f.write(f"{payload['n']}\\n")


# sorts first, so that a pass that stopped at it would claim nothing after it
app.schedules["a-bad"] = Schedule(name="a-bad", task=tick, every_ms=1000, payload=float("nan"))
app.schedule(tick, every=1, name="b-good", payload={"n": 1})
"""

NOTES_APP = """
import asyncio, os, pathlib
from fairq.app import Fairq
from fairq.config import RunQueueConfig
from fairq.errors import ConfigurationError
from fairq.worker import current_run

app = Fairq(os.environ["TEST_ENV"], config=RunQueueConfig.from_env())
LEDGER = pathlib.Path(os.environ["TEST_LEDGER"])


@app.task(queue="long", keep_result=True)
async def long(payload):
    run = current_run()
    with open(LEDGER / f"{run.run_id}.tokens", "a") as f:
        f.write(f"{run.lease_token}\\n")
    refused = 0
    for _ in range(payload["steps"]):
        if payload["bad"]:
            try:
                run.progress(0.5, "reading \\udcff.csv")
            except ConfigurationError:
                refused += 1
            run._progress[run.run_id] = (0.5, "bad \\ud800 note")  # past the check
        await asyncio.sleep(0.1)
    return refused
"""

LEASE_MS = 1500


async def test_a_bad_schedule_beside_a_good_one_in_a_worker_process(
    make_queue: Any, redis_url: str, prefix: str, env: Environment, tmp_path: Path
) -> None:
    await make_queue()
    pool = WorkerPool(tmp_path, redis_url, prefix, env, LEASE_MS, concurrency=2,
                      app_source=SCHEDULES_APP)  # fmt: skip
    ticks = pool.ledger / "ticks.log"
    try:
        pool.spawn()

        def ticked(n: int) -> bool:
            return ticks.exists() and len(ticks.read_text().split()) >= n

        await eventually(lambda: ticked(1), 20, "the good schedule ticks")
        waited = await eventually(lambda: ticked(6), 15, "the good schedule goes on ticking")
        codes = pool.stop_all()
    finally:
        pool.stop_all()
    assert all(code == 0 for code in codes.values()), codes
    assert waited < 9  # about one tick a second after the first
    assert "schedule 'a-bad'" in pool.log_text()


async def test_bad_progress_notes_in_a_long_run_leave_its_lease_alone(
    make_queue: Any, redis_url: str, prefix: str, env: Environment, tmp_path: Path
) -> None:
    rq: RunQueue = await make_queue(lease_ms=LEASE_MS)
    steps = 4 * LEASE_MS // 100  # the run lasts four leases
    await rq.enqueue_many([
        EnqueueRequest(env, "long", "noisy", {"steps": steps, "bad": True}),
        EnqueueRequest(env, "long", "quiet", {"steps": steps, "bad": False}),
    ])  # fmt: skip
    pool = WorkerPool(tmp_path, redis_url, prefix, env, LEASE_MS, concurrency=2,
                      app_source=NOTES_APP)  # fmt: skip
    try:
        pool.spawn()

        async def done() -> bool:
            infos = await asyncio.gather(rq.get_run(env, "noisy"), rq.get_run(env, "quiet"))
            return all(i is not None and i.status.finished for i in infos)

        await eventually(done, 40, "both runs finish")
        codes = pool.stop_all()
    finally:
        pool.stop_all()
    assert all(code == 0 for code in codes.values()), codes
    noisy, quiet = await rq.get_run(env, "noisy"), await rq.get_run(env, "quiet")
    assert noisy is not None and quiet is not None
    assert (noisy.status, noisy.result) == (RunStatus.COMPLETED, steps)  # every note refused
    assert quiet.status is RunStatus.COMPLETED
    for run_id in ("noisy", "quiet"):  # one delivery each: the leases never lapsed
        assert (pool.ledger / f"{run_id}.tokens").read_text().split() == ["1"]
    assert "progress note dropped" in pool.log_text()
