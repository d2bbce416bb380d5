"""Limits and scheduling options stored on the server: names, types, ranges.

An environment's config hash (``V:config``, see :mod:`fairq.keys`) holds the
environment's own values under their names and each queue's under ``q:<queue>:<name>``.
A value a queue does not set falls back to the environment's, then to the process
defaults (:class:`fairq.config.RunQueueConfig`), so every process reads the same
settings from the server. :data:`ENV_OPTIONS` and :data:`QUEUE_OPTIONS` are the one list
of names: the admin code validates against them and the loader generates the Lua tables
the scripts read them with (:func:`lua_options`), including the rules ``configure.lua``
checks a value against (kind, range, words), so a value Python refuses the script refuses
too, and the other way round. :data:`OVERRIDE_OPTIONS` does the same for the per-key and
per-tenant overrides (caps, rate limits, weights).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal

from fairq.config import MAX_LIMIT, MAX_WEIGHT, as_float
from fairq.errors import InvalidLimitError

Kind = Literal["int", "float", "word", "flag"]

#: How a flag is stored: off, on.
FLAG_WORDS: Final = ("0", "1")


@dataclass(frozen=True, slots=True)
class Option:
    """One stored option: its type and allowed values."""

    kind: Kind
    low: float = 0
    high: float = MAX_LIMIT
    words: tuple[str, ...] = ()
    #: What it means, for ``fairq limits`` help and errors.
    help: str = ""
    #: Kept by fairq itself (never set by a user): a flag the scripts read instead of
    #: probing for a key.
    internal: bool = False

    def encode(self, name: str, value: object) -> str:
        """The stored text of a valid value.

        Raises:
            InvalidLimitError: wrong type or out of range (the message names ``name``).
        """
        if self.kind == "flag":
            if not isinstance(value, bool):
                raise InvalidLimitError(name, value, "must be True or False")
            return FLAG_WORDS[value]
        if self.kind == "word":
            if value not in self.words:
                raise InvalidLimitError(name, value, f"must be one of {', '.join(self.words)}")
            return str(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidLimitError(name, value, "must be a number")
        if self.kind == "int" and not isinstance(value, int):
            if not (isinstance(value, float) and value.is_integer()):
                raise InvalidLimitError(name, value, "must be an integer")
            value = int(value)
        number = as_float(value)
        if not math.isfinite(number) or not self.low <= number <= self.high:
            raise InvalidLimitError(name, value, f"must be in {self.low:g}..{self.high:g}")
        return str(int(value)) if self.kind == "int" else repr(number)


_ORDER = Option("word", words=("age", "fair"), help="dequeue order: age or fair")
_MAX_PER_KEY = Option("int", 1, 1000, help="runs one dequeue call may take from one key")
_QUANTUM = Option("float", 1e-6, 1e6, help="virtual time charged per run")
_WINDOW = Option("int", 1, 100, help="candidates considered per run asked for")
_JOIN = Option("word", words=("floor", "behind_leader"), help="where a new key starts")
_ARRIVAL_CAP = Option("float", 0, 1e10, help="how far above the floor a new key may start")
_CHARGE = Option("word", words=("count", "duration"), help="charge per run or per run time")
_ADMISSION = Option("word", words=("floor", "budget"), help="where a new tenant starts")

#: Options of an environment (also the defaults of its queues where a queue has the same).
ENV_OPTIONS: Final[dict[str, Option]] = {
    "concurrency": Option("int", 0, MAX_LIMIT, help="runs in flight across its queues"),
    "burst_factor": Option("float", 1, 100, help="one queue may use concurrency x burst"),
    "max_queue_size": Option("int", 0, MAX_LIMIT, help="default size limit of its queues"),
    "order": _ORDER,
    "max_per_key": _MAX_PER_KEY,
    "quantum": _QUANTUM,
    "window": _WINDOW,
    "join": _JOIN,
    "arrival_cap": _ARRIVAL_CAP,
    "charge": _CHARGE,
    "admission": _ADMISSION,
    "weights": Option("flag", internal=True, help="some tenant of the env has a weight"),
    "pool_all": Option(
        "int", 0, 2**48, internal=True, help="a consumer pool found to serve every queue"
    ),
}

#: Options of one queue (stored as ``q:<queue>:<name>``).
QUEUE_OPTIONS: Final[dict[str, Option]] = {
    "concurrency": Option("int", 0, MAX_LIMIT, help="runs in flight per key (keyless: total)"),
    "max_size": Option("int", 0, MAX_LIMIT, help="runs queued across keyless runs and keys"),
    "paused": Option("flag", help="no new runs start while paused (limits are kept)"),
    "total": Option("int", 0, MAX_LIMIT, help="runs in flight across all keys and keyless runs"),
    "rate": Option("float", 1e-6, 1e6, help="runs started per second, whole queue"),
    "rate_burst": Option("int", 1, 1_000_000, help="burst of the queue's rate limit"),
    "key_rate": Option("float", 1e-6, 1e6, help="runs started per second, per key"),
    "key_rate_burst": Option("int", 1, 1_000_000, help="burst of the per-key rate limit"),
    "tenant_rate": Option("float", 1e-6, 1e6, help="runs started per second, per tenant"),
    "tenant_rate_burst": Option("int", 1, 1_000_000, help="burst of the per-tenant rate limit"),
    "borrow": Option("flag", help="capped keys/tenants may borrow idle slots"),
    "order": _ORDER,
    "max_per_key": _MAX_PER_KEY,
    "quantum": _QUANTUM,
    "window": _WINDOW,
    "join": _JOIN,
    "arrival_cap": _ARRIVAL_CAP,
    "charge": _CHARGE,
    "admission": _ADMISSION,
    "weights": Option("flag", internal=True, help="some key of the queue has a weight"),
    "overrides": Option("flag", internal=True, help="the queue has cap or rate overrides"),
    "named": Option("flag", internal=True, help="some flow of the queue has a named tenant"),
    "parked": Option("flag", internal=True, help="the fair order parked something of the queue"),
    "unregistered": Option(
        "flag", internal=True, help="the fair order's discovery found flows nothing registered"
    ),
    "priority_levels": Option(
        "int", 1, 9, help="priority levels (1 is the highest; a run defaults to the middle one)"
    ),
    "max_wait_promote": Option(
        "float", 0.001, 31_536_000, help="seconds a run waits before it moves up one level"
    ),
    "levels": Option(
        "int", 0, 1023, internal=True, help="priority levels that have their own keys (bits)"
    ),
    "pool": Option(
        "int", 0, 2**48, internal=True, help="the consumer pool whose fair state it joins"
    ),
}

#: A rate limit override of one key or tenant: ``rate:burst`` (runs per second, burst).
RATE_OVERRIDE: Final = Option("float", 1e-6, 1e6, help="runs started per second")
BURST_OVERRIDE: Final = Option("int", 1, 1_000_000, help="burst of a rate limit")
#: A concurrency cap of one key or tenant.
CAP_OVERRIDE: Final = Option("int", 0, MAX_LIMIT, help="runs in flight of one key or tenant")
#: A weight in the fair order (of a key, a tenant or an environment).
WEIGHT_OVERRIDE: Final = Option("float", 1 / MAX_WEIGHT, MAX_WEIGHT, help="fair-order weight")

#: The overrides configure.lua stores per key, tenant or environment, by what they set.
OVERRIDE_OPTIONS: Final[dict[str, Option]] = {
    "cap": CAP_OVERRIDE,
    "rate": RATE_OVERRIDE,
    "rate_burst": BURST_OVERRIDE,
    "weight": WEIGHT_OVERRIDE,
}


def parse_rate(value: str | float | int) -> float:
    """``"100/s"``, ``"30/m"``, ``"5/h"`` or a number of runs per second.

    Raises:
        InvalidLimitError: not a rate.
    """
    if isinstance(value, bool):
        raise InvalidLimitError("rate", value, "must be like '100/s', '30/m' or a number")
    if isinstance(value, int | float):
        per_second = as_float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        amount, _, unit = text.partition("/")
        seconds = {"": 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}.get(unit)
        try:
            count = float(amount)
        except ValueError:
            count = math.nan
        if seconds is None or not math.isfinite(count):
            raise InvalidLimitError("rate", value, "must be like '100/s', '30/m' or '5/h'")
        per_second = count / seconds
    else:
        raise InvalidLimitError("rate", value, "must be like '100/s', '30/m' or a number")
    RATE_OVERRIDE.encode("rate", per_second)
    return per_second


def _lua_number(kind: Kind, value: float) -> str:
    return str(int(value)) if kind == "int" else repr(float(value))


def _lua_words(words: tuple[str, ...]) -> str:
    return "{" + ", ".join(f"'{w}'" for w in words) + "}"


def lua_rule(option: Option) -> str:
    """One option's rule as a Lua table: what configure.lua checks a value against."""
    parts = [f"kind = '{option.kind}'"]
    if option.kind in ("int", "float"):
        low, high = _lua_number(option.kind, option.low), _lua_number(option.kind, option.high)
        parts += [f"low = {low}", f"high = {high}"]
    else:
        parts.append(f"words = {_lua_words(option.words or FLAG_WORDS)}")
    if option.internal:
        parts.append("internal = true")
    return "{" + ", ".join(parts) + "}"


def lua_options() -> str:
    """The Lua tables of option names and kinds, and the rules of every option and
    override (generated into the prelude)."""

    def names(options: dict[str, Option]) -> str:
        return ", ".join(f"'{n}'" for n in options)

    def kinds(options: dict[str, Option]) -> str:
        return ", ".join(f"{n} = '{o.kind}'" for n, o in options.items())

    def rules(options: dict[str, Option]) -> str:
        return ",\n".join(f"    {n} = {lua_rule(o)}" for n, o in options.items())

    return "\n".join(
        [
            "-- generated from fairq/store/options.py: stored limits and options",
            f"local ENV_OPTIONS = {{ {names(ENV_OPTIONS)} }}",
            f"local QUEUE_OPTIONS = {{ {names(QUEUE_OPTIONS)} }}",
            f"local ENV_OPTION_KIND = {{ {kinds(ENV_OPTIONS)} }}",
            f"local QUEUE_OPTION_KIND = {{ {kinds(QUEUE_OPTIONS)} }}",
            "-- what a stored value must be (configure.lua checks every change against it)",
            "local OPTION_RULES = {",
            f"  env = {{\n{rules(ENV_OPTIONS)}\n  }},",
            f"  queue = {{\n{rules(QUEUE_OPTIONS)}\n  }},",
            f"  override = {{\n{rules(OVERRIDE_OPTIONS)}\n  }},",
            "}",
        ]
    )
