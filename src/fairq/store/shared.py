"""Constants both sides of the Lua boundary use: each is defined once, in the Python
module that owns it, and the loader generates the scripts' copy from this list
(:func:`lua_shared`), so a script never spells one by hand:

* ``UNLIMITED`` and ``MAX_TIME_MS``, the largest limit and time any argument may be;
* ``ARG_RULES.<name>``: the other bounds and word lists the scripts check their
  arguments against, the same the Python side validates with (:mod:`fairq.store.validate`
  and the modules it names);
* ``AUDIT.<name>``: the audit list's bounds (:mod:`fairq.store.validate`);
* ``HISTORY.<name>``: how the scripts write a queue's history (:mod:`fairq.store.history`),
  and ``HISTORY.recent_line``, the one writer of a recent-list line;
* ``SHARES.<name>``: how the scripts write a queue's shares record
  (:mod:`fairq.store.share_record`).

(The key schema, the reply codes, the option rules, the context and the run hash have
their own modules and generators.)
"""

from __future__ import annotations

from typing import Final

from fairq.config import MAX_ATTEMPTS, MAX_DEQUEUE_COUNT, MAX_LIMIT
from fairq.keys import MAX_NAME_LENGTH, MAX_PARTITIONS
from fairq.outcomes import FINISH_STATUSES
from fairq.store import history, share_record, validate
from fairq.store.run_hash import OUTCOME_POLICIES

Value = int | str | tuple[str, ...]

#: Scalars the scripts name as locals.
LUA_CONSTANTS: Final[dict[str, int]] = {
    "UNLIMITED": MAX_LIMIT,
    "MAX_TIME_MS": validate.MAX_TIME_MS,
}
#: ``ARG_RULES.<name>``: what the scripts accept as arguments.
ARG_RULES: Final[dict[str, Value]] = {
    "name_length": MAX_NAME_LENGTH,
    "dequeue_count": MAX_DEQUEUE_COUNT,
    "dequeue_queues": validate.MAX_DEQUEUE_QUEUES,
    "lease_ms": validate.MAX_LEASE_MS,
    "lease_token": validate.MAX_LEASE_TOKEN,
    # a lease token of fewer digits is below the bound without a number conversion
    "lease_token_digits": len(str(validate.MAX_LEASE_TOKEN)) - 1,
    "attempts": MAX_ATTEMPTS,
    "maintenance_batch": validate.MAX_MAINTENANCE_BATCH,
    "schedule_name_bytes": validate.MAX_SCHEDULE_NAME_BYTES,
    "trace_context_chars": validate.MAX_TRACE_CONTEXT_CHARS,
    "progress_bytes": validate.MAX_PROGRESS_BYTES,
    "finish_statuses": FINISH_STATUSES,
    "partition": MAX_PARTITIONS - 1,
    "quota_hold_ms": validate.MAX_QUOTA_HOLD_MS,
    "outcome_policies": OUTCOME_POLICIES,
    "sample_queues": share_record.MAX_SAMPLE_QUEUES,
    "sample_flows": share_record.MAX_SAMPLE_FLOWS,
}
#: ``AUDIT.<name>``: an environment's audit list as audit.lua writes it.
AUDIT: Final[dict[str, Value]] = {
    "keep": validate.AUDIT_KEEP,
    "ttl_s": validate.AUDIT_TTL_S,
    **{f"{name}_low": low for name, (low, _) in validate.AUDIT_FIELD_BYTES.items()},
    **{f"{name}_high": high for name, (_, high) in validate.AUDIT_FIELD_BYTES.items()},
}
#: ``HISTORY.<name>``: a queue's history buckets as the scripts write them.
HISTORY: Final[dict[str, Value]] = {
    "bucket_ms": history.HISTORY_BUCKET_MS,
    "ttl_s": history.HISTORY_TTL_S,
    "max_fields": history.HISTORY_MAX_FIELDS,
    "tenant_prefix": history.HISTORY_TENANT_PREFIX,
    "overflow_field": history.HISTORY_OVERFLOW_FIELD,
    "wide_at": history.WIDE_AT,
    "wide_field": history.WIDE_FIELD,
    "wide_value": history.WIDE_VALUE,
}

#: ``SHARES.<name>``: a queue's shares buckets as the scripts write them.
SHARES: Final[dict[str, Value]] = {
    "bucket_ms": share_record.SHARES_BUCKET_MS,
    "window_buckets": share_record.SHARES_WINDOW_MS // share_record.SHARES_BUCKET_MS,
    "ttl_s": share_record.SHARES_TTL_S,
    "max_fields": share_record.SHARES_MAX_FIELDS,
    "samples_field": share_record.SAMPLES_FIELD,
    "share_prefix": share_record.SHARE_PREFIX,
    "runs_prefix": share_record.RUNS_PREFIX,
    "run_ms_prefix": share_record.RUN_MS_PREFIX,
    "overflow_flow": share_record.OVERFLOW_FLOW,
    "wide_at": history.WIDE_AT,
    "wide_field": history.WIDE_FIELD,
    "wide_value": history.WIDE_VALUE,
}


def lua_value(value: Value) -> str:
    """A constant as a Lua literal (names and words never hold a quote)."""
    if isinstance(value, tuple):
        return "{" + ", ".join(f"'{w}'" for w in value) + "}"
    if isinstance(value, str):
        return f"'{value}'"
    return str(value)


def _lua_table(name: str, table: dict[str, Value]) -> str:
    fields = ",\n".join(f"  {key} = {lua_value(value)}" for key, value in table.items())
    return f"local {name} = {{\n{fields},\n}}"


def _lua_recent_line() -> str:
    params = ", ".join(history.RECENT_FIELDS)
    line = " .. ' ' .. ".join(history.RECENT_FIELDS)
    return "\n".join(
        [
            "-- one line of a queue's recent list (fairq/store/history.py's RECENT_FIELDS)",
            f"function HISTORY.recent_line({params})",
            f"  return {line}",
            "end",
        ]
    )


def lua_shared() -> str:
    """The Lua constants (generated into every library, before the prelude)."""
    return "\n".join(
        [
            "-- generated from fairq/store/shared.py: constants both sides use",
            *(f"local {name} = {lua_value(value)}" for name, value in LUA_CONSTANTS.items()),
            _lua_table("ARG_RULES", ARG_RULES),
            _lua_table("AUDIT", AUDIT),
            _lua_table("HISTORY", HISTORY),
            _lua_table("SHARES", SHARES),
            _lua_recent_line(),
        ]
    )
