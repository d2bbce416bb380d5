"""A fault-suite app whose task logs each delivery with its wall-clock time and key.

Like :data:`tests.faults._procs.APP_MODULE`, but the ledger lines are
``S|E <run> <lease token> <time.time()> <key>``, and a payload may ask the attempt to
fail (``{"fail_below": n}``: attempts before n raise), so that limits, rates and cancels
can be checked against what ran when.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TIMED_APP = """
import asyncio, os, pathlib, time
from fairq.app import Fairq
from fairq.config import RetryPolicy, RunQueueConfig
from fairq.worker import current_run

app = Fairq(os.environ["TEST_ENV"], config=RunQueueConfig.from_env())
LEDGER = pathlib.Path(os.environ["TEST_LEDGER"])
_fd = None


def _write(kind, run):
    global _fd
    if _fd is None:
        path = LEDGER / f"{os.getpid()}.log"
        _fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    line = f"{kind} {run.run_id} {run.lease_token} {time.time():.6f} {run.concurrency_key}\\n"
    os.write(_fd, line.encode())


@app.task(queue="work", keep_result=True,
          retry=RetryPolicy(max_attempts=3, min_delay_ms=10, max_delay_ms=10, randomize=False))
async def work(payload):
    run = current_run()
    _write("S", run)
    try:
        await asyncio.sleep(payload.get("ms", 0) / 1000)
        if run.attempt < payload.get("fail_below", 0):
            raise RuntimeError("this attempt fails")
    finally:
        _write("E", run)
    return os.getpid()
"""


@dataclass(frozen=True, slots=True)
class Span:
    """One delivery as its task logged it: when it began and ended (None: its process
    was killed first)."""

    run_id: str
    token: int
    pid: int
    key: str
    start: float
    end: float | None


def spans(ledger: Path) -> list[Span]:
    """Every delivery of the ledger directory, in start order."""
    starts: dict[tuple[str, int], tuple[int, str, float]] = {}
    ends: dict[tuple[str, int], float] = {}
    for path in ledger.glob("*.log"):
        pid = int(path.stem)
        for line in path.read_text().splitlines():
            kind, run_id, token, at, key = line.split(" ")
            if kind == "S":
                starts[(run_id, int(token))] = (pid, key, float(at))
            else:
                ends[(run_id, int(token))] = float(at)
    out = [
        Span(run, token, pid, key, at, ends.get((run, token)))
        for (run, token), (pid, key, at) in starts.items()
    ]
    return sorted(out, key=lambda s: s.start)


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The most intervals that overlap at one moment (one ending as another begins at the
    same instant do not overlap)."""
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most
