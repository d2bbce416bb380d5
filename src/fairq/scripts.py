"""The Lua script registry: loads ``lua/*.lua``, resolves includes, calls by SHA.

A script file may contain lines ``--@include NAME``; each is replaced (once per script)
by the text of ``lua/include/NAME.lua``. The expanded text is what Redis sees, so its
SHA1 changes only when the script or one of its includes changes.

Only :mod:`fairq.store` uses this module; script objects never leave it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError, ResponseError

from fairq.errors import raise_for_code

_INCLUDE_RE = re.compile(r"^--@include\s+([a-z_]+)\s*$", re.MULTILINE)

#: Every top-level script, by name (the file ``lua/<name>.lua``).
SCRIPT_NAMES = (
    "enqueue",
    "enqueue_vtime",
    "dequeue_queue",
    "dequeue_ck",
    "dequeue_ck_vtime",
    "ack",
    "nack",
    "nack_vtime",
    "heartbeat",
    "release",
    "reclaim",
    "reclaim_vtime",
    "expire_ttl",
    "expire_ttl_vtime",
    "redrive",
    "redrive_vtime",
    "cancel",
    "cancel_vtime",
    "seed_counters",
)

#: Scripts that exist only for the fair (virtual-time) order.
VTIME_SCRIPTS = frozenset(n for n in SCRIPT_NAMES if n.endswith("_vtime"))


def _read(relative: str) -> str:
    return resources.files("fairq").joinpath("lua", relative).read_text(encoding="utf-8")


def expand(name: str) -> str:
    """The script's text with every include resolved (each include at most once)."""
    seen: set[str] = set()

    def repl(match: re.Match[str]) -> str:
        inc = match.group(1)
        if inc in seen:
            return f"-- (already included: {inc})"
        seen.add(inc)
        body = _read(f"include/{inc}.lua")
        return _INCLUDE_RE.sub(repl, body)

    return _INCLUDE_RE.sub(repl, _read(f"{name}.lua"))


@dataclass(frozen=True, slots=True)
class Script:
    """One loaded script: its name, expanded source and SHA1."""

    name: str
    source: str
    sha: str

    async def __call__(self, client: Any, keys: list[str], args: list[Any]) -> Any:
        """Run by EVALSHA (loading on NOSCRIPT); map ``FQ<code>`` errors to exceptions."""
        try:
            try:
                return await client.evalsha(self.sha, len(keys), *keys, *args)
            except NoScriptError:
                await self._load(client, keys)
                return await client.evalsha(self.sha, len(keys), *keys, *args)
        except ResponseError as exc:
            text = str(exc)
            if "FQ" in text:
                raise_for_code(text[text.index("FQ") :])
            raise

    async def _load(self, client: Any, keys: list[str]) -> None:
        if isinstance(client, RedisCluster):
            # On every master: the client's idea of which node owns the slot may be stale
            # right after a reshard, and a later call may land on another node anyway.
            await client.execute_command(
                "SCRIPT LOAD", self.source, target_nodes=RedisCluster.PRIMARIES
            )
        else:
            await client.script_load(self.source)


class ScriptRegistry:
    """All of fairq's scripts, expanded and hashed once per process."""

    def __init__(self) -> None:
        self._scripts: dict[str, Script] = {}
        for name in SCRIPT_NAMES:
            source = expand(name)
            sha = hashlib.sha1(source.encode("utf-8")).hexdigest()
            self._scripts[name] = Script(name, source, sha)

    def __getitem__(self, name: str) -> Script:
        return self._scripts[name]

    def all(self) -> list[Script]:
        return list(self._scripts.values())


_REGISTRY: ScriptRegistry | None = None


def registry() -> ScriptRegistry:
    """The process-wide registry (scripts are read from the package once)."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = ScriptRegistry()
    return _REGISTRY
