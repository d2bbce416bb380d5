"""Operating fairq from the command line: every scheduling option, caps and weights,
runs in detail, dead letters with their tracebacks, --json, unknown names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from fairq.keys import Environment
from fairq.outcomes import RunStatus
from fairq.store import RunQueue

TRACEBACK = "Traceback (most recent call last):\n  File \"job.py\", line 3\nKeyError: 'sku'\n"


@pytest.fixture
def cli(redis_url: str, prefix: str) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        environ = {**os.environ, "FAIRQ_REDIS_URL": redis_url, "FAIRQ_PREFIX": prefix,
                   "COLUMNS": "200"}  # fmt: skip
        done = subprocess.run([sys.executable, "-m", "fairq", *args], env=environ,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        if ok:
            assert done.returncode == 0, done.stderr + done.stdout
        return done

    return run


async def test_limits_set_every_option_caps_and_weights(
    cli: Callable[..., Any], make_queue: Callable[..., Any], env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "emails", "e1", {}, concurrency_key="k1", tenant="acme")
    cli("limits", "set", env.id, "emails", "--order", "fair", "--max-per-key", "2",
        "--quantum", "2.5", "--window", "4", "--join", "behind_leader", "--charge", "duration",
        "--arrival-cap", "3")  # fmt: skip
    cli("limits", "key-cap", env.id, "emails", "k1", "3")
    cli("limits", "tenant-cap", env.id, "emails", "acme", "5")
    cli("limits", "weight", env.id, "emails", "k1", "2")
    cli("limits", "weight", env.id, "--tenant", "acme", "4")

    data = json.loads(cli("limits", "get", env.id, "emails", "--json").stdout)
    (q,) = data["queues"]
    assert {k: q[k] for k in ("order", "max_per_key", "quantum", "window", "join", "charge",
                              "arrival_cap")} == {
        "order": "fair", "max_per_key": 2, "quantum": 2.5, "window": 4, "join": "behind_leader",
        "charge": "duration", "arrival_cap": 3.0,
    }  # fmt: skip
    assert q["keys"] == [{"key": "k1", "tenant": "acme", "cap": 3, "weight": 2.0}]
    stats = await rq.queue_stats(env, "emails")
    assert (stats.order, stats.quantum, stats.window, stats.join) == (
        "fair",
        2.5,
        4,
        "behind_leader",
    )
    table = cli("limits", "get", env.id, "emails").stdout
    assert "2.5/4/behind_leader" in table and "duration" in table
    # a bad value changes nothing; 'none' clears only what it names
    bad = cli("limits", "set", env.id, "emails", "--window", "0", "--order", "age", ok=False)
    assert bad.returncode == 1 and "window" in bad.stderr
    assert (await rq.queue_stats(env, "emails")).order == "fair"
    cli("limits", "key-cap", env.id, "emails", "k1", "none")
    cli("limits", "set", env.id, "emails", "--quantum", "none")
    after = json.loads(cli("limits", "get", env.id, "emails", "--json").stdout)["queues"][0]
    assert (after["quantum"], after["window"], after["keys"][0]["cap"]) == (1.0, 4, None)


async def test_runs_show_recent_and_dead_letters_with_tracebacks(
    cli: Callable[..., Any], make_queue: Callable[..., Any], env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "orders", "bad", {"sku": None}, concurrency_key="shop-1")
    (d,) = await rq.dequeue_from_queue(env, "orders", keyed=True, max_count=1)
    await rq.nack(d, max_attempts=1, error="KeyError: 'sku'", traceback=TRACEBACK)
    await rq.enqueue(env, "orders", "good", {"sku": 1}, keep_outcome=True)
    (g,) = await rq.dequeue_from_queue(env, "orders", keyed=False, max_count=1)
    await rq.ack([g])
    await rq.enqueue(env, "orders", "later", {}, delay_ms=600_000)

    shown = json.loads(cli("runs", "show", env.id, "bad", "--json").stdout)
    assert (shown["status"], shown["concurrency_key"], shown["attempts"]) == (
        "dead_lettered",
        "shop-1",
        1,
    )
    assert shown["traceback"] == TRACEBACK and shown["payload"] == '{"sku":null}'
    text = cli("runs", "show", env.id, "bad").stdout
    assert "KeyError: 'sku'" in text and 'File "job.py", line 3' in text
    missing = cli("runs", "show", env.id, "nope", ok=False)
    assert missing.returncode == 1 and "no run 'nope'" in missing.stderr

    recent = json.loads(cli("runs", "recent", env.id, "orders", "--json").stdout)
    assert [(r["run_id"], r["status"]) for r in recent] == [
        ("good", "completed"),
        ("bad", "dead_lettered"),
    ]
    dead = json.loads(cli("dlq", "list", env.id, "--json").stdout)
    assert [(x["run_id"], x["error"], x["traceback"]) for x in dead] == [
        ("bad", "KeyError: 'sku'", TRACEBACK)
    ]
    listed = cli("dlq", "list", env.id, "--traceback").stdout
    assert "Error" in listed and 'File "job.py", line 3' in listed
    stats = cli("stats", "--env", env.id).stdout
    assert "1 (due " in stats  # the delayed run, with when it is due
    cli("dlq", "delete", env.id, "bad")
    assert (await rq.get_run(env, "bad")).status is RunStatus.CANCELLED  # type: ignore[union-attr]


async def test_unknown_names_get_a_warning_with_a_suggestion(
    cli: Callable[..., Any], make_queue: Callable[..., Any], env: Environment
) -> None:
    rq: RunQueue = await make_queue()
    await rq.enqueue(env, "emails", "e1", {})
    typo_env = Environment(env.org, env.project, env.name + "d")
    done = cli("limits", "get", typo_env.id, "--json")
    assert (
        f"no environment {typo_env.id}" in done.stderr and f"did you mean {env.id}" in done.stderr
    )
    done = cli("runs", "recent", env.id, "emials")
    assert "has no queue 'emials'; did you mean emails?" in done.stderr
