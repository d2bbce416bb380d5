"""Flag off runs the age-order builds, which never touch the fair order.

* Every operation of a RunQueue whose queues all use the age order runs the age-order
  build of each order-dependent script (observed on a real workload, not by name), and
  creates no fair-order key at all; with the fair order on, those operations run the
  fair build.
* The age-order builds' code never mentions virtual time or a fair-order key: their
  generated key schema does not even name them.
* Their SHA1s are pinned in ``flag_off_script_shas.json``. A deliberate change to an
  age-order script (or to an include it uses) must regenerate that file:
  ``FAIRQ_REGENERATE_SCRIPT_SHAS=1 pytest tests/integration/test_flag_off_scripts.py``
  and the diff then shows exactly which scripts changed.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from tests.state import fair_keys

from fairq import keys as K
from fairq.keys import Environment
from fairq.store import RunQueue
from fairq.store.scripts import Order, Script, ScriptRegistry, registry

GOLDEN = Path(__file__).with_name("flag_off_script_shas.json")
REGENERATE = "FAIRQ_REGENERATE_SCRIPT_SHAS"
QUEUE = "jobs"
T0 = 1_000_000

#: Fair-order key suffixes that must never appear in an age-order build.
FAIR_SUFFIXES = {
    suffix
    for table in (K.SHARD_KEYS, K.ENV_KEYS, K.QUEUE_KEYS)
    for attr, suffix in table.items()
    if attr in K.FAIR_ORDER_KEYS
}


#: Order-less scripts that name the weights: the admin script that sets them, and the
#: backlog sample that reads them to say what each tenant is owed (it writes only the
#: shares record, whatever the order).
WEIGHT_SCRIPTS = frozenset({"configure", "sample_shares"})


def flag_off_scripts() -> dict[str, Script]:
    """Every build a process with the fair order off runs: age builds and order-less
    scripts (except the ones that name the weights)."""
    return {
        s.name: s
        for s in registry().all()
        if s.order != "fair" and s.operation not in WEIGHT_SCRIPTS
    }


def lua_code(source: str) -> str:
    """The source without Lua comments (block comments first, then line comments)."""
    source = re.sub(r"--\[\[.*?\]\]", "", source, flags=re.DOTALL)
    return re.sub(r"--[^\n]*", "", source)


class _Recorder:
    """Stands in for the registry on one RunQueue and records the builds it hands out."""

    def __init__(self) -> None:
        self.used: set[tuple[str, str | None]] = set()
        self.real: ScriptRegistry = registry()

    def get(self, operation: str, order: Order) -> Script:
        script = self.real.get(operation, order)
        self.used.add((operation, script.order))
        return script

    def has_order(self, operation: str) -> bool:
        return self.real.has_order(operation)

    def all(self) -> list[Script]:
        return self.real.all()


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
    await rq.ack(await rq.dequeue_from_queue(env, QUEUE, keyed=True, now_ms=now), now_ms=now)
    await rq.enqueue(env, QUEUE, "cancelled", None, concurrency_key="ck9", now_ms=now)
    await rq.cancel(env, "cancelled", now_ms=now)
    await rq.expire_ttl(now_ms=now + 100)
    await rq.dequeue_from_queue(env, QUEUE, keyed=False, max_count=10, now_ms=now + 100)
    await rq.dequeue(10, now_ms=now + 100, lease_ms=100)
    await rq.reclaim_lapsed_leases(now_ms=now + 10_000)
    await rq.client.delete(rq.keys.queue(env, QUEUE).ck_queued_counter)
    await rq.queue_stats(env, QUEUE, breakdown=True)


ORDERED = {"enqueue", "dequeue", "ack", "nack", "redrive", "expire_ttl", "reclaim", "cancel"}


async def test_flag_off_operations_only_run_age_order_builds(
    make_queue: Any, env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    recorder = _Recorder()
    rq._scripts = recorder  # type: ignore[assignment]
    await _every_operation(rq, env)
    assert recorder.used, "the workload ran scripts"
    assert not {order for _, order in recorder.used} & {"fair"}
    assert {(op, "age") for op in ORDERED} <= recorder.used
    assert await fair_keys(rq) == []


async def test_flag_on_runs_the_fair_builds(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue(vtime={"enabled": True})
    recorder = _Recorder()
    rq._scripts = recorder  # type: ignore[assignment]
    await _every_operation(rq, env)
    assert {(op, "fair") for op in ORDERED} <= recorder.used
    assert not {(op, "age") for op in ORDERED} & recorder.used


async def test_an_age_build_meeting_a_fair_queue_refuses_and_the_fair_build_takes_over(
    make_queue: Any, env: Environment
) -> None:
    """The order lives on the server: a process whose default is the age order still
    serves a queue set to fair in the fair order (its age build refused, writing nothing)."""
    rq: RunQueue = await make_queue()
    await rq.set_queue_options(env, QUEUE, order="fair")
    recorder = _Recorder()
    rq._scripts = recorder  # type: ignore[assignment]
    await rq.enqueue(env, QUEUE, "a1", None, concurrency_key="a", now_ms=T0)
    assert ("enqueue", "age") in recorder.used and ("enqueue", "fair") in recorder.used
    assert await fair_keys(rq) != []


def test_age_order_build_code_never_touches_the_fair_order() -> None:
    for name, script in flag_off_scripts().items():
        code = lua_code(script.source).lower()
        assert "vtime" not in code and "virtual" not in code, name
        for suffix in FAIR_SUFFIXES:
            assert f"'{suffix}'" not in script.source, (name, suffix)
        for builder in ("tenant_key(", "tenant_floor(", "park_pair("):
            assert builder not in code, (name, builder)


def test_flag_off_script_shas_match_the_golden_file() -> None:
    current = {name: s.sha for name, s in sorted(flag_off_scripts().items())}
    if os.environ.get(REGENERATE) == "1":
        GOLDEN.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")
    golden = json.loads(GOLDEN.read_text())
    changed = sorted(n for n in current.keys() | golden.keys() if current.get(n) != golden.get(n))
    assert not changed, (
        f"flag-off scripts changed: {changed}. If deliberate, regenerate with {REGENERATE}=1"
    )
