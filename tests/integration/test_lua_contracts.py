"""The contracts across the Lua boundary are generated from Python tables, and checked here
on what the loader builds, so that a hand-kept copy on either side fails a test:

* run-hash fields by name: no Lua file reads a run hash by hand (an ``HMGET`` whose
  reply it then indexes by position) or spells a stored field name; every read goes
  through a generated reader whose values are bound to locals named as the fields of
  :data:`fairq.store.run_hash.RUN_READS`, in its order, and every write names its fields
  through the generated ``RUN_FIELD``;
* shared constants: no Lua file defines a constant the Python side defines too (by name,
  or by value: a bound or word list the loader generates, or any word list of a Python
  module), nor spells a generated bound as a number; the history counters the scripts
  write are the ones the readers read;
* one writer of the outcome document: no Lua file but ``include/runs.lua`` (its
  ``write_outcome``) encodes or stores one, and every outcome a script writes names only
  the fields of :data:`fairq.outcomes.OUTCOME_FIELDS` and a status of
  :class:`fairq.outcomes.RunStatus`;
* option ranges: ``configure.lua`` accepts exactly the values the option table of
  :mod:`fairq.store.options` accepts (every option and override, at each bound and just
  beyond), because its rules are generated from that table. The configure.lua this
  module replaced, which checked kinds but kept its own ranges, fails the check.

Each check is a function fed a deliberately broken input in a test of its own, so that
the check itself is shown to be able to fail.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
import re
from collections.abc import Callable
from importlib import resources
from typing import Any

import pytest

import fairq
from fairq.errors import InvalidLimitError
from fairq.keys import Environment
from fairq.outcomes import OUTCOME_FIELDS, RunStatus
from fairq.store import RunQueue
from fairq.store.history import HISTORY_COUNTERS
from fairq.store.options import (
    ENV_OPTIONS,
    FLAG_WORDS,
    OVERRIDE_OPTIONS,
    QUEUE_OPTIONS,
    Option,
)
from fairq.store.readers import HistoryBucket
from fairq.store.run_hash import READ_CALL_RE, RUN_FIELDS, RUN_READS, RUN_STATES
from fairq.store.scripts import ScriptLoadError, ScriptRegistry, assemble, script_names
from fairq.store.shared import ARG_RULES, HISTORY, LUA_CONSTANTS

MakeQueue = Callable[..., Any]
QUEUE = "jobs"


def _package_lua(relative: str) -> str | None:
    path = resources.files("fairq.store").joinpath("lua", relative)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def lua_files() -> dict[str, str]:
    """Every Lua file of the package (scripts and includes) by its path under lua/."""
    root = resources.files("fairq.store").joinpath("lua")
    includes = sorted(p.name for p in root.joinpath("include").iterdir() if p.name.endswith(".lua"))
    paths = [f"{name}.lua" for name in script_names()] + [f"include/{n}" for n in includes]
    return {path: text for path in paths if (text := _package_lua(path)) is not None}


def lua_code(source: str) -> str:
    """Lua source without its comments (block comments first, then line comments)."""
    source = re.sub(r"--\[\[.*?\]\]", "", source, flags=re.DOTALL)
    return re.sub(r"--[^\n]*", "", source)


def call_arguments(code: str, start: int) -> list[str]:
    """The top-level arguments of the call whose '(' is at ``start`` (quoted strings and
    nested brackets skipped)."""
    args, depth, quote, current = [], 0, "", []
    for char in code[start + 1 :]:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                break
            depth -= 1
        elif char == "," and depth == 0:
            args.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    return [*args, "".join(current).strip()]


def redis_calls(code: str) -> list[tuple[str, list[str]]]:
    """Every redis.call / redis.pcall: its command (upper-case) and its other arguments."""
    out = []
    for call in re.finditer(r"redis\.p?call\(", code):
        command, *args = call_arguments(code, call.end() - 1)
        out.append((command.strip("'\"").upper(), args))
    return out


_HASH_READS = {"HGET", "HMGET", "HGETALL", "HVALS", "HKEYS", "HEXISTS", "HSTRLEN"}
_HASH_WRITES = {"HSET": 2, "HSETNX": 2, "HINCRBY": 2, "HDEL": 1}


def _hand_kept_run_access(path: str, code: str) -> list[str]:
    """Reads of a run hash by hand, and writes that spell a stored field name."""
    run_keys = set(re.findall(r"\b([A-Za-z_]\w*)\s*=\s*run_key\(", code))
    out = []
    for command, args in redis_calls(code):
        if not args or not (args[0] in run_keys or args[0].startswith("run_key(")):
            continue
        if command in _HASH_READS:
            out.append(f"{path}: {command} of a run hash by hand (use a run_read_ reader)")
        step = _HASH_WRITES.get(command)
        for field in args[1::step] if step else []:
            if field[:1] in "'\"":
                out.append(f"{path}: {command} spells the run-hash field {field} (use RUN_FIELD)")
    return out


def _reader_bindings(path: str, code: str) -> list[str]:
    """Reader calls not bound to locals named as the reader's fields, in its order."""
    out = []
    for call in READ_CALL_RE.finditer(code):
        reader = call.group(1)
        bound = re.search(r"local\s+([A-Za-z_][\w\s,]*?)\s*=\s*$", code[: call.start()])
        names = tuple(n.strip() for n in bound.group(1).split(",")) if bound else ()
        if reader not in RUN_READS:
            out.append(f"{path}: run_read_{reader} is not a reader of RUN_READS")
        elif names != RUN_READS[reader]:
            out.append(f"{path}: run_read_{reader} bound to {names}, not {RUN_READS[reader]}")
    return out


def run_hash_problems(files: dict[str, str]) -> list[str]:
    """Every place a Lua file reads a run-hash field by position or spells one by hand,
    binds a reader's values to other names, names an unknown field or writes an unknown
    state."""
    out = []
    for path, text in files.items():
        code = lua_code(text)
        out += _hand_kept_run_access(path, code)
        out += _reader_bindings(path, code)
        for name in re.findall(r"\bRUN_FIELD\.(\w+)", code):
            if name not in RUN_FIELDS:
                out.append(f"{path}: RUN_FIELD.{name} is not a run-hash field")
        for word in re.findall(r"(?:\bstate\s*[~=]=|RUN_FIELD\.state\s*,)\s*'(\w*)'", code):
            if word not in RUN_STATES:
                out.append(f"{path}: state {word!r} is not one of {RUN_STATES}")
    return out


def test_no_lua_file_reads_a_run_hash_field_by_position() -> None:
    """Every Lua file reads the run hash through the generated readers, binds their
    values to the fields' names and writes fields through RUN_FIELD."""
    files = lua_files()
    assert {"ack.lua", "heartbeat.lua", "include/claim.lua", "include/counters.lua"} <= set(files)
    assert run_hash_problems(files) == []


def test_the_run_hash_check_fails_on_reads_by_position_and_on_misnamed_bindings() -> None:
    """The check can fail: it flags a hand-written HMGET read by index (the ack.lua and
    heartbeat.lua of before, whose f[2] meant the key in one and the lease token in the
    other), a field spelled in a write, a reader bound in the wrong order, an unknown
    field and an unknown state."""
    broken = {
        "ack.lua": "local mkey = run_key(tag, member)\n"
        "local f = redis.call('HMGET', mkey, 'q', 'k', 'st', 'd')\n"
        "free_slots_later(X, Q, f[2], run, ta)\n",
        "heartbeat.lua": "local f = redis.call('HMGET', run_key(tag, t[1]), 'st', 'd')\n"
        "if same_token(f[2], t[2]) then end\n",
        "nack.lua": "local mkey = run_key(tag, member)\n"
        "redis.call('HSET', mkey, 'st', 'queued', RUN_FIELD.score, retry_at)\n",
        "redrive.lua": "local ck, queue, state, tenant = run_read_redrive(mkey)\n"
        "if state ~= 'dead' then end\n"
        "redis.call('HSET', mkey, RUN_FIELD.attempt, 0)\n",
    }
    found = run_hash_problems(broken)
    assert any(p.startswith("ack.lua: HMGET of a run hash by hand") for p in found)
    assert any(p.startswith("heartbeat.lua: HMGET of a run hash by hand") for p in found)
    assert "nack.lua: HSET spells the run-hash field 'st' (use RUN_FIELD)" in found
    assert any(p.startswith("redrive.lua: run_read_redrive bound to ('ck', 'queue'") for p in found)
    assert "redrive.lua: RUN_FIELD.attempt is not a run-hash field" in found
    assert any(p.startswith("redrive.lua: state 'dead'") for p in found)
    assert len(found) == 6


def test_a_library_gets_the_readers_its_code_calls_and_an_unknown_one_fails_to_load() -> None:
    files = {
        "s.lua": "--@include prelude\nlocal state = run_read_nope(mkey)\n",
        "include/prelude.lua": "-- prelude\n",
    }
    with pytest.raises(ScriptLoadError, match="unknown run-hash reader"):
        assemble("s", None, files.get)
    heartbeat = assemble("heartbeat", None).text
    assert "local function run_read_heartbeat(mkey)" in heartbeat
    assert "run_read_ack" not in heartbeat and "delivery_add" not in heartbeat


# ------------------------------------------------------------------ shared constants

_LITERAL = r"(-?[0-9][0-9.e+-]*|'[^']*'|\{[^{}]*\})"
#: A Lua constant: ``local NAME = <number | 'string' | {literals}>`` at the top level.
_LUA_CONSTANT_RE = re.compile(rf"^local ([A-Z][A-Z0-9_]*) = {_LITERAL}\s*$", re.MULTILINE)


def lua_value(literal: str) -> object:
    """A Lua literal as the Python value it stands for (a table of words: a frozenset)."""
    if literal.startswith("'"):
        return literal[1:-1]
    if literal.startswith("{"):
        items = [i.strip() for i in literal[1:-1].split(",") if i.strip()]
        if all(i.startswith("'") for i in items):
            return frozenset(i[1:-1] for i in items)
        return None
    return float(literal)


def python_constants() -> dict[str, object]:
    """Every public constant of fairq's modules (upper-case names bound to a number, a
    string or a tuple of strings; a tuple as a frozenset), by name."""
    out: dict[str, object] = {}
    for info in pkgutil.walk_packages(fairq.__path__, "fairq."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if not re.fullmatch(r"[A-Z][A-Z0-9_]*", name) or isinstance(value, bool):
                continue
            if isinstance(value, int | float):
                out[name] = float(value)
            elif isinstance(value, str) or (
                isinstance(value, tuple) and value and all(isinstance(v, str) for v in value)
            ):
                out[name] = frozenset(value) if isinstance(value, tuple) else value
    return out


def generated_values() -> set[object]:
    """Every value the loader generates into the scripts from the Python side."""
    values = [*LUA_CONSTANTS.values(), *ARG_RULES.values(), *HISTORY.values(), RUN_STATES]
    return {
        frozenset(v) if isinstance(v, tuple) else float(v) if isinstance(v, int) else v
        for v in values
    }


def hand_kept_constants(files: dict[str, str], python: dict[str, object]) -> list[str]:
    """Constants a Lua file defines that the Python side defines too, and generated bounds
    a Lua file spells as numbers."""
    generated = generated_values()
    word_lists = {v for v in python.values() if isinstance(v, frozenset) and len(v) > 1}
    big_bounds = {v for v in generated if isinstance(v, float) and v >= 100}
    out = []
    for path, text in files.items():
        code = lua_code(text)
        for name, literal in _LUA_CONSTANT_RE.findall(code):
            value = lua_value(literal)
            if name in python:
                out.append(f"{path}: {name} is a Python constant too")
            elif value in generated:
                out.append(f"{path}: {name} = {literal} is generated from Python already")
            elif value in word_lists:
                out.append(f"{path}: {name} = {literal} is a Python word list too")
        for number in _checked_numbers(code):
            if float(number) in big_bounds:
                out.append(f"{path}: {number} is a generated bound (use its name)")
    return out


_NUMBER = r"[0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?"


def _checked_numbers(code: str) -> list[str]:
    """The numbers a script checks an argument against: those passed to an argument check
    (arg_int, arg_name ...) and those a length is compared with."""
    out = []
    for call in re.finditer(r"\barg_\w+\(", code):
        out += [a for a in call_arguments(code, call.end() - 1) if re.fullmatch(_NUMBER, a)]
    out += re.findall(rf"#[\w.\[\]]+\s*[<>]=?\s*({_NUMBER})(?![\w.])", code)
    return out


def test_no_constant_is_defined_on_both_sides_by_hand() -> None:
    """The constants the scripts share with Python (bounds, word lists, the delivery
    layout, the history's) come from the generated prelude, never from a Lua file."""
    python = python_constants()
    assert {"MAX_TIME_MS", "MAX_LIMIT", "HISTORY_BUCKET_MS", "FINISH_STATUSES"} <= set(python)
    assert hand_kept_constants(lua_files(), python) == []


def test_the_constant_check_fails_on_constants_kept_on_both_sides() -> None:
    """The check can fail: fed the pairs it replaced (claim.lua's DELIVERY_FIELDS, ack.lua's
    status words, runs.lua's history bucket, the prelude's UNLIMITED), an inline bound and a
    Lua-only constant, it reports all but the last."""
    broken = {
        "include/claim.lua": "local DELIVERY_FIELDS = 12\n",
        "ack.lua": "local STATUS_WORDS = {'completed', 'failed', 'cancelled', 'timed_out'}\n",
        "include/runs.lua": "local BUCKET_MS = 10000\nif #progress > 1100 then end\n",
        "include/prelude.lua": "local UNLIMITED = 1000000000\nlocal UNPACK_CHUNK = 4000\n",
        "heartbeat.lua": "local lease_ms = arg_int(ARGV[FIRST_ARG], 'lease_ms', 1, 86400000)\n",
    }
    found = hand_kept_constants(broken, python_constants())
    assert found == [
        "include/claim.lua: DELIVERY_FIELDS is a Python constant too",
        "ack.lua: STATUS_WORDS = {'completed', 'failed', 'cancelled', 'timed_out'} is generated "
        "from Python already",
        "include/runs.lua: BUCKET_MS = 10000 is generated from Python already",
        "include/runs.lua: 1100 is a generated bound (use its name)",
        "include/prelude.lua: UNLIMITED = 1000000000 is generated from Python already",
        "heartbeat.lua: 86400000 is a generated bound (use its name)",
    ]


def test_the_history_counters_the_scripts_write_are_the_ones_read() -> None:
    """Every counter a script adds to a history bucket is a field of HistoryBucket."""
    written = set()
    for text in lua_files().values():
        written |= set(re.findall(r"history_add\(X, Q, '(\w+)'", lua_code(text)))
    assert {"served", "wait_ms", "retried", "expired", "run_ms"} <= written
    assert written <= set(HISTORY_COUNTERS)
    assert set(HISTORY_COUNTERS) <= set(HistoryBucket.__dataclass_fields__)


# ------------------------------------------------------------------ the outcome's writer

#: The one file that may encode and store an outcome document.
OUTCOME_WRITER = "include/runs.lua"
_STRING_WRITES = {"SET", "SETEX", "PSETEX", "SETNX", "GETSET", "APPEND", "SETRANGE"}


def _table_at(code: str, start: int) -> str:
    """The table constructor whose '{' is at ``start``."""
    depth = 0
    for end in range(start, len(code)):
        depth += {"{": 1, "}": -1}.get(code[end], 0)
        if depth == 0:
            return code[start : end + 1]
    return code[start:]


def _outcome_tables(code: str) -> list[str]:
    """The tables a file hands write_outcome: inline, or a local it built before."""
    out = []
    for call in re.finditer(r"\bwrite_outcome\(", code):
        args = call_arguments(code, call.end() - 1)
        outcome = args[2] if len(args) > 2 else ""
        if outcome.startswith("{"):
            out.append(outcome)
        elif built := re.search(rf"local {re.escape(outcome)} = \{{", code):
            out.append(_table_at(code, built.end() - 1))
    return out


def outcome_writer_problems(files: dict[str, str]) -> list[str]:
    """Outcome documents encoded or stored by hand, and outcomes with a field or a status
    the document does not have."""
    statuses = {s.value for s in RunStatus}
    out = []
    for path, text in files.items():
        code = lua_code(text)
        for command, args in redis_calls(code):
            stored = command in _STRING_WRITES and args and args[0].startswith("outcome_key(")
            if stored and path != OUTCOME_WRITER:
                out.append(f"{path}: stores an outcome by hand (use write_outcome)")
        for encode in re.finditer(r"cjson\.encode\(\{", code):
            if re.search(r"\bstatus\s*=", _table_at(code, encode.end() - 1)):
                out.append(f"{path}: encodes an outcome by hand (use write_outcome)")
        for table in _outcome_tables(code):
            for name in re.findall(r"(?:^|[{,])\s*([A-Za-z_]\w*)\s*=(?!=)", table):
                if name not in OUTCOME_FIELDS:
                    out.append(f"{path}: outcome field {name!r} is not in OUTCOME_FIELDS")
            for word in re.findall(r"\bstatus\s*=\s*'(\w+)'", table):
                if word not in statuses:
                    out.append(f"{path}: outcome status {word!r} is not a RunStatus")
    return out


def test_the_outcome_document_has_one_writer() -> None:
    files = lua_files()
    assert "write_outcome(X, member, {" in files["ack.lua"]
    assert outcome_writer_problems(files) == []


def test_the_outcome_check_fails_on_hand_written_outcomes() -> None:
    """The check can fail: fed the writers it replaced (cancel.lua's and runs.lua's own
    cjson documents), a SET of an outcome key, a misspelt field and an unknown status, it
    reports each."""
    broken = {
        "cancel.lua": "local outcome = cjson.encode({status = 'cancelled', queue = f[1]})\n",
        "nack.lua": "redis.call('SET', outcome_key(tag, member), outcome, 'EX', 60)\n",
        "expire_ttl.lua": "local o = {status = 'canceled', finish_at = X.now}\n"
        "write_outcome(X, member, o)\n",
        OUTCOME_WRITER: "write_outcome(X, member, {status = 'expired', key = ck, atempts = 1})\n"
        "local expired = cjson.encode({status = 'expired', queue = Q.name})\n",
    }
    assert outcome_writer_problems(broken) == [
        "cancel.lua: encodes an outcome by hand (use write_outcome)",
        "nack.lua: stores an outcome by hand (use write_outcome)",
        "expire_ttl.lua: outcome field 'finish_at' is not in OUTCOME_FIELDS",
        "expire_ttl.lua: outcome status 'canceled' is not a RunStatus",
        "include/runs.lua: encodes an outcome by hand (use write_outcome)",
        "include/runs.lua: outcome field 'atempts' is not in OUTCOME_FIELDS",
    ]


# ------------------------------------------------------------------ option ranges

#: One configure change: target, queue ('' = the environment's own), field, and how an
#: override's value is written around the value tried.
_OVERRIDE_TARGETS: dict[str, tuple[str, str, str, str]] = {
    "cap": ("key_caps", QUEUE, "k", "{}"),
    "rate": ("key_rates", QUEUE, "k", "{}:1"),
    "rate_burst": ("key_rates", QUEUE, "k", "1.0:{}"),
    "weight": ("tenant_weights", "", "t", "{}"),
}


def bound_cases(option: Option) -> list[tuple[object, str]]:
    """Values at and just beyond an option's bounds, with their text as a script gets it."""
    if option.kind == "int":
        low, high = int(option.low), int(option.high)
        cases: list[tuple[object, str]] = [(v, str(v)) for v in (low, high, low - 1, high + 1)]
        return [*cases, (low + 0.5, repr(low + 0.5))]
    if option.kind == "float":
        values = (
            option.low,
            option.high,
            math.nextafter(option.low, -math.inf),
            math.nextafter(option.high, math.inf),
        )
        return [(v, repr(float(v))) for v in values]
    if option.kind == "flag":
        return [(True, FLAG_WORDS[1]), (False, FLAG_WORDS[0]), (2, "2")]
    return [*((w, w) for w in option.words), ("nope", "nope")]


def python_accepts(option: Option, value: object) -> bool:
    try:
        option.encode("value", value)
    except InvalidLimitError:
        return False
    return True


def range_cases() -> list[tuple[str, str, str, str, bool]]:
    """Every (target, queue, field, text, accepted by Python) the range check tries."""
    out = []
    for queue, options in (("", ENV_OPTIONS), (QUEUE, QUEUE_OPTIONS)):
        for name, option in options.items():
            if not option.internal:
                for value, text in bound_cases(option):
                    out.append(("config", queue, name, text, python_accepts(option, value)))
    for name, option in OVERRIDE_OPTIONS.items():
        target, queue, field, template = _OVERRIDE_TARGETS[name]
        for value, text in bound_cases(option):
            out.append((target, queue, field, template.format(text), python_accepts(option, value)))
    return out


async def range_mismatches(rq: RunQueue, env: Environment) -> list[tuple[str, ...]]:
    """The changes configure.lua (as ``rq`` builds it) accepts and Python refuses, or the
    other way round."""
    tag = rq.keys.tag_of(env)
    out = []
    for target, queue, field, text, accepted in range_cases():
        try:
            await rq.call("configure", "age", tag, [env.id, target, queue, field, text], None)
            script_accepts = True
        except InvalidLimitError:
            script_accepts = False
        if script_accepts != accepted:
            verdict = "script accepts" if script_accepts else "script refuses"
            out.append((target, queue, field, text, verdict))
    return out


async def test_configure_accepts_exactly_the_ranges_python_accepts(
    make_queue: MakeQueue, env: Environment
) -> None:
    """Given every option and override at its bounds and just beyond, when configure.lua
    is called with each directly (no Python check before it), then it accepts exactly
    what the option table accepts: a window of 0 is refused by both."""
    rq: RunQueue = await make_queue()
    cases = range_cases()
    assert ("config", QUEUE, "window", "0", False) in cases
    assert ("config", "", "order", "nope", False) in cases
    assert len(cases) > 100
    assert await range_mismatches(rq, env) == []


#: configure.lua's option check before its ranges were generated (kinds only, ranges of
#: its own): what the range check must catch.
HAND_KEPT_CHECK = """\
    local kind = queue == '' and ENV_OPTION_KIND[field] or QUEUE_OPTION_KIND[field]
    if kind == nil or rule.internal then fail('unknown option ' .. field) end
    if kind == 'int' then
      arg_int(value, field, 0, UNLIMITED)
    elseif kind == 'float' then
      arg_num(value, field, 0, UNLIMITED)
    elseif kind == 'flag' then
      arg_word(value, field, {'0', '1'})
    end"""


def _hand_kept_configure(relative: str) -> str | None:
    text = _package_lua(relative)
    if relative != "configure.lua" or text is None:
        return text
    current = (
        "    if rule == nil or rule.internal then fail('unknown option ' .. field) end\n"
        "    check_rule(rule, field, value)"
    )
    assert current in text
    return text.replace(current, HAND_KEPT_CHECK)


async def test_the_range_check_fails_on_a_configure_with_ranges_of_its_own(
    make_queue: MakeQueue, env: Environment
) -> None:
    """The check can fail: fed the configure.lua that kept its own ranges, it reports the
    window of 0 (and every other value outside a range) the script let through."""
    rq: RunQueue = await make_queue()
    rq._scripts = ScriptRegistry(_hand_kept_configure, names=["configure"])
    found = await range_mismatches(rq, env)
    assert ("config", QUEUE, "window", "0", "script accepts") in found
    assert ("config", "", "order", "nope", "script accepts") in found
    assert ("config", QUEUE, "max_per_key", "1001", "script accepts") in found
