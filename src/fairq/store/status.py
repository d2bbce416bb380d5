"""The one reply vocabulary across the Lua boundary.

Every status a script can return is a member of :class:`Status`; its numeric value is
what the script returns. The loader generates the Lua table ``S`` from this enum (so a
script writes ``S.ACKED``, never ``1``), and :func:`decode` is the one place that turns
a returned number back into a :class:`Status`, raising on a code the script is not
allowed to return. :data:`REPLIES` lists, per operation, the statuses it may return.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Final, Generic, TypeVar

from fairq.errors import ScriptProtocolError


class Status(enum.IntEnum):
    """Every outcome a script can report (values are unique across all scripts)."""

    # enqueue, per run
    ENQUEUED = 1
    DUPLICATE = 2
    REJECTED_SIZE = 3
    # finishing, per run
    ACKED = 10
    REQUEUED = 11
    DEAD_LETTERED = 12
    EXTENDED = 13
    RELEASED = 14
    NOT_HELD = 15
    # per-run refusals shared by the finishing scripts
    UNKNOWN_RUN = 20
    LEASE_LOST = 21
    # a running run whose cancellation was requested (heartbeat tells its worker)
    CANCEL_REQUESTED = 22
    # dead letters and cancel
    REDRIVEN = 30
    NOT_IN_DLQ = 31
    CANCELLED = 32
    REMOVED_FROM_DLQ = 33
    ALREADY_FINISHED = 34
    #: cancel with a required state: the run is in another one (nothing changed)
    NOT_IN_STATE = 35
    # whole-call outcomes
    OK = 40
    #: The age-order script met a queue whose order is fair; nothing was written.
    NEEDS_FAIR = 41
    #: Another caller already claimed this schedule tick: nothing was written.
    TICK_TAKEN = 50


#: Which statuses each operation may return (anything else is a protocol error).
REPLIES: Final[dict[str, frozenset[Status]]] = {
    "enqueue": frozenset(
        {
            Status.ENQUEUED,
            Status.DUPLICATE,
            Status.REJECTED_SIZE,
            Status.OK,
            Status.NEEDS_FAIR,
            Status.TICK_TAKEN,
        }
    ),
    "dequeue": frozenset({Status.OK, Status.NEEDS_FAIR}),
    "dequeue_variant": frozenset({Status.OK}),
    "ack": frozenset({Status.ACKED, Status.UNKNOWN_RUN, Status.LEASE_LOST}),
    "nack": frozenset(
        {
            Status.REQUEUED,
            Status.DEAD_LETTERED,
            Status.CANCELLED,
            Status.UNKNOWN_RUN,
            Status.LEASE_LOST,
        }
    ),
    "heartbeat": frozenset(
        {Status.EXTENDED, Status.CANCEL_REQUESTED, Status.UNKNOWN_RUN, Status.LEASE_LOST}
    ),
    "release": frozenset({Status.RELEASED, Status.NOT_HELD, Status.UNKNOWN_RUN, Status.LEASE_LOST}),
    "redrive": frozenset({Status.REDRIVEN, Status.NOT_IN_DLQ}),
    "cancel": frozenset(
        {
            Status.CANCELLED,
            Status.REMOVED_FROM_DLQ,
            Status.CANCEL_REQUESTED,
            Status.UNKNOWN_RUN,
            Status.ALREADY_FINISHED,
            Status.NOT_IN_STATE,
        }
    ),
    "reclaim": frozenset({Status.OK}),
    "expire_ttl": frozenset({Status.OK}),
    "configure": frozenset({Status.OK}),
    "seed_counters": frozenset({Status.OK}),
    "audit": frozenset({Status.OK}),
    "quota_ledger": frozenset({Status.OK}),
    "quota_partition": frozenset({Status.OK}),
    "sample_shares": frozenset({Status.OK}),
}


def decode(operation: str, code: object) -> Status:
    """The :class:`Status` a script of ``operation`` returned.

    Raises:
        ScriptProtocolError: the value is not a status, or not one this operation returns.
    """
    try:
        status = Status(int(code))  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise ScriptProtocolError(operation, code) from None
    if status not in REPLIES[operation]:
        raise ScriptProtocolError(operation, code)
    return status


V = TypeVar("V")


class ReplyMemo(Generic[V]):
    """What short text replies parse to, kept by their bytes: a one-run call's reply is
    one of a few texts, and parsing it again on every call cost more than a lookup. Only
    replies of at most MEMO_BYTES are kept, at most MEMO_SIZE of them (all forgotten at
    once when full); a reply whose parse raises is not kept, so it raises on every call.
    """

    MEMO_BYTES: Final = 32
    MEMO_SIZE: Final = 256

    def __init__(self, parse: Callable[[bytes], V]) -> None:
        self._parse = parse
        self._values: dict[bytes, V] = {}

    def __call__(self, reply: bytes) -> V:
        try:  # (one lookup: another thread may clear the memo between two)
            return self._values[reply]
        except KeyError:
            pass
        value = self._parse(reply)
        if len(reply) <= self.MEMO_BYTES:
            if len(self._values) >= self.MEMO_SIZE:
                self._values.clear()
            self._values[reply] = value
        return value

    def __len__(self) -> int:
        return len(self._values)

    def __contains__(self, reply: object) -> bool:
        return reply in self._values


def lua_status_table() -> str:
    """The Lua table ``S`` (generated into every script's prelude)."""
    body = ", ".join(f"{s.name} = {s.value}" for s in Status)
    return f"-- generated from fairq/store/status.py: the reply vocabulary\nlocal S = {{ {body} }}"
