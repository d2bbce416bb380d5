"""Where a script's Lua spends its time: a line profile of the scripts' own code.

``bench/server_instructions.py`` counts the server's instructions per call, but inside a
script the server is one opaque interpreter loop. This tool runs the same libraries in
an embedded Lua 5.1 (``lupa``, the interpreter version the server embeds) with every
``redis.call`` passed on to a real server, so the data and every reply are the ones the
server would have, and counts the Lua virtual machine's instructions by source line with
a count hook. It reports, per operation, the instructions of each script line and of each
function (its own lines; the functions it calls are theirs), heaviest first.

What it counts is the interpreter's work, not the server's: an instruction that builds a
table or concatenates strings costs the server several hundred machine instructions, a
``redis.call`` one (its command is the server's, and not here). Use it to find the lines
that run most; confirm a change with ``server_instructions.py``.

Workloads as ``server_instructions.py``'s (the same clients): ``trigger``,
``trigger_fair``, ``drain`` (keyless ``dequeue_batch(10)`` + ``ack``, per op one batch),
``drain1`` (the same one run per call),
``fair:KEYS:TENANTS``, ``age:KEYS:TENANTS``.

    python bench/lua_profile.py --workload fair:10:0 [--n 2000] [--top 40] [--every 1]
                                [--calls]

With ``--calls`` it counts calls instead, per callee (a Lua function by name, a C function
as ``C:<name>``, the iterator of a ``for ... in`` loop as ``C:(for generator)``): inside a
script a call costs the server about 350 instructions whatever the function does, so the
count of calls is the other half of the interpreter's price.

Needs ``lupa`` (the ``bench`` extra); prints one JSON document. Not run in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import struct
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from lupa import lua51  # type: ignore[import-untyped]

from fairq.server import EmbeddedServer, free_port
from fairq.store import scripts as script_module

#: Lua of the runtime around a library: ``redis`` (calls passed to Python), ``bit``,
#: ``cjson``, and the count hook's tables.
_RUNTIME = """
local py_call, py_bit, py_json, py_struct = ...
redis = {
  call = function(...)
    local value, err = py_call(...)
    if err then error({err = err}, 0) end
    return value
  end,
  pcall = function(...)
    local value, err = py_call(...)
    if err then return {err = err} end
    return value
  end,
  register_function = function(name, fn)
    if type(name) == 'table' then name, fn = name.function_name, name.callback end
    LIBRARY_FUNCTIONS[name] = fn
  end,
  error_reply = function(text) return {err = text} end,
  status_reply = function(text) return {ok = text} end,
  log = function() end,
  LOG_WARNING = 3,
}
bit = py_bit
cjson = py_json
struct = py_struct
LIBRARY_FUNCTIONS = {}
PROFILE_LINES = {}
function profile_on(every, chunk)
  local getinfo = debug.getinfo
  local lines = PROFILE_LINES[chunk] or {}
  PROFILE_LINES[chunk] = lines
  debug.sethook(function()
    local info = getinfo(2, 'Sl')
    if info and info.source == chunk then
      local line = info.currentline
      lines[line] = (lines[line] or 0) + every
    end
  end, '', every)
end
-- With calls: the calls of each function instead (a Lua function by the line it is
-- defined at, a C function by the name it is called by, 'C:' first).
function calls_on(chunk)
  local getinfo = debug.getinfo
  local counts = PROFILE_LINES[chunk] or {}
  PROFILE_LINES[chunk] = counts
  debug.sethook(function()
    local info = getinfo(2, 'Sn')
    if info.what == 'C' then
      local key = 'C:' .. tostring(info.name)
      counts[key] = (counts[key] or 0) + 1
    elseif info.source == chunk then
      counts[info.linedefined] = (counts[info.linedefined] or 0) + 1
    end
  end, 'c')
end
function profile_off() debug.sethook() end
"""


class LuaServer:
    """The libraries run in Lua 5.1 here, their commands on a real server."""

    def __init__(self, port: int, every: int, calls: bool = False) -> None:
        import redis

        self.lua = lua51.LuaRuntime(encoding=None, unpack_returned_tuples=True)
        self.conn = redis.Redis(port=port, protocol=2).connection_pool.get_connection()
        self.every = every
        self.calls = calls
        self.sources: dict[str, str] = {}
        self.on = False
        bits = self.lua.table_from(
            {
                b"band": lambda *a: _bit(a, lambda x, y: x & y),
                b"bor": lambda *a: _bit(a, lambda x, y: x | y),
                b"bxor": lambda *a: _bit(a, lambda x, y: x ^ y),
                b"lshift": lambda x, n: _signed(int(x) << int(n)),
                b"rshift": lambda x, n: _signed((int(x) & 0xFFFFFFFF) >> int(n)),
                b"bnot": lambda x: _signed(~int(x)),
                b"tobit": lambda x: _signed(int(x)),
            }
        )
        cjson = self.lua.table_from({b"encode": self._json_encode})
        packing = self.lua.table_from({b"pack": _struct_pack, b"unpack": _struct_unpack})
        self.lua.execute(_RUNTIME.encode(), self._call, bits, cjson, packing)

    def _json_encode(self, value: Any) -> bytes:
        return json.dumps(_from_lua(value), separators=(",", ":")).encode()

    def _call(self, *args: Any) -> tuple[Any, Any]:
        """One command on the server: (its reply as Lua sees it, None) or (None, its error)."""
        self.conn.send_command(*args)
        try:
            raw = self.conn.read_response()
        except Exception as exc:  # a command's error reply
            return None, str(exc).encode()
        return self._to_lua(raw), None

    def _to_lua(self, value: Any) -> Any:
        if value is None:
            return False
        if isinstance(value, list):
            return self.lua.table_from([self._to_lua(v) for v in value])
        return value

    def load(self, function: str, source: str) -> None:
        chunk = re.sub(r"^#!lua[^\n]*\n", "", source).encode()
        self.sources[function] = source
        self.lua.execute(
            b"local code, name = ...; assert(loadstring(code, name))()",
            chunk,
            f"={function}".encode(),
        )

    def fcall(self, function: str, keys: list[str], args: list[Any]) -> Any:
        fn = self.lua.globals().LIBRARY_FUNCTIONS[function.encode()]
        k = self.lua.table_from([_b(x) for x in keys])
        a = self.lua.table_from([_b(x) for x in args])
        if self.on and self.calls:
            self.lua.globals().calls_on(f"={function}".encode())
        elif self.on:
            self.lua.globals().profile_on(self.every, f"={function}".encode())
        try:
            result = fn(k, a)
        finally:
            if self.on:
                self.lua.globals().profile_off()
        return _from_lua(result)


def _b(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _struct_pack(fmt: bytes, *values: Any) -> bytes:
    """The server's ``struct.pack`` for the formats the scripts use (``<``, ``B``, ``d``)."""
    return struct.pack(fmt.decode(), *values)


def _struct_unpack(fmt: bytes, data: bytes, pos: int = 1) -> tuple[Any, ...]:
    """The server's ``struct.unpack``: the values from 1-based ``pos``, then the next."""
    layout = struct.Struct(fmt.decode())
    return (*layout.unpack_from(data, pos - 1), pos + layout.size)


def _signed(x: int) -> int:
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x & 0x80000000 else x


def _bit(args: tuple[Any, ...], op: Any) -> int:
    out = int(args[0])
    for v in args[1:]:
        out = op(out, int(v))
    return _signed(out)


def _from_lua(value: Any) -> Any:
    if lua51.lua_type(value) == "table":
        items = dict(value.items())
        if b"err" in items:
            from redis.exceptions import ResponseError

            raise ResponseError(items[b"err"].decode())
        if b"ok" in items:
            return items[b"ok"]
        if not items:
            return []
        if all(isinstance(k, int) for k in items):
            return [_from_lua(items[i]) for i in range(1, len(items) + 1)]
        return {(k.decode() if isinstance(k, bytes) else k): _from_lua(v) for k, v in items.items()}
    if value is False:
        return None
    if value is True:
        return 1
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def install(lua: LuaServer) -> None:
    """Route every script call of this process through ``lua``."""

    async def call(self: Any, client: Any, keys: list[str], args: list[Any]) -> Any:
        if self.function not in lua.sources:
            lua.load(self.function, self.source)
        try:
            return lua.fcall(self.function, keys, args)
        except Exception as exc:
            from redis.exceptions import ResponseError

            if isinstance(exc, ResponseError):
                script_module._raise_refusal(exc)
            raise

    script_module.Script.__call__ = call  # type: ignore[method-assign]


async def run(workload: str, n: int, lua: LuaServer, port: int) -> int:
    url = f"redis://127.0.0.1:{port}/0"
    from server_instructions import keyed_cycles, task_cycles  # type: ignore[import-not-found]

    def measuring(on: bool) -> None:
        lua.on = on

    if workload in ("trigger", "trigger_fair", "drain", "drain1"):
        return int(await task_cycles(workload, n, url, measuring))
    return int(await keyed_cycles(workload, n, url, measuring))


def report(lua: LuaServer, ops: int, top: int) -> dict[str, Any]:
    if lua.calls:
        return report_calls(lua, ops, top)
    profiled = lua.lua.globals().PROFILE_LINES
    by_line: Counter[str] = Counter()
    by_function: Counter[str] = Counter()
    total = 0
    for function, source in lua.sources.items():
        # every library is one chunk: its lines are numbered in its source
        table = profiled[f"={function}".encode()]
        counts = {} if table is None else {int(k): int(v) for k, v in table.items()}
        total += sum(counts.values())
        lines = re.sub(r"^#!lua[^\n]*\n", "", source).split("\n")
        owner = _owners(lines)
        name = function.split("_")[1]
        for number, count in counts.items():
            if number <= len(lines):
                text = lines[number - 1].strip()
                by_line[f"{name}:{number}: {text[:90]}"] += count
                by_function[f"{name}:{owner[number - 1]}"] += count
    out: dict[str, Any] = {"ops": ops, "vm_instructions_per_op": round(total / ops)}
    out["lines"] = [[name, round(c / ops)] for name, c in by_line.most_common(top)]
    out["functions"] = [[name, round(c / ops)] for name, c in by_function.most_common(top)]
    return out


def report_calls(lua: LuaServer, ops: int, top: int) -> dict[str, Any]:
    """Calls per operation by callee: a Lua function by its name, a C function (the
    interpreter's own, ``redis.call`` included) as ``C:<name>``."""
    profiled = lua.lua.globals().PROFILE_LINES
    by_callee: Counter[str] = Counter()
    for function, source in lua.sources.items():
        table = profiled[f"={function}".encode()]
        lines = re.sub(r"^#!lua[^\n]*\n", "", source).split("\n")
        owner = _owners(lines)
        name = function.split("_")[1]
        for key, count in ({} if table is None else dict(table.items())).items():
            if isinstance(key, bytes):
                callee = key.decode()  # (py_call: the runtime's bridge of redis.call)
                by_callee[f"{name}:{'redis.call' if callee == 'C:py_call' else callee}"] += int(
                    count
                )
            elif 0 < int(key) <= len(lines):
                by_callee[f"{name}:{owner[int(key) - 1]}"] += int(count)
    total = sum(by_callee.values())
    out: dict[str, Any] = {"ops": ops, "calls_per_op": round(total / ops)}
    out["callees"] = [[name, round(c / ops, 1)] for name, c in by_callee.most_common(top)]
    return out


_FUNCTION_RE = re.compile(r"^\s*(?:local\s+)?function\s+([\w.:]+)|^\s*([\w.]+)\s*=\s*function")


def _owners(lines: list[str]) -> list[str]:
    """The function each line is in (by the nearest definition above it; '(body)': the
    registered function's body)."""
    out, current = [], "(top)"
    for text in lines:
        m = _FUNCTION_RE.match(text)
        if m:
            current = m.group(1) or m.group(2)
        if text.startswith("redis.register_function("):
            current = "(body)"
        out.append(current)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="fair:10:0")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--every", type=int, default=1, help="count hook period (instructions)")
    parser.add_argument(
        "--calls", action="store_true", help="count calls per callee instead of instructions"
    )
    args = parser.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="fairq-lua-profile-") as work:
        server = EmbeddedServer(port=port, data_dir=Path(work))
        server.start()
        try:
            lua = LuaServer(port, args.every, args.calls)
            install(lua)
            ops = asyncio.run(run(args.workload, args.n, lua, port))
            print(json.dumps({"workload": args.workload, **report(lua, ops, args.top)}, indent=1))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
