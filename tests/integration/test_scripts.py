"""The script registry: one file per operation assembled with its includes (once each,
in dependency order), a checked context per script, one reply vocabulary; calls go by
FCALL (reloading a library the server lost) and a refused argument becomes a fairq
exception in one place.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

import pytest

from fairq.errors import InvalidLimitError, ScriptProtocolError
from fairq.keys import Environment
from fairq.models import EnqueueRequest, EnqueueStatus
from fairq.store.context import CONTEXT_NAMES, ScriptContext, lua_bindings
from fairq.store.scripts import ScriptLoadError, ScriptRegistry, assemble, registry, script_names
from fairq.store.status import REPLIES, Status, decode

# ------------------------------------------------------------------ assembling


def test_every_script_assembles_without_leftover_directives() -> None:
    for script in registry().all():
        assert "--@" not in script.source, script.name
        for include in ("claim", "counters", "runs"):
            assert script.source.count(f"-- include: {include}\n") <= 1, (script.name, include)


def test_the_script_list_comes_from_the_files() -> None:
    names = script_names()
    assert {"enqueue", "dequeue", "ack", "nack", "heartbeat", "configure"} <= set(names)
    assert {s.operation for s in registry().all()} == set(names)


def test_order_dependent_operations_have_an_age_and_a_fair_build() -> None:
    reg = registry()
    for op in ("enqueue", "dequeue", "ack", "nack", "release", "reclaim", "expire_ttl", "cancel"):
        assert reg.has_order(op), op
        assert reg.get(op, "age").order == "age"
        assert reg.get(op, "fair").order == "fair"
        assert reg.get(op, "age").sha != reg.get(op, "fair").sha
    for op in ("heartbeat", "configure", "seed_counters"):
        assert not reg.has_order(op)
        assert reg.get(op, "age") is reg.get(op, "fair")


def _reader(files: dict[str, str]) -> Any:
    return lambda relative: files.get(relative)


PRELUDE = "-- prelude\n"


def test_a_missing_include_fails_to_load() -> None:
    files = {"s.lua": "--@include prelude\n--@include nowhere\n", "include/prelude.lua": PRELUDE}
    with pytest.raises(ScriptLoadError, match="missing include 'nowhere'"):
        assemble("s", None, _reader(files))


def test_an_include_cycle_fails_to_load() -> None:
    files = {
        "s.lua": "--@include prelude\n--@include a\n",
        "include/prelude.lua": PRELUDE,
        "include/a.lua": "--@require b\nlocal function a() end\n",
        "include/b.lua": "--@require a\nlocal function b() end\n",
    }
    with pytest.raises(ScriptLoadError, match="cycle"):
        assemble("s", None, _reader(files))


def test_the_prelude_must_come_first() -> None:
    files = {"s.lua": "--@include a\n--@include prelude\n", "include/a.lua": "x = 1\n"}
    with pytest.raises(ScriptLoadError, match="first include must be 'prelude'"):
        assemble("s", None, _reader(files))


def test_a_read_of_an_unknown_context_name_fails_to_load() -> None:
    files = {
        "s.lua": "--@include prelude\nlocal skew = C.clock_skew\n",
        "include/prelude.lua": PRELUDE,
    }
    with pytest.raises(ScriptLoadError, match="clock_skew"):
        assemble("s", None, _reader(files))


def test_an_undeclared_per_call_state_field_fails_to_load() -> None:
    """Every field of X a script names is declared (store/context.py STATE_FIELDS)."""
    files = {
        "s.lua": "--@include prelude\nlocal v = X.tfloor or X.tflor\n",
        "include/prelude.lua": PRELUDE,
    }
    with pytest.raises(ScriptLoadError, match=r"X\.tflor"):
        assemble("s", None, _reader(files))


def test_the_fair_serve_reads_only_the_state_fields_it_declares() -> None:
    """The fair serve's phases share one record (serve_state): every F.<field> they name
    is one serve_state declares, and every declared one is used."""
    text = resources.files("fairq.store").joinpath("lua/include/order_fair_serve.lua").read_text()
    start = text.index("function E.serve_state(")
    record = text[text.index("setmetatable({", start) : text.index("}, SERVE_STATE_META)", start)]
    declared = set(re.findall(r"^\s*(\w+) = ", record, re.M)) | set(
        re.findall(r"(\w+) = [\w.]+,", record)
    )
    used = set(re.findall(r"\bF\.(\w+)", text))
    assert used - declared == set(), sorted(used - declared)
    assert declared - used == set(), sorted(declared - used)


def test_a_hand_kept_context_list_is_refused() -> None:
    """The loader gives a build exactly the context it reads: a '--@context' list would
    be a second, hand-kept copy of that."""
    files = {"s.lua": "--@context now\n--@include prelude\n", "include/prelude.lua": PRELUDE}
    with pytest.raises(ScriptLoadError, match="--@context"):
        assemble("s", None, _reader(files))


def test_a_build_gets_only_the_context_it_reads() -> None:
    files = {
        "s.lua": "--@include prelude\nlocal a, b = C.recent_runs, X.C.now\n",
        "include/prelude.lua": PRELUDE,
    }
    assert assemble("s", None, _reader(files)).context == ("now", "recent_runs")
    # and a script that serves nothing gets none of the serve engine's settings
    ages = {s.name: s.context for s in registry().all() if s.order == "age"}
    assert "default_quantum" not in ages["ack[age]"] and "default_quantum" in ages["dequeue[age]"]


def test_an_include_may_only_require() -> None:
    files = {
        "s.lua": "--@include prelude\n--@include a\n",
        "include/prelude.lua": PRELUDE,
        "include/a.lua": "--@include b\n",
    }
    with pytest.raises(ScriptLoadError, match="may only '--@require'"):
        assemble("s", None, _reader(files))


def test_requires_come_before_their_includer_once_each() -> None:
    files = {
        "s.lua": "--@include prelude\n--@include a\n--@include b\n",
        "include/prelude.lua": PRELUDE,
        "include/a.lua": "--@require c\nA\n",
        "include/b.lua": "--@require c\nB\n",
        "include/c.lua": "C\n",
    }
    source = assemble("s", None, _reader(files))
    assert source.includes == ("c", "a", "b")
    assert source.text.count("\nC\n") == 1
    assert source.text.index("\nC\n") < source.text.index("\nA\n") < source.text.index("\nB\n")


def test_the_order_placeholder_resolves_per_build() -> None:
    files = {
        "s.lua": "--@include prelude\n--@include order\n",
        "include/prelude.lua": PRELUDE,
        "include/order_age.lua": "AGE\n",
        "include/order_fair.lua": "FAIR\n",
    }
    assert "AGE" in assemble("s", "age", _reader(files)).text
    assert "FAIR" in assemble("s", "fair", _reader(files)).text
    reg = ScriptRegistry(_reader(files), names=["s"])
    assert reg.has_order("s")


# ------------------------------------------------------------------ the context contract


def test_each_script_receives_exactly_the_context_it_reads() -> None:
    """Every C.<name> a build's body (and includes) reads is in its context and nothing
    else is, in the canonical order, so the Python side sends exactly those slots."""
    for script in registry().all():
        used = set(re.findall(r"\bC\.([a-z_]+)", script.source))
        declared = set(script.context)
        assert used == declared, (script.name, sorted(used ^ declared))
        assert list(script.context) == [n for n in CONTEXT_NAMES if n in declared]


def test_the_python_context_matches_the_lua_bindings_slot_by_slot() -> None:
    """``now`` has its own slot; the other names share one space-separated slot, bound
    word by word in the declared order."""
    names = ("now", "counter_ttl", "default_burst_factor", "wake_channel")
    lua = lua_bindings(names)
    assert "C.now = tonumber(ARGV[1])" in lua
    assert "string.gmatch(ARGV[2] or ''" in lua
    for i, name in enumerate(names[1:], start=1):
        assert f"C.{name} = " in lua and f"packed[{i}]" in lua
    assert "local FIRST_ARG = 3" in lua
    assert "local FIRST_ARG = 2" in lua_bindings(("counter_ttl",))
    from fairq.config import RunQueueConfig

    ctx = ScriptContext.from_config(RunQueueConfig(), "p:wake")
    assert ctx.argv(names, 123) == ["123", "86400 1.0 p:wake"]
    assert ctx.argv(names, None)[0] == ""  # the server's clock


# ------------------------------------------------------------------ the reply vocabulary


def test_the_lua_status_table_is_the_python_enum() -> None:
    source = registry().get("ack", "age").source
    for status in Status:
        assert f"{status.name} = {status.value}" in source


def test_every_status_a_script_names_is_one_it_may_return_or_a_shared_code() -> None:
    for script in registry().all():
        named = set(re.findall(r"\bS\.([A-Z_]+)", script.source))
        assert named <= {s.name for s in Status}, script.name


@pytest.mark.parametrize(("operation", "allowed"), sorted(REPLIES.items()))
def test_every_reply_code_of_every_script_decodes_and_others_raise(
    operation: str, allowed: frozenset[Status]
) -> None:
    for status in Status:
        if status in allowed:
            assert decode(operation, int(status)) is status
        else:
            with pytest.raises(ScriptProtocolError):
                decode(operation, int(status))
    for bad in (0, -1, 999, "x", None):
        with pytest.raises(ScriptProtocolError):
            decode(operation, bad)


# ------------------------------------------------------------------ calls


async def test_a_script_runs_after_the_server_forgot_it(make_queue: Any, env: Environment) -> None:
    rq = await make_queue()
    await rq.enqueue(env, "q", "r1", {}, now_ms=1_000)
    await rq.client.function_flush()
    assert [d.run_id for d in await rq.dequeue(1, now_ms=2_000)] == ["r1"]


async def test_a_bad_context_argument_is_refused_by_the_script_before_any_write(
    make_queue: Any, env: Environment
) -> None:
    """Given a caller bug (a non-numeric counter TTL), the script raises FQ2, which the one
    error mapping turns into InvalidLimitError; nothing was written."""
    rq = await make_queue()
    q = rq.keys.queue(env, "q")
    e = rq.keys.env(env)
    script = registry().get("enqueue", "age")
    args = rq._context.argv(script.context, 1_000)
    words = args[1].split(" ")
    words[script.context.index("counter_ttl") - 1] = "not-a-number"  # after 'now'
    args[1] = " ".join(words)
    run = "r1   ,0,0,0,,0,, {}"  # (a good run: the context is what is wrong)
    with pytest.raises(InvalidLimitError):
        await script(rq.client, [rq.keys.tag_of(env)], [*args, env.id, "q", "", "0", run])
    assert await rq.client.exists(e.message("r1")) == 0
    assert await rq.client.zcard(q.queued) == 0


async def test_a_bad_per_run_argument_refuses_the_whole_batch(
    make_queue: Any, env: Environment
) -> None:
    """Every run of an enqueue call is checked before the first is written."""
    rq = await make_queue()
    script = registry().get("enqueue", "age")
    args = rq._context.argv(script.context, 1_000)
    good = "r1   ,0,0,0,,0,, {}"
    bad = "r2   ,soon,0,0,,0,, {}"
    # (the good run alone is enqueued: the check is the bad one's)
    await script(rq.client, [rq.keys.tag_of(env)], [*args, env.id, "q", "", "0", good])
    await rq.client.delete(rq.keys.env(env).message("r1"))
    with pytest.raises(InvalidLimitError):
        await script(rq.client, [rq.keys.tag_of(env)], [*args, env.id, "q", "", "0", good, bad])
    assert await rq.client.exists(rq.keys.env(env).message("r1")) == 0


async def test_processes_with_different_settings_each_get_their_own_context(
    make_queue: Any, env: Environment
) -> None:
    """A library keeps the context it parsed per packed slot (a bounded number of them);
    callers with other settings still get theirs, also past the bound and after it
    evicted theirs: here each process's default queue size limit decides its enqueues."""

    async def statuses(limit: int, queue: str, ids: list[str]) -> list[EnqueueStatus]:
        rq = await make_queue(default_queue_size_limit=limit)
        return [
            (await rq.enqueue_one(EnqueueRequest(env, queue, i), now_ms=1_000)).status for i in ids
        ]

    for limit in range(1, 41):  # 40 settings: more than a library keeps
        ids = [f"a{limit}-{i}" for i in range(limit + 1)]
        got = await statuses(limit, f"sized{limit}", ids)
        assert got == limit * [EnqueueStatus.ENQUEUED] + [EnqueueStatus.REJECTED], limit
    for limit in (1, 2, 3):  # evicted by now: parsed again, still theirs
        assert await statuses(limit, f"sized{limit}", [f"b{limit}"]) == [EnqueueStatus.REJECTED]
        roomier = await statuses(limit + 1, f"sized{limit}", [f"c{limit}"])
        assert roomier == [EnqueueStatus.ENQUEUED]
