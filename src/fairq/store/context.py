"""The script context: the named, typed values the Python side hands to every script.

:data:`CONTEXT_FIELDS` is the one ordered list of context names. A script declares the
names it uses in its header (``--@context now counter_ttl``); the loader generates, for
that script only, the Lua bindings ``C.<name>`` that read and check those ARGV slots
(numbers must be numbers before anything is written), and :meth:`ScriptContext.argv`
encodes exactly those values in the same order (``now`` in the first slot, the rest in
one space-separated slot). So a script receives only the context it uses, and a name or
type mismatch between the two sides fails at load time, not as a silently misread slot.

``now`` is special: an empty string means "the server's clock" (the script reads
``TIME``); tests and the simulator pass an explicit logical clock in milliseconds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final, Literal

from fairq.config import RunQueueConfig

Kind = Literal["clock", "int", "float", "str"]

#: Every context name, in ARGV order, with its Lua type.
CONTEXT_FIELDS: Final[tuple[tuple[str, Kind], ...]] = (
    ("now", "clock"),
    ("counter_ttl", "int"),
    ("state_ttl", "int"),
    ("outcome_ttl", "int"),
    ("wake_channel", "str"),
    ("default_env_concurrency", "int"),
    ("default_burst_factor", "float"),
    ("default_queue_size_limit", "int"),
    ("default_order", "str"),
    ("default_max_per_key", "int"),
    ("default_quantum", "float"),
    ("default_window", "int"),
    ("default_join", "str"),
    ("default_arrival_cap", "float"),
    ("default_admission", "str"),
    ("default_charge", "str"),
    ("charge_unit_ms", "int"),
    ("recent_runs", "int"),
)
CONTEXT_NAMES: Final = tuple(name for name, _ in CONTEXT_FIELDS)
_KINDS: Final = dict(CONTEXT_FIELDS)


@dataclass(frozen=True, slots=True)
class ScriptContext:
    """The process-level values (from :class:`RunQueueConfig`) every script may read."""

    counter_ttl: int
    state_ttl: int
    outcome_ttl: int
    wake_channel: str
    default_env_concurrency: int
    default_burst_factor: float
    default_queue_size_limit: int
    default_order: str
    default_max_per_key: int
    default_quantum: float
    default_window: int
    default_join: str
    default_arrival_cap: float
    default_admission: str
    default_charge: str
    charge_unit_ms: int
    recent_runs: int
    #: The packed slot per set of names (the values never change in a process).
    _packed_by_names: dict[tuple[str, ...], str] = field(
        default_factory=dict, compare=False, repr=False
    )

    @classmethod
    def from_config(cls, config: RunQueueConfig, wake_channel: str) -> ScriptContext:
        vt = config.vtime
        return cls(
            counter_ttl=config.counter_ttl_seconds,
            state_ttl=vt.state_ttl_seconds,
            outcome_ttl=config.outcome_ttl_seconds,
            wake_channel=wake_channel,
            default_env_concurrency=config.default_env_concurrency,
            default_burst_factor=config.default_burst_factor,
            default_queue_size_limit=config.default_queue_size_limit,
            default_order="fair" if vt.enabled else "age",
            default_max_per_key=config.max_per_key_per_call or 0,
            default_quantum=vt.quantum,
            default_window=vt.scan_window_multiplier,
            default_join=vt.join_policy,
            default_arrival_cap=vt.arrival_cap,
            default_admission=vt.admission,
            default_charge=vt.charge,
            charge_unit_ms=vt.charge_unit_ms,
            recent_runs=config.recent_runs,
        )

    def argv(self, names: tuple[str, ...], now_ms: int | None) -> list[str]:
        """The ARGV prefix for a script that declared ``names`` (in CONTEXT_FIELDS order):
        ``now`` (if declared) in its own slot, then every other value in one slot,
        space-separated and built once per set of names (it never changes in a process),
        so a call encodes two context arguments instead of one per name."""
        out: list[str] = []
        if names and names[0] == "now":
            out.append("" if now_ms is None else str(int(now_ms)))
            names = names[1:]
        if names:
            out.append(self._packed(names))
        return out

    def _packed(self, names: tuple[str, ...]) -> str:
        cache = self._packed_by_names
        packed = cache.get(names)
        if packed is None:
            values = []
            for name in names:
                value = getattr(self, name)
                text = repr(float(value)) if _KINDS[name] == "float" else str(value)
                if not text or any(c.isspace() for c in text):
                    raise ValueError(f"context {name} {text!r} must be one word")
                values.append(text)
            packed = cache[names] = " ".join(values)
        return packed


#: Distinct packed context slots a library keeps parsed (one per process configuration
#: calling it; a server shared by more configurations parses the others on each call).
CONTEXT_CACHE_SIZE: Final = 32


def lua_context_cache() -> str:
    """Library-level Lua: the parsed context per packed slot. The packed values never
    change in a process, so each library parses a given slot once (the parsing cost
    15-20 commands' worth of Lua per call); a parsed table holds only constants, and
    ``C.now`` is set on it at the start of every call, before anything reads it."""
    return "\n".join(
        [
            "-- generated from fairq/store/context.py: parsed context slots",
            "local CONTEXT_CACHE, CONTEXT_CACHED = {}, 0",
        ]
    )


def lua_bindings(names: tuple[str, ...]) -> str:
    """The Lua that binds and checks ``C.<name>`` for a script's declared context names:
    ``now`` from its own slot, the others from one space-separated slot (parsed once per
    distinct slot, see :func:`lua_context_cache`)."""
    lines = ["-- generated from fairq/store/context.py: this script's context"]
    has_now = bool(names) and names[0] == "now"
    slot = 2 if has_now else 1
    names = names[1:] if has_now else names
    if names:
        lines += [
            f"local C = CONTEXT_CACHE[ARGV[{slot}] or '']",
            "if C == nil then",
            "  C = {}",
            "  local packed = {}",
            f"  for word in string.gmatch(ARGV[{slot}] or '', '%S+') do",
            "    packed[#packed + 1] = word",
            "  end",
            f"  if #packed ~= {len(names)} then",
            f"    error({{err = 'FQ2 context needs {len(names)} values'}})",
            "  end",
        ]
        for i, name in enumerate(names, start=1):
            if _KINDS[name] == "str":
                lines.append(f"  C.{name} = packed[{i}]")
                continue
            lines.append(f"  C.{name} = tonumber(packed[{i}])")
            lines.append(
                f"  if C.{name} == nil or C.{name} ~= C.{name} then "
                f"error({{err = 'FQ2 context {name} is not a number'}}) end"
            )
        lines += [
            f"  if CONTEXT_CACHED >= {CONTEXT_CACHE_SIZE} then",
            "    CONTEXT_CACHE, CONTEXT_CACHED = {}, 0",
            "  end",
            f"  CONTEXT_CACHE[ARGV[{slot}]] = C",
            "  CONTEXT_CACHED = CONTEXT_CACHED + 1",
            "end",
        ]
    else:
        lines.append("local C = {}")
    if has_now:
        lines += [
            "if ARGV[1] == '' then",
            "  -- (the texts turned into numbers by arithmetic: tonumber and math.floor are",
            "  -- C calls, each costing more than a small command's argument)",
            "  local t = redis.call('TIME')",
            "  local us = t[2] + 0",
            "  C.now = t[1] * 1000 + (us - us % 1000) / 1000",
            "else",
            "  C.now = tonumber(ARGV[1])",
            "end",
            "if C.now == nil or C.now ~= C.now then",
            "  error({err = 'FQ2 context now is not a number'})",
            "end",
        ]
    lines.append(f"local FIRST_ARG = {slot + 1 if names else slot}")
    return "\n".join(lines)


#: A read of a context field in Lua (``C.<name>``, also through ``X.C.<name>``).
_CONTEXT_READ_RE: Final = re.compile(r"\bC\.([A-Za-z_][A-Za-z0-9_]*)")


def context_read(code: str) -> tuple[str, ...]:
    """The context names a build's Lua reads, in canonical order: what its calls send.

    Raises:
        ValueError: a read of a name that is not a context field.
    """
    return order_names(list(dict.fromkeys(_CONTEXT_READ_RE.findall(code))))


def order_names(names: list[str]) -> tuple[str, ...]:
    """Declared names in canonical order.

    Raises:
        ValueError: a name that is not a context field.
    """
    unknown = [n for n in names if n not in _KINDS]
    if unknown:
        raise ValueError(f"unknown context name(s) {unknown}; known: {list(CONTEXT_NAMES)}")
    return tuple(n for n in CONTEXT_NAMES if n in names)


#: Every field of a script's per-call state ``X`` (``include/state.lua``), with what it
#: holds. ``lazy``: a table made on first use (state.lua's STATE_TABLES, generated from
#: here); the others are set by the code that owns them. The loader refuses a build
#: whose Lua names an ``X`` field this table does not declare.
STATE_FIELDS: Final[dict[str, tuple[bool, str]]] = {
    "C": (False, "the call's context (context fields, and `now`)"),
    "tag": (False, "the shard tag every key of the call starts with"),
    "now": (False, "the call's clock (ms)"),
    "heads": (False, "the shard's heads index key"),
    "leases": (False, "the shard's lease index key"),
    "ttl": (False, "the shard's TTL index key"),
    "wake": (False, "publish a wake-up hint at the flush"),
    "made": (False, "some lazy table was made: the flush has work"),
    "now_text": (False, "the clock as text, made once (recent lists)"),
    "bucket_text": (False, "the history bucket's number as text, made once"),
    "head_known": (False, "B -> the keyless queue's head a claim just learned (false: empty)"),
    "charge_env": (False, "the dequeue charges the environment's place among its shard's"),
    "parked_now": (False, "the fair serve parked something in this round"),
    "tfloor": (False, "V -> the tenant floor read in this call {value, start, stored}"),
    "kfloor": (False, "key set name -> a key floor read in this call {value, dirty}"),
    "kadded": (False, "B|tenant -> true: keys joined that tenant's set in this call"),
    "solo_live": (False, "B -> tenant -> a serve's record of its one key (B:tsolo entry)"),
    "solo_none": (False, "B -> a serve's probe found no B:tsolo entries (none written since)"),
    "hpark": (False, "parked-due key -> whether it may hold members (probed once)"),
    "qconf": (False, "B -> a run's queue config read by a hook"),
    "qcharge": (False, "B -> {duration, parked}: how a run's queue charges"),
    "parked_levels": (False, "B -> the views of its levels where something may be parked"),
    "slots_held": (False, "flow slot set -> slots it holds (read once, then tracked)"),
    "queue_in_flight": (False, "B -> runs of the queue in flight (its total cap)"),
    "overrides": (False, "B -> which override hashes the queue has, and values read"),
    "buckets": (False, "B -> token buckets read in this call"),
    "counter_value": (True, "counter key -> its value in this call"),
    "counter_delta": (True, "counter key -> pending delta"),
    "counter_seed": (True, "counter key -> the function seeding it from the truth"),
    "tenant_running_seeded": (True, "B's tenant hash was seeded in this call"),
    "tenant_running_base": (True, "B -> tenant -> runs in flight before this call"),
    "tenant_running_delta": (True, "B -> tenant -> pending delta"),
    "tenant_running_queue": (True, "B -> the queue whose truth reseeds its tenant hash"),
    "runq": (True, "env -> queue -> the queue context of runs read from their hashes"),
    "env_take": (True, "V -> runs taking an environment slot (the flush adds them)"),
    "env_free": (True, "V -> runs giving one back"),
    "lease_add": (True, "deadline, member pairs for the lease index"),
    "lease_del": (True, "members leaving the lease index"),
    "ttl_del": (True, "members leaving the TTL index"),
    "free_groups": (True, "slot sets to free runs from, in order (ack)"),
    "free_by": (True, "B|flow|tenant -> its group"),
    "ckidx": (True, "B -> ck_index head moves not written yet"),
    "deletes": (True, "keys known to exist, deleted with the flush's gated flags"),
    "recent": (True, "B -> recent-list lines"),
    "history": (True, "B -> history bucket counts"),
    "touched": (True, "B|kind -> a heads-index member to re-score"),
}

#: A use of a per-call state field in Lua (``X.<name>``).
_STATE_FIELD_RE: Final = re.compile(r"\bX\.([A-Za-z_][A-Za-z0-9_]*)")


def check_state_fields(code: str) -> None:
    """Refuse Lua that names a field of ``X`` that :data:`STATE_FIELDS` does not declare.

    Raises:
        ValueError: naming the undeclared fields.
    """
    unknown = sorted(set(_STATE_FIELD_RE.findall(code)) - set(STATE_FIELDS))
    if unknown:
        raise ValueError(f"undeclared per-call state field(s) X.{', X.'.join(unknown)}")


def lua_state_tables() -> str:
    """Library-level Lua: the lazy per-call tables of X (STATE_TABLES in state.lua)."""
    lazy = ", ".join(f"{name} = true" for name, (is_lazy, _) in STATE_FIELDS.items() if is_lazy)
    header = "-- generated from fairq/store/context.py: X's lazy tables"
    return f"{header}\nlocal STATE_TABLES = {{ {lazy} }}"
