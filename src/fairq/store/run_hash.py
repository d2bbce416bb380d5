"""The run hash (``T:m:E:<run>``, see :mod:`fairq.keys`): its fields, by name, in one table.

A run's hash stores each field under a short name (it is written for every run).
:data:`RUN_FIELDS` is the one list of them: what each means, its stored name and its type.
Nothing else spells a stored name:

* the loader generates into every library the Lua table ``RUN_FIELD`` (name -> stored
  name) that the scripts write fields with, ``redis.call('HSET', mkey, RUN_FIELD.state,
  'running')``, and one reader per entry of :data:`RUN_READS` the library calls
  (:func:`lua_run_hash`). A reader returns the fields in its entry's order, and a script
  binds them to locals of the same names, ``local queue, ck, state = run_read_redrive(mkey)``
  (the loader test checks the names), so no script reads a field by its position;
* the Python readers read with :func:`stored` and :func:`by_name`.

:data:`DELIVERY_FIELDS` is the layout of one delivered run in a dequeue reply, generated
into the library as the appender the claim writes it with (:func:`lua_delivery`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from fairq.outcomes import STATE_STATUS

Kind = Literal["text", "int", "ms", "json", "word"]


@dataclass(frozen=True, slots=True)
class RunField:
    """One field of the run hash."""

    #: Its name in the hash (short: every run stores it).
    stored: str
    kind: Kind
    #: What it holds.
    meaning: str
    #: The value a field with a default stands for while absent: an enqueue writes it
    #: only when it differs, and every reader returns it for a missing field, so no
    #: script or Python reader keeps a fallback of its own (None: no default; the
    #: readers return a missing field as missing). The level and the timeout have none:
    #: their readers want numbers (a missing level is the base level, level_view's nil; a
    #: missing timeout is delivered as the number 0, cheaper in a reply than a text).
    absent: str | None = None


#: Every field of the run hash, by name.
RUN_FIELDS: Final[dict[str, RunField]] = {
    "queue": RunField("q", "text", "the run's queue"),
    "ck": RunField("k", "text", "its encoded concurrency key ('' = none)", absent=""),
    "tenant": RunField("n", "text", "the encoded tenant its enqueue named ('' = none)", absent=""),
    "payload": RunField("p", "json", "its payload"),
    "score": RunField("s", "ms", "its place in its queue: available at - priority"),
    "enqueued_at": RunField("t", "ms", "when it was enqueued"),
    "attempts": RunField("a", "int", "failed attempts so far", absent="0"),
    "lease_token": RunField(
        "d", "int", "deliveries so far: the lease token of the last", absent="0"
    ),
    "ttl_deadline": RunField("x", "ms", "when it expires unless delivered (0 = never)", absent="0"),
    "state": RunField("st", "word", "queued | running | dlq (see RUN_STATES)"),
    "lease_deadline": RunField("l", "ms", "when its lease lapses (a dead letter: when it died)"),
    "lease_start": RunField("ls", "ms", "when its last delivery leased it"),
    "slot_tenant": RunField(
        "ta",
        "text",
        "the named tenant whose slot count it holds while running ('' = none)",
        absent="",
    ),
    "outcome_policy": RunField(
        "o", "word", "'keep': keep a completion's outcome without result", absent=""
    ),
    "timeout": RunField("to", "ms", "how long one attempt may run (absent = no limit)"),
    "trace": RunField("tc", "text", "the trace context of its enqueue ('' = none)", absent=""),
    "error": RunField("e", "text", "the error of its last failed attempt"),
    "traceback": RunField("tb", "text", "the traceback of its last failed attempt"),
    "cancel_requested": RunField("cx", "ms", "when a cancellation was asked while it ran"),
    "progress": RunField("pg", "text", "the last progress its task reported: fraction:message"),
    "level": RunField("lv", "int", "its priority level (absent = level 3, the base level)"),
}

#: The ``outcome_policy`` of a run whose completion's outcome is kept without a result.
KEEP_OUTCOME: Final = "keep"
#: The values of the ``outcome_policy`` field ('' = the default policy).
OUTCOME_POLICIES: Final = ("", KEEP_OUTCOME)

#: The values of the ``state`` field (the run states :mod:`fairq.outcomes` reports).
RUN_STATES: Final = tuple(STATE_STATUS)

#: What each script (or include) reads of a run hash, in the order its reader returns
#: the fields: ``run_read_<name>`` in Lua.
RUN_READS: Final[dict[str, tuple[str, ...]]] = {
    "ack": (
        "queue", "ck", "state", "lease_token", "attempts", "lease_start", "slot_tenant", "level",
    ),
    "nack": (
        "queue", "ck", "state", "lease_token", "attempts", "slot_tenant", "tenant", "lease_start",
        "cancel_requested", "level",
    ),
    "heartbeat": ("state", "lease_token", "cancel_requested"),
    "release": ("queue", "ck", "state", "lease_token", "slot_tenant"),
    "cancel": ("queue", "ck", "state", "attempts", "ttl_deadline", "tenant", "level"),
    "redrive": ("queue", "ck", "state", "tenant", "level"),
    "reclaim": (
        "queue", "ck", "state", "score", "slot_tenant", "tenant", "lease_start",
        "cancel_requested", "attempts", "level",
    ),
    "expire_ttl": ("queue", "ck", "state", "attempts", "tenant", "level"),
    "promote": ("queue", "ck", "state", "tenant", "score", "level"),
    "claim": (
        "payload", "attempts", "score", "enqueued_at", "ttl_deadline", "lease_token", "timeout",
        "outcome_policy", "trace",
    ),
    "running_truth": ("queue", "ck", "slot_tenant"),
}  # fmt: skip

#: One delivered run in a dequeue reply, in this order (what a worker needs to run it).
DELIVERY_FIELDS: Final = (
    "run_id", "queue", "payload", "ck", "tenant", "attempts", "lease_token", "score",
    "enqueued_at", "timeout", "outcome_policy", "trace",
)  # fmt: skip
#: Where each of them is in its delivery's slice of the reply.
DELIVERY_OFFSET: Final = {name: i for i, name in enumerate(DELIVERY_FIELDS)}

#: A call of a generated reader in Lua source.
READ_CALL_RE: Final = re.compile(r"\brun_read_([a-z_]+)\(")


def stored(names: Iterable[str]) -> list[str]:
    """The stored names of run-hash fields (for an HMGET).

    Raises:
        KeyError: a name that is not a field.
    """
    return [RUN_FIELDS[name].stored for name in names]


def read(names: Sequence[str], values: Sequence[Any]) -> list[Any]:
    """An HMGET reply of ``stored(names)``, each missing field with a default as its
    default (:attr:`RunField.absent`); a field without one stays None."""
    out = list(values)
    if len(out) != len(names):
        raise ValueError(f"{len(out)} values for {len(names)} run-hash fields")
    for i, name in enumerate(names):
        if out[i] is None:
            out[i] = RUN_FIELDS[name].absent
    return out


def by_name(names: Sequence[str], values: Sequence[Any]) -> dict[str, Any]:
    """An HMGET reply of ``stored(names)`` by field name (as :func:`read`)."""
    return dict(zip(names, read(names, values), strict=True))


def reads_called(source: str) -> list[str]:
    """The readers Lua ``source`` calls, in :data:`RUN_READS` order.

    Raises:
        ValueError: a call of a reader that is not in :data:`RUN_READS`.
    """
    called = set(READ_CALL_RE.findall(source))
    unknown = sorted(called - RUN_READS.keys())
    if unknown:
        raise ValueError(f"unknown run-hash reader(s) {unknown}; known: {sorted(RUN_READS)}")
    return [name for name in RUN_READS if name in called]


def _lua_value(name: str, i: int) -> str:
    absent = RUN_FIELDS[name].absent
    return f"f[{i}]" if absent is None else f"f[{i}] or '{absent}'"


def _lua_reader(name: str) -> str:
    fields = RUN_READS[name]
    args = ", ".join(f"'{RUN_FIELDS[f].stored}'" for f in fields)
    values = ", ".join(_lua_value(f, i) for i, f in enumerate(fields, start=1))
    return "\n".join(
        [
            f"-- {', '.join(fields)}",
            f"local function run_read_{name}(mkey)",
            f"  local f = redis.call('HMGET', mkey, {args})",
            f"  return {values}",
            "end",
        ]
    )


def lua_run_hash(reads: Iterable[str]) -> str:
    """The Lua table ``RUN_FIELD`` and the readers ``reads`` (generated into a library)."""
    names = ", ".join(f"{name} = '{f.stored}'" for name, f in RUN_FIELDS.items())
    return "\n".join(
        [
            "-- generated from fairq/store/run_hash.py: the run hash's fields, and its reads",
            f"local RUN_FIELD = {{ {names} }}",
            f"local RUN_STATES = {{ {', '.join(repr(w) for w in RUN_STATES)} }}",
            *(_lua_reader(name) for name in reads),
        ]
    )


def lua_delivery() -> str:
    """The Lua appender of one delivered run to a dequeue reply (generated into a library)."""
    params = ", ".join(DELIVERY_FIELDS)
    lines = [
        "-- generated from fairq/store/run_hash.py: one delivered run in a dequeue reply",
        f"local function delivery_add(out, {params})",
        "  local n = #out",
    ]
    lines += [f"  out[n + {i}] = {name}" for i, name in enumerate(DELIVERY_FIELDS, start=1)]
    lines.append("end")
    return "\n".join(lines)
