"""Flag off runs exactly the scripts that ran before the fair order existed.

* Every operation of a flag-off RunQueue resolves to a script without the ``_vtime``
  suffix (observed on a real workload, not just by name), and a flag-on RunQueue uses
  the twins exactly for the operations that change a variant's membership.
* The flag-off scripts' code (comments stripped) never mentions virtual time, and their
  full text never names a virtual-time key.
* Their SHA1s are pinned in ``flag_off_script_shas.json``. A deliberate change to a
  flag-off script (or to an include it uses) must regenerate that file:
  ``FAIRQ_REGENERATE_SCRIPT_SHAS=1 pytest tests/integration/test_flag_off_scripts.py``
  and the diff then shows exactly which flag-off scripts changed.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from fairq.keys import Environment
from fairq.scripts import VTIME_SCRIPTS, Script, registry
from fairq.store import RunQueue

GOLDEN = Path(__file__).with_name("flag_off_script_shas.json")
REGENERATE = "FAIRQ_REGENERATE_SCRIPT_SHAS"
QUEUE = "jobs"
T0 = 1_000_000


def flag_off_scripts() -> dict[str, Script]:
    return {s.name: s for s in registry().all() if s.name not in VTIME_SCRIPTS}


def lua_code(source: str) -> str:
    """The source without Lua comments (block comments first, then line comments)."""
    source = re.sub(r"--\[\[.*?\]\]", "", source, flags=re.DOTALL)
    return re.sub(r"--[^\n]*", "", source)


class _Recorder:
    """Stands in for the registry on one RunQueue and records the scripts it hands out."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def __getitem__(self, name: str) -> Script:
        self.used.add(name)
        return registry()[name]

    def all(self) -> list[Script]:
        return registry().all()


async def _every_operation(rq: RunQueue, env: Environment) -> None:
    now = T0
    await rq.enqueue(env, QUEUE, "plain", None, now_ms=now, ttl_ms=10)
    for i in range(4):
        await rq.enqueue(env, QUEUE, f"k{i}", None, concurrency_key=f"ck{i % 2}", now_ms=now)
    keyed = await rq.dequeue_from_queue(env, QUEUE, keyed=True, max_count=10, now_ms=now)
    await rq.heartbeat(keyed, now_ms=now)
    await rq.release(keyed[:1], now_ms=now)
    await rq.nack(keyed[0], retry_at_ms=now, now_ms=now)
    await rq.nack(keyed[1], max_attempts=1, now_ms=now)  # dead-letters it
    await rq.ack(keyed[2:], now_ms=now)
    await rq.redrive(env, keyed[1].run_id, now_ms=now)
    await rq.enqueue(env, QUEUE, "cancelled", None, concurrency_key="ck9", now_ms=now)
    await rq.cancel(env, "cancelled", now_ms=now)
    await rq.expire_ttl(now_ms=now + 100)
    await rq.dequeue_from_queue(env, QUEUE, keyed=False, max_count=10, now_ms=now + 100)
    await rq.dequeue(10, now_ms=now + 100, lease_ms=100)
    await rq.reclaim_lapsed_leases(now_ms=now + 10_000)
    await rq.client.delete(rq.keys.queue(env, QUEUE).ck_queued_counter)
    await rq.queue_stats(env, QUEUE, breakdown=True)


async def test_flag_off_operations_only_resolve_to_pre_existing_scripts(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    recorder = _Recorder()
    rq._scripts = recorder  # type: ignore[assignment]
    await _every_operation(rq, env)
    assert recorder.used, "the workload ran scripts"
    assert not recorder.used & VTIME_SCRIPTS
    assert {
        "enqueue",
        "dequeue_ck",
        "nack",
        "redrive",
        "expire_ttl",
        "reclaim",
        "cancel",
    } <= recorder.used


async def test_flag_on_uses_the_twins_for_membership_changes(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue(vtime={"enabled": True})
    recorder = _Recorder()
    rq._scripts = recorder  # type: ignore[assignment]
    await _every_operation(rq, env)
    twins = {"enqueue", "dequeue_ck", "nack", "redrive", "expire_ttl", "reclaim", "cancel"}
    assert {f"{t}_vtime" for t in twins} <= recorder.used
    assert not recorder.used & twins


def test_flag_off_script_code_never_touches_virtual_time() -> None:
    for name, script in flag_off_scripts().items():
        assert "vtime" not in lua_code(script.source).lower(), name
        for suffix in (":vtime", ":vfloor", ":vidle", ":ckweights"):
            assert suffix not in script.source, (name, suffix)


def test_flag_off_script_shas_match_the_golden_file() -> None:
    current = {name: s.sha for name, s in sorted(flag_off_scripts().items())}
    if os.environ.get(REGENERATE) == "1":
        GOLDEN.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")
    golden = json.loads(GOLDEN.read_text())
    changed = sorted(n for n in current.keys() | golden.keys() if current.get(n) != golden.get(n))
    assert not changed, (
        f"flag-off scripts changed: {changed}. If deliberate, regenerate with {REGENERATE}=1"
    )
