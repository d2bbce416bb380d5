"""The contracts across the Lua boundary are generated from Python tables, and checked here
on what the loader builds, so that a hand-kept copy on either side fails a test:

* option ranges: ``configure.lua`` accepts exactly the values the option table of
  :mod:`fairq.store.options` accepts (every option and override, at each bound and just
  beyond), because its rules are generated from that table. The configure.lua this
  module replaced, which checked kinds but kept its own ranges, fails the check.

Each check is a function fed a deliberately broken input in a test of its own, so that
the check itself is shown to be able to fail.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from importlib import resources
from typing import Any

from fairq.errors import InvalidLimitError
from fairq.keys import Environment
from fairq.store import RunQueue
from fairq.store.options import (
    ENV_OPTIONS,
    FLAG_WORDS,
    OVERRIDE_OPTIONS,
    QUEUE_OPTIONS,
    Option,
)
from fairq.store.scripts import ScriptRegistry

MakeQueue = Callable[..., Any]
QUEUE = "jobs"


def _package_lua(relative: str) -> str | None:
    path = resources.files("fairq.store").joinpath("lua", relative)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


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
