"""The Lua script registry: loads ``lua/*.lua``, resolves includes, calls them as functions.

Each build of a script is a Redis/Valkey *function library* with one function, both
named ``fairq_<operation>_<order>_<content hash>``: the helpers are defined once when the
library loads (not on every call, which measured 35-80 us per call for an EVAL of the same
text), and the versioned name lets processes of different versions share a server. A
call is an ``FCALL``; a server that does not have the library (a restart without
persistence, ``FUNCTION FLUSH``) gets it loaded and the call retried. Loading also
deletes the libraries of older fairq builds (:mod:`fairq.store.libraries`: the current
and the previous build are kept).

A script file holds, top to bottom: its header (purpose, KEYS, ARGV, reply), the
directives, its KEYS/ARGV bindings and its body. Directives:

* ``--@schema fair``: a script without an order that still names the fair order's keys
  (only the admin script that sets weights). The age-order builds, and every other
  script without an order, get a schema without them;
* ``--@include name``: a helper file ``lua/include/<name>.lua``. ``prelude`` is the one
  generated include (reply codes, key builders, option rules, shared constants, the run
  hash's field names and the readers of it the library calls, this script's context
  bindings, argument checks) and must come first. ``order`` stands for the
  order-specific hooks and ``order_serve`` for the order's serve engine: a script that
  includes either (directly or through another include) is built twice, with
  ``order_age`` (``order_age_serve``) and with ``order_fair`` (``order_fair_serve``).
  Only the dequeue serves, so only it carries a serve engine; the other scripts carry
  the hooks alone.

An include names the includes it needs with ``--@require name``; the loader emits every
include once, after what it requires (a missing include or a cycle is a
:class:`ScriptLoadError`). Includes only define functions that take what they use as
parameters; nothing reads a script's locals.

The age-order build of a script never contains fair-order code, so a process whose
queues all use the age order runs scripts that never mention virtual time.

Only :mod:`fairq.store` uses this module; script objects never leave it.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Final, Literal

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fairq.errors import FairqError, raise_for_code
from fairq.keys import lua_schema
from fairq.outcomes import lua_outcome
from fairq.store import libraries
from fairq.store.context import (
    check_state_fields,
    context_read,
    lua_bindings,
    lua_context_cache,
    lua_state_tables,
)
from fairq.store.options import lua_options
from fairq.store.run_hash import lua_delivery, lua_run_hash, reads_called
from fairq.store.shared import lua_shared
from fairq.store.status import lua_status_table

Order = Literal["age", "fair"]

log = logging.getLogger("fairq.scripts")

_DIRECTIVE_RE: Final = re.compile(r"^--@(include|require|context|schema)\b(.*)$", re.MULTILINE)
_NAME_RE: Final = re.compile(r"^[a-z_]+$")
#: The order-specific include placeholders and what each resolves to per build: the
#: order's hooks (every script whose state changes the order must hear of), and its
#: serve engine (only the scripts that serve: the dequeue).
ORDER_INCLUDE: Final = "order"
SERVE_INCLUDE: Final = "order_serve"
ORDER_FILES: Final[dict[str, dict[Order, str]]] = {
    ORDER_INCLUDE: {"age": "order_age", "fair": "order_fair"},
    SERVE_INCLUDE: {"age": "order_age_serve", "fair": "order_fair_serve"},
}


class ScriptLoadError(FairqError):
    """A script or include cannot be assembled (missing include, cycle, bad directive)."""


Reader = Callable[[str], str | None]


def _package_reader(relative: str) -> str | None:
    path = resources.files("fairq.store").joinpath("lua", relative)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


@dataclass(frozen=True, slots=True)
class Source:
    """A script's assembled library text, and what it declared."""

    text: str
    context: tuple[str, ...]
    includes: tuple[str, ...]
    #: The library's (and its one function's) name, versioned by its content.
    function: str


def _directives(text: str, where: str) -> list[tuple[str, list[str]]]:
    out = []
    for match in _DIRECTIVE_RE.finditer(text):
        kind, rest = match.group(1), match.group(2).split()
        if not rest or not all(_NAME_RE.match(n) for n in rest):
            raise ScriptLoadError(f"{where}: bad directive {match.group(0)!r}")
        out.append((kind, rest))
    return out


def uses_order(name: str, read: Reader = _package_reader) -> bool:
    """Whether the script includes the order hooks (and so has an age and a fair build)."""
    seen: set[str] = set()

    def walk(include: str, stack: tuple[str, ...]) -> bool:
        if include in ORDER_FILES:
            return True
        if include in seen or include == "prelude":
            return False
        seen.add(include)
        text = read(f"include/{include}.lua")
        if text is None:
            raise ScriptLoadError(f"{stack[-1]}: missing include {include!r}")
        return any(
            walk(n, (*stack, include))
            for kind, names in _directives(text, include)
            if kind == "require"
            for n in names
        )

    text = read(f"{name}.lua")
    if text is None:
        raise ScriptLoadError(f"no script {name!r}")
    return any(
        walk(n, (name,))
        for kind, names in _directives(text, name)
        if kind == "include"
        for n in names
    )


def assemble(name: str, order: Order | None, read: Reader = _package_reader) -> Source:
    """The full text Redis runs for script ``name`` built for ``order``.

    Raises:
        ScriptLoadError: missing script or include, an include cycle, a bad directive, an
            unknown context name, or no ``prelude`` before the other includes.
    """
    text = read(f"{name}.lua")
    if text is None:
        raise ScriptLoadError(f"no script {name!r}")
    wanted, full_schema = _script_directives(name, order, text)
    bodies = _include_bodies(name, order, wanted[1:], read)
    prelude = read("include/prelude.lua")
    if prelude is None:
        raise ScriptLoadError(f"{name}: missing include 'prelude'")
    header, body = _split_script(text)
    code = "\n".join([prelude, *bodies.values(), body])
    try:
        reads = reads_called(code)
        # the context this build reads, and only that (a name no context field has fails)
        ordered_context = context_read(code)
        check_state_fields(code)
    except ValueError as exc:
        raise ScriptLoadError(f"{name}: {exc}") from None
    module = _module(code, prelude, bodies, reads, full_schema=full_schema)
    function = f"fairq_{name}_{order or 'any'}"
    draft = _library(function, header, module, lua_bindings(ordered_context), body)
    digest = hashlib.sha1(draft.encode("utf-8")).hexdigest()
    versioned = f"{function}_{digest[:16]}"
    library = _library(versioned, header, module, lua_bindings(ordered_context), body)
    return Source(library, ordered_context, tuple(bodies), versioned)


def _script_directives(name: str, order: Order | None, text: str) -> tuple[list[str], bool]:
    """A script's includes (``prelude`` first) and whether its build gets the full
    (fair-order) schema, from its directives."""
    wanted: list[str] = []
    full_schema = order == "fair"
    for kind, names in _directives(text, name):
        if kind == "context":
            raise ScriptLoadError(
                f"{name}: '--@context' is gone: the loader gives a build the context it reads"
            )
        elif kind == "include":
            wanted += names
        elif kind == "schema":
            if names != ["fair"] or order is not None:
                raise ScriptLoadError(f"{name}: '--@schema fair' is for scripts without an order")
            full_schema = True
        else:
            raise ScriptLoadError(f"{name}: '--@require' is for includes; use '--@include'")
    if not wanted or wanted[0] != "prelude":
        raise ScriptLoadError(f"{name}: the first include must be 'prelude'")
    return wanted, full_schema


def _include_bodies(
    name: str, order: Order | None, wanted: list[str], read: Reader
) -> dict[str, str]:
    """The text (directives blanked) of every include script ``name`` needs besides
    ``prelude``, the order placeholders resolved for ``order``: each once, after the
    includes it requires, in the order they are emitted (the dict's order)."""
    bodies: dict[str, str] = {}

    def visit(include: str, stack: tuple[str, ...]) -> None:
        if include in ORDER_FILES:
            if order is None:
                raise ScriptLoadError(f"{name}: includes the order hooks but has no order")
            include = ORDER_FILES[include][order]
        if include in stack:
            raise ScriptLoadError(f"{name}: include cycle {' -> '.join((*stack, include))}")
        if include in bodies:
            return
        raw = read(f"include/{include}.lua")
        if raw is None:
            raise ScriptLoadError(f"{stack[-1] if stack else name}: missing include {include!r}")
        for kind, names in _directives(raw, include):
            if kind != "require":
                raise ScriptLoadError(f"{include}: includes may only '--@require' others")
            for needed in names:
                visit(needed, (*stack, include))
        bodies[include] = _DIRECTIVE_RE.sub(lambda m: "", raw)

    for include in wanted:
        visit(include, ())
    return bodies


def _split_script(text: str) -> tuple[str, str]:
    """A script's header (the lines before its first directive) and its body (the lines
    after ``--@include prelude``, directives left out)."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if _DIRECTIVE_RE.match(line))
    start = next(i for i, line in enumerate(lines) if line.startswith("--@include prelude"))
    header = "\n".join(lines[:first])
    body = "\n".join(line for line in lines[start + 1 :] if not _DIRECTIVE_RE.match(line))
    return header, body


def _module(
    code: str, prelude: str, bodies: dict[str, str], reads: list[str], *, full_schema: bool
) -> str:
    """A build's library code outside its function: the generated tables (the outcome
    and delivery ones only if ``code`` uses them), the prelude, then the includes."""
    return "\n".join(
        [
            lua_status_table(),
            lua_schema(fair=full_schema),
            lua_options(),
            lua_shared(),
            lua_run_hash(reads),
            *([lua_outcome()] if "OUTCOME_FIELDS" in code else []),
            *([lua_delivery()] if "delivery_add(" in code else []),
            lua_context_cache(),
            lua_state_tables(),
            _DIRECTIVE_RE.sub(lambda m: "", prelude),
            *(f"-- include: {inc}\n{bodies[inc]}" for inc in bodies),
        ]
    )


def _library(function: str, header: str, module: str, bindings: str, body: str) -> str:
    """A Redis/Valkey function library holding one function: the helpers are defined once,
    when the library loads; each call runs only the context bindings and the body."""
    return (
        f"#!lua name={function}\n{header}\n{module}\n"
        f"redis.register_function('{function}', function(KEYS, ARGV)\n"
        f"{bindings}\n{body}\nend)\n"
    )


def script_names(read_dir: Callable[[], list[str]] | None = None) -> list[str]:
    """Every top-level script (the ``lua/*.lua`` files), sorted."""
    if read_dir is None:
        root = resources.files("fairq.store").joinpath("lua")
        names = [p.name for p in root.iterdir() if p.name.endswith(".lua")]
    else:
        names = read_dir()
    return sorted(n[: -len(".lua")] for n in names)


@dataclass(frozen=True, slots=True)
class Script:
    """One built script: its operation, order, library source, function name, SHA1 and
    context names."""

    operation: str
    order: Order | None
    source: str
    function: str
    sha: str
    context: tuple[str, ...]
    #: The build it belongs to (its registry's libraries), for pruning older builds.
    build: libraries.Build | None = field(default=None, compare=False, repr=False)

    @property
    def name(self) -> str:
        return self.operation if self.order is None else f"{self.operation}[{self.order}]"

    async def __call__(self, client: Any, keys: list[str], args: list[Any]) -> Any:
        """Run by FCALL (loading the library when the server does not have it); map
        ``FQ<code>`` errors to exceptions."""
        try:
            try:
                return await client.fcall(self.function, len(keys), *keys, *args)
            except ResponseError as exc:
                if not _not_loaded(exc):
                    raise
                await self._load(client)
                return await client.fcall(self.function, len(keys), *keys, *args)
        except ResponseError as exc:
            _raise_refusal(exc)
            raise

    def call_blocking(self, client: Any, keys: list[str], args: list[Any]) -> Any:
        """:meth:`__call__` on a blocking client of one server."""
        try:
            try:
                return client.fcall(self.function, len(keys), *keys, *args)
            except ResponseError as exc:
                if not _not_loaded(exc):
                    raise
                client.function_load(self.source, replace=True)
                return client.fcall(self.function, len(keys), *keys, *args)
        except ResponseError as exc:
            _raise_refusal(exc)
            raise

    async def _load(self, client: Any) -> None:
        try:
            if isinstance(client, RedisCluster):
                # On every master: the client's idea of which node owns the slot may be
                # stale right after a reshard, and a later call may land on another node.
                for node in client.get_primaries():
                    await _load_on_node(client, node, self.source)
                    run = functools.partial(client.execute_command, target_nodes=node)
                    await self._prune(run, str(node.name))
            else:
                await client.execute_command("FUNCTION", "LOAD", "REPLACE", self.source)
                await self._prune(client.execute_command, _server_name(client))
        except ResponseError as exc:
            raise ScriptLoadError(f"the server refused library {self.function}: {exc}") from exc

    async def _prune(self, run: libraries.Run, server: str) -> None:
        """Delete older builds' libraries (never failing the call that loaded this one)."""
        if self.build is None:
            return
        try:
            await libraries.prune(run, server, self.build)
        except (RedisError, ValueError, TypeError) as exc:
            log.warning("could not delete older fairq function libraries on %s: %s", server, exc)


def _server_name(client: Any) -> str:
    """Where a client of one server connects (its socket path, or host:port)."""
    address = getattr(client, "address", None)  # fairq's script wire
    if address is not None:
        return str(address.path or f"{address.host}:{address.port}")
    kwargs = client.connection_pool.connection_kwargs
    return str(kwargs.get("path") or f"{kwargs.get('host', '')}:{kwargs.get('port', '')}")


def _not_loaded(exc: ResponseError) -> bool:
    """Whether the server does not have the library (a restart, ``FUNCTION FLUSH``)."""
    return "function not found" in str(exc).lower()


def _raise_refusal(exc: ResponseError) -> None:
    """Raise the fairq error of a script's ``FQ<code>`` refusal (nothing for others)."""
    text = str(exc)
    if "FQ" in text:
        raise_for_code(text[text.index("FQ") :])


#: Attempts to load a library on one cluster node (a command sent to named nodes gets
#: none of the client's retries; a node that just restarted fails the first one).
LOAD_ATTEMPTS: Final = 3


async def _load_on_node(client: Any, node: Any, source: str) -> None:
    for attempt in range(LOAD_ATTEMPTS):
        try:
            await client.execute_command("FUNCTION", "LOAD", "REPLACE", source, target_nodes=node)
            return
        except (RedisConnectionError, RedisTimeoutError):
            if attempt == LOAD_ATTEMPTS - 1:
                raise
            await asyncio.sleep(0.05 * (attempt + 1))


class ScriptRegistry:
    """Every script, built for each order it has, expanded and hashed once per process."""

    def __init__(self, read: Reader = _package_reader, names: list[str] | None = None) -> None:
        sources: dict[tuple[str, Order | None], Source] = {}
        for name in script_names() if names is None else names:
            orders: tuple[Order | None, ...] = (
                ("age", "fair") if uses_order(name, read) else (None,)
            )
            for order in orders:
                sources[(name, order)] = assemble(name, order, read)
        #: This registry's libraries, as one build (see fairq.store.libraries).
        self.build = libraries.Build.of(s.function for s in sources.values())
        self._scripts: dict[tuple[str, Order | None], Script] = {}
        for (name, order), source in sources.items():
            sha = hashlib.sha1(source.text.encode("utf-8")).hexdigest()
            self._scripts[(name, order)] = Script(
                name, order, source.text, source.function, sha, source.context, self.build
            )

    def get(self, operation: str, order: Order) -> Script:
        """The script for ``operation`` in ``order`` (its only build if it has no order)."""
        script = self._scripts.get((operation, order)) or self._scripts.get((operation, None))
        if script is None:
            raise KeyError(operation)
        return script

    def has_order(self, operation: str) -> bool:
        return (operation, "fair") in self._scripts

    def all(self) -> list[Script]:
        return list(self._scripts.values())


_REGISTRY: ScriptRegistry | None = None


def registry() -> ScriptRegistry:
    """The process-wide registry (scripts are read from the package once)."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = ScriptRegistry()
    return _REGISTRY
