"""The validation layer at the API boundary: every value is checked here, before any
script runs, and refused with a fairq error whose message repeats at most a short part
of the value. (The scripts check their arguments again before their first write.)
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

from fairq.config import MAX_DEQUEUE_COUNT, MAX_LIMIT, as_float
from fairq.errors import InvalidLimitError, PayloadError
from fairq.keys import MAX_LEVELS

#: The largest time accepted (ms): the year 10000.
MAX_TIME_MS: Final = 253_402_300_800_000
#: The longest delay, TTL or priority accepted (ms): 10 years.
MAX_DURATION_MS: Final = 10 * 365 * 86_400_000
#: The longest lease one dequeue or heartbeat may grant (ms): one day.
MAX_LEASE_MS: Final = 86_400_000
#: The deepest payload nesting accepted.
MAX_PAYLOAD_DEPTH: Final = 64
#: Most runs one finishing call takes.
MAX_BATCH: Final = 10_000
#: Most runs one maintenance call (lease reclaim, TTL expiry) handles on a shard.
MAX_MAINTENANCE_BATCH: Final = 10_000
#: Most queues one dequeue call serves.
MAX_DEQUEUE_QUEUES: Final = 1_000
#: The largest lease token accepted (a run's delivery count).
MAX_LEASE_TOKEN: Final = 10**15
#: The longest progress a heartbeat records: ``fraction:message`` (UTF-8 bytes).
MAX_PROGRESS_BYTES: Final = 1_100
#: The longest a quota reconciliation may hold an environment's ledger (ms).
MAX_QUOTA_HOLD_MS: Final = 60_000
#: An audit entry's fields: shortest and longest (UTF-8 bytes).
AUDIT_FIELD_BYTES: Final = {
    "who": (1, 200), "action": (1, 64), "target": (1, 500), "detail": (0, 2000),
}  # fmt: skip
#: Audit entries an environment keeps (the newest), and for how long after the last (s).
AUDIT_KEEP: Final = 1_000
AUDIT_TTL_S: Final = 30 * 86_400


def integer(name: str, value: object, low: int, high: int) -> int:
    """An int (not a bool, not a float) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidLimitError(name, value, f"must be an integer in {low}..{high}")
    if not low <= value <= high:
        raise InvalidLimitError(name, value, f"must be in {low}..{high}")
    return value


def number(name: str, value: object, low: float, high: float) -> float:
    """A finite int or float (not a bool) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidLimitError(name, value, f"must be a number in {low:g}..{high:g}")
    result = as_float(value)
    if not math.isfinite(result) or not low <= result <= high:
        raise InvalidLimitError(name, value, f"must be a finite number in {low:g}..{high:g}")
    return result


def time_ms(name: str, value: object) -> int:
    """An absolute time in ms, from 0 to the year 10000."""
    return integer(name, value, 0, MAX_TIME_MS)


def duration_ms(name: str, value: object, *, minimum: int = 0) -> int:
    """A duration in ms, at most 10 years."""
    return integer(name, value, minimum, MAX_DURATION_MS)


def priority(value: object) -> int:
    """A priority level: 1 (the highest) .. 9 (a queue has at most 9 levels)."""
    return integer("priority", value, 1, MAX_LEVELS)


def lease_ms(value: object) -> int:
    return integer("lease_ms", value, 1, MAX_LEASE_MS)


def max_count(value: object) -> int:
    return integer("max_count", value, 1, MAX_DEQUEUE_COUNT)


def limit(name: str, value: object, *, minimum: int = 0) -> int:
    return integer(name, value, minimum, MAX_LIMIT)


def batch(name: str, items: object) -> None:
    if len(items) > MAX_BATCH:  # type: ignore[arg-type]
        raise InvalidLimitError(name, len(items), f"at most {MAX_BATCH} per call")  # type: ignore[arg-type]


#: The payloads' JSON encoder, made once (``json.dumps`` with options makes one per call,
#: a third of a small payload's encoding time).
_PAYLOAD_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), allow_nan=False)

#: Types a payload's values can have that hold nothing further.
_FLAT: Final = frozenset({str, int, float, bool, type(None)})


def _depth(value: Any, limit: int) -> None:
    if type(value) is dict and all(type(v) in _FLAT for v in value.values()):
        return  # the common payload, one level deep: nothing to walk
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list | tuple):
            if depth > limit:
                raise PayloadError(f"payload is nested deeper than {limit} levels")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


def payload(value: Any, max_bytes: int) -> str:
    """JSON-encode a payload, refusing what JSON cannot hold, too deep, or too large.

    Raises:
        PayloadError: not JSON-serialisable (or NaN / infinity), nested deeper than
            :data:`MAX_PAYLOAD_DEPTH`, or larger than ``max_bytes``.
    """
    _depth(value, MAX_PAYLOAD_DEPTH)
    try:
        text = _PAYLOAD_ENCODER.encode(value)
    except (TypeError, ValueError) as exc:
        message = str(exc)
        if len(message) > 120:
            message = message[:119] + "…"
        raise PayloadError(f"payload is not JSON-serialisable: {message}") from None
    except RecursionError:
        raise PayloadError("payload is nested too deeply") from None
    size = len(text)  # ASCII: json.dumps escapes everything else
    if size > max_bytes:
        raise PayloadError(f"payload is {size} bytes, larger than the maximum {max_bytes}")
    return text


def utf8_prefix(value: str, max_bytes: int) -> str:
    """The longest prefix of ``value`` whose UTF-8 encoding fits in ``max_bytes``."""
    raw = value.encode("utf-8")
    if len(raw) <= max_bytes:
        return value
    return raw[:max_bytes].decode("utf-8", errors="ignore")


def text(name: str, value: object, max_chars: int) -> str:
    """A string of at most ``max_chars`` characters (valid Unicode)."""
    if not isinstance(value, str):
        raise InvalidLimitError(name, value, "must be a string")
    if len(value) > max_chars:
        raise InvalidLimitError(name, value, f"longer than {max_chars} characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidLimitError(name, value, "is not valid Unicode") from None
    return value


#: Longest progress message accepted, and the part of it kept.
MAX_PROGRESS_MESSAGE_CHARS: Final = 10_000
KEPT_PROGRESS_CHARS: Final = 1000


def progress_note(fraction: object, message: object) -> str:
    """A heartbeat's progress note (``fraction:message``): a fraction in 0..1 and a
    message of valid Unicode (at most 10,000 characters, of which 1,000 are kept, fewer
    when their UTF-8 would pass the script's bound, :data:`MAX_PROGRESS_BYTES`)."""
    value = number("progress", fraction, 0.0, 1.0)
    kept = text("progress message", message, MAX_PROGRESS_MESSAGE_CHARS)[:KEPT_PROGRESS_CHARS]
    head = f"{value:.4f}:"
    return head + utf8_prefix(kept, MAX_PROGRESS_BYTES - len(head))


#: Longest schedule name (UTF-8 bytes).
MAX_SCHEDULE_NAME_BYTES: Final = 200


def schedule_name(value: object) -> str:
    """A schedule's name: 1..200 bytes of valid Unicode (UTF-8), no ``:``."""
    text("schedule", value, MAX_SCHEDULE_NAME_BYTES)
    assert isinstance(value, str)
    if not value or ":" in value or len(value.encode("utf-8")) > MAX_SCHEDULE_NAME_BYTES:
        raise InvalidLimitError(
            "schedule", value, f"must be 1..{MAX_SCHEDULE_NAME_BYTES} bytes without ':'"
        )
    return value


#: Longest trace context a run carries.
MAX_TRACE_CONTEXT_CHARS: Final = 512


def trace_context(value: object) -> str:
    """A trace context: printable ASCII without spaces, at most 512 characters."""
    if (
        not isinstance(value, str)
        or not value
        or len(value) > MAX_TRACE_CONTEXT_CHARS
        or any(not "!" <= c <= "~" for c in value)
    ):
        raise InvalidLimitError(
            "trace_context", value, "must be 1..512 printable ASCII characters, no spaces"
        )
    return value
