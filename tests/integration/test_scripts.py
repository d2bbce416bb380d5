"""The script registry: includes resolve once, calls go by SHA (reloading on NOSCRIPT),
and a script's error codes become fairq exceptions in one place."""

from __future__ import annotations

from typing import Any

import pytest

from fairq.errors import InvalidLimitError
from fairq.keys import Environment
from fairq.scripts import SCRIPT_NAMES, expand, registry


def test_every_script_expands_without_leftover_includes() -> None:
    for name in SCRIPT_NAMES:
        source = expand(name)
        assert "--@include" not in source, name
        assert source.count("local function claim(") <= 1, name


async def test_a_script_runs_after_the_server_forgot_it(make_queue: Any, env: Environment) -> None:
    rq = await make_queue()
    await rq.enqueue(env, "q", "r1", {}, now_ms=1_000)
    await rq.client.script_flush()
    assert [d.run_id for d in await rq.dequeue(1, now_ms=2_000)] == ["r1"]


async def test_a_bad_context_argument_is_refused_by_the_script_before_any_write(
    make_queue: Any, env: Environment
) -> None:
    """Given a caller bug (a non-numeric clock), the script raises FQ2, which the one
    error mapping turns into InvalidLimitError; nothing was written."""
    rq = await make_queue()
    q = rq.keys.queue(env, "q")
    e = rq.keys.env(env)
    s = rq.keys.shard(rq.keys.shard_of(env))
    script = registry()["enqueue"]
    args = ["not-a-number", *rq._context_tail, env.id, "q", "r1", "", "1000", "{}", "0", "1000"]
    with pytest.raises(InvalidLimitError):
        await script(rq.client, [q.base, e.prefix, s.master, s.ttl, s.envs, s.message_root], args)
    assert await rq.client.exists(e.message("r1")) == 0
    assert await rq.client.zcard(q.queued) == 0
