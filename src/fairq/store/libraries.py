"""fairq's function libraries on a server: which builds' libraries to keep, which to delete.

Every script build is a library named by its content (see :mod:`fairq.store.scripts`),
so each change of a script loads new libraries beside the old ones; on a long-lived
server they would pile up without bound. So each fairq *build* (one process's set of
libraries, :class:`Build`) also loads a small *manifest* library,
``fairq_build_<id>``, whose code lists the build's libraries and the server time it
was first loaded. When a process loads a library (its server lacked it: a new build, a
restart, a flush), it makes sure its manifest is there and then deletes, once per
server and process:

* every fairq library claimed by no build it keeps, and the manifests of the builds it
  does not keep. It keeps its own build and the two most recently loaded ones (the
  current and the previous version: a rolling upgrade runs both), so an older process
  that reloads its libraries never deletes those of the newer ones;
* libraries that no manifest claims (loaded by a fairq without manifests) count as one
  build older than any other.

Libraries that are not fairq's (not named ``fairq_...``) are never touched. A library
deleted under a process still running it is loaded again by that process's next call.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from redis.exceptions import ResponseError

log = logging.getLogger("fairq.scripts")

#: Name prefix of every fairq library, and of the build manifests.
LIBRARY_PREFIX: Final = "fairq_"
MANIFEST_PREFIX: Final = "fairq_build_"
#: Builds kept besides the caller's own: the newest ones (current and previous).
KEPT_BUILDS: Final = 2

_LOADED_AT_RE: Final = re.compile(r"^-- loaded_at: (\d+)$", re.MULTILINE)
_LIBRARIES_RE: Final = re.compile(r"^-- libraries: (.*)$", re.MULTILINE)

#: Runs one command on one server (a node of a cluster) and returns its reply.
Run = Callable[..., Awaitable[Any]]


@dataclass(eq=False)
class Build:
    """The libraries of one fairq build (one registry of scripts)."""

    libraries: frozenset[str]
    #: Server times (ms) its manifest was first loaded at, by server (kept for reloads).
    loaded_at: dict[str, int] = field(default_factory=dict)
    #: Servers this process pruned already.
    pruned: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, libraries: Iterable[str]) -> Build:
        return cls(frozenset(libraries))

    @property
    def id(self) -> str:
        return hashlib.sha1(" ".join(sorted(self.libraries)).encode()).hexdigest()[:16]

    @property
    def manifest(self) -> str:
        return f"{MANIFEST_PREFIX}{self.id}"

    def manifest_source(self, loaded_at: int) -> str:
        """The manifest library: its libraries and first load time, in comments."""
        return (
            f"#!lua name={self.manifest}\n"
            "-- fairq build manifest: the function libraries of one fairq build\n"
            f"-- loaded_at: {loaded_at}\n"
            f"-- libraries: {' '.join(sorted(self.libraries))}\n"
            f"redis.register_function{{function_name='{self.manifest}', "
            f"callback=function() return {loaded_at} end, flags={{'no-writes'}}}}\n"
        )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _entries(reply: Any) -> list[dict[str, Any]]:
    """FUNCTION LIST's reply as one dict per library (parsed or flat, either protocol)."""
    out = []
    for item in reply or []:
        if isinstance(item, dict):
            out.append({_text(k): v for k, v in item.items()})
        else:
            out.append({_text(k): v for k, v in zip(item[::2], item[1::2], strict=True)})
    return out


async def _manifests(run: Run) -> dict[str, tuple[int, set[str]]]:
    """Every build manifest on the server: name -> (first loaded at, its libraries)."""
    reply = await run("FUNCTION", "LIST", "LIBRARYNAME", MANIFEST_PREFIX + "*", "WITHCODE")
    found: dict[str, tuple[int, set[str]]] = {}
    for entry in _entries(reply):
        code = _text(entry.get("library_code", ""))
        at, names = _LOADED_AT_RE.search(code), _LIBRARIES_RE.search(code)
        if at is not None and names is not None:
            found[_text(entry["library_name"])] = (int(at.group(1)), set(names.group(1).split()))
    return found


async def _ensure_manifest(run: Run, server: str, build: Build) -> None:
    if server not in build.loaded_at:
        seconds, micros = await run("TIME")
        build.loaded_at[server] = int(seconds) * 1000 + int(micros) // 1000
    try:
        await run("FUNCTION", "LOAD", build.manifest_source(build.loaded_at[server]))
    except ResponseError as exc:
        if "already exists" not in str(exc):
            raise


async def prune(run: Run, server: str, build: Build) -> list[str]:
    """Load ``build``'s manifest and delete the fairq libraries of builds it does not
    keep (see the module docstring), once per ``server`` and process; the names
    deleted."""
    if server in build.pruned:
        return []
    await _ensure_manifest(run, server, build)
    manifests = await _manifests(run)
    libraries = {_text(e["library_name"]) for e in _entries(await run(
        "FUNCTION", "LIST", "LIBRARYNAME", LIBRARY_PREFIX + "*"))}  # fmt: skip
    claimed = set().union(*(names for _, names in manifests.values()))
    builds = [(at, name, names) for name, (at, names) in manifests.items()]
    unclaimed = {n for n in libraries - claimed if not n.startswith(MANIFEST_PREFIX)}
    if unclaimed:
        builds.append((-1, "", unclaimed))  # a fairq without manifests: older than any
    builds.sort(reverse=True)
    kept = {name for _, name, _ in builds[:KEPT_BUILDS]} | {build.manifest}
    keep = set(build.libraries).union(*(names for _, name, names in builds if name in kept))
    doomed = sorted(
        n for n in libraries
        if (n.startswith(MANIFEST_PREFIX) and n not in kept and n in manifests)
        or (not n.startswith(MANIFEST_PREFIX) and n not in keep)
    )  # fmt: skip
    for name in doomed:
        try:
            await run("FUNCTION", "DELETE", name)
        except ResponseError:  # another process deleted it first
            continue
    build.pruned.add(server)
    if doomed:
        log.info("deleted %d function libraries of older fairq builds on %s", len(doomed), server)
    return doomed


__all__ = ["KEPT_BUILDS", "MANIFEST_PREFIX", "Build", "prune"]
