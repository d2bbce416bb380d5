"""The one corpus of bad input over every public entry point: each case raises one
specific fairq error, with a short message, and leaves the keyspace byte-identical.

Entry points: the store (:class:`fairq.store.RunQueue`: enqueue, schedule ticks,
dequeue, finish, nack, heartbeat, release, cancel (``only_if``), redrive, maintenance,
limits, options, weights, caps and rates at every scope, the audit list, trace contexts,
readers), the app and task API (:class:`fairq.Fairq`, ``Task.trigger`` /
``trigger_many``, ``schedule``: payload, key, tenant, name, time zone, policy;
``cancel``), a running task's ``progress``, the :class:`fairq.Worker` and
:class:`fairq.consumer.Consumer` constructors (linger included), the option objects
(:class:`fairq.RunQueueConfig`, :class:`fairq.VirtualTimeOptions`,
:class:`fairq.RetryPolicy`, ``RunQueueConfig.from_env``) and the CLI (``fairq.cli.main``
with argv lists).

Every case runs against a seeded store (limits, queued, keyed and running runs) and
compares :func:`tests.state.keyspace` (SCAN + DUMP of every key of the prefix) before
and after. Bad values: wrong types, bools for numbers, NaN / inf, out-of-range times
(the year 10000, ``10**400``), lone surrogates, over-long names and values, payloads
nested 100,000 deep, oversized batches.
"""

# ruff: noqa: B023 -- every case lambda is bound by an enclosing lambda call (late binding is not in play)
from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlparse, urlunparse

import pytest
from click.testing import CliRunner
from tests.state import keyspace

from fairq.app import Fairq
from fairq.config import RetryPolicy, RunQueueConfig, VirtualTimeOptions
from fairq.consumer import Consumer
from fairq.errors import (
    ConfigurationError,
    FairqError,
    InvalidLimitError,
    InvalidNameError,
    PayloadError,
    RunNotFoundError,
    ServerUnavailableError,
)
from fairq.keys import Environment
from fairq.models import Delivery, EnqueueRequest, Finish
from fairq.outcomes import KeptOutcome, RunStatus
from fairq.run_context import RunContext
from fairq.server import connect
from fairq.store import RunQueue
from fairq.store.admin import Change
from fairq.tasks import Task, TriggerItem
from fairq.worker import Worker

#: Long and topology-independent: run on the single server only.
pytestmark = pytest.mark.single_server

NAN, INF = math.nan, math.inf
HUGE = 10**400
#: 1 ms past the largest accepted time (the year 10000).
Y10K = 253_402_300_800_001
TEN_YEARS_MS = 10 * 365 * 86_400_000
#: A longest error message may be.
MAX_MESSAGE = 300


@dataclass(frozen=True, slots=True)
class Ctx:
    """What a case may call: the seeded store, its env, a live delivery, an app + task."""

    rq: RunQueue
    env: Environment
    delivery: Delivery
    app: Fairq
    task: Task[Any, Any]


Call = Callable[[Ctx], Any]
Case = tuple[str, type[BaseException], Call]


def nested(depth: int, kind: str = "list") -> Any:
    """A payload nested ``depth`` levels deep (built without recursion)."""
    value: Any = 0
    for _ in range(depth):
        value = [value] if kind == "list" else {"a": value}
    return value


def circular() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


# ---------------------------------------------------------------- value families

#: Names (queue, run id, org…) that validate_name refuses.
BAD_NAMES: list[tuple[str, object]] = [
    ("empty", ""),
    ("colon", "a:b"),
    ("space", "a b"),
    ("braces", "{q}"),
    ("star", "a*"),
    ("newline", "a\n"),
    ("nul", "a\x00"),
    ("dot-first", ".a"),
    ("dash-first", "-a"),
    ("non-ascii", "é"),
    ("lone-surrogate", "\ud800"),
    ("129-chars", "x" * 129),
    ("10kb", "x" * 10_000),
    ("int", 5),
    ("bytes", b"q"),
    ("none", None),
]
#: Run-id-only extras (a run id may not contain '/').
BAD_RUN_IDS = [*BAD_NAMES, ("slash", "a/b")]
#: Concurrency keys / tenants that cannot be encoded.
BAD_KEYS: list[tuple[str, object]] = [
    ("empty", ""),
    ("257-bytes", "x" * 257),
    ("10kb", "k" * 10_000),
    ("129-euro-signs", "€" * 129),
    ("lone-surrogate", "a\udfff"),
    ("int", 7),
    ("bytes", b"k"),
    ("list", ["k"]),
]
#: Durations in ms (delay, priority, ttl): integers 0..10 years.
BAD_DURATIONS: list[tuple[str, object]] = [
    ("negative", -1),
    ("fraction", 1.5),
    ("float-int", 5.0),
    ("nan", NAN),
    ("inf", INF),
    ("-inf", -INF),
    ("string", "5"),
    ("bool", True),
    ("10-years+1", TEN_YEARS_MS + 1),
    ("10**400", HUGE),
    ("-10**400", -HUGE),
    ("list", [1]),
]
#: Absolute times in ms: integers 0..the year 10000.
BAD_TIMES: list[tuple[str, object]] = [
    ("negative", -1),
    ("year-10000", Y10K),
    ("2**63", 2**63),
    ("10**400", HUGE),
    ("nan", NAN),
    ("inf", INF),
    ("float", 1.0),
    ("string", "now"),
    ("bool", False),
]
#: Payloads JSON cannot hold, or too deep, or too large.
BAD_PAYLOADS: list[tuple[str, Callable[[], object]]] = [
    ("nan", lambda: NAN),
    ("inf", lambda: INF),
    ("nan-inside", lambda: {"a": [1, NAN]}),
    ("set", lambda: {1, 2}),
    ("bytes", lambda: b"raw"),
    ("object", lambda: object()),
    ("tuple-key", lambda: {(1, 2): 3}),
    ("circular", circular),
    ("65-deep", lambda: nested(65)),
    ("100k-deep-list", lambda: nested(100_000)),
    ("100k-deep-dict", lambda: nested(100_000, "dict")),
    ("over-1MiB", lambda: "x" * (1_048_576 + 1)),
    ("many-small-over-1MiB", lambda: ["abcdefgh"] * 120_000),
]
BAD_BOOLS: list[tuple[str, object]] = [("string", "yes"), ("int", 1), ("none-ish", "")]
BAD_COUNTS: list[tuple[str, object]] = [
    ("zero", 0),
    ("negative", -1),
    ("1001", 1001),
    ("fraction", 1.5),
    ("float-int", 10.0),
    ("string", "10"),
    ("nan", NAN),
    ("bool", True),
    ("none", None),
    ("10**400", HUGE),
]
BAD_LEASES: list[tuple[str, object]] = [
    ("zero", 0),
    ("negative", -5),
    ("over-a-day", 86_400_001),
    ("fraction", 1.5),
    ("nan", NAN),
    ("string", "1000"),
    ("10**400", HUGE),
]
#: Limits (concurrency, sizes): integers 0..1e9.
BAD_LIMITS: list[tuple[str, object]] = [
    ("negative", -1),
    ("over-1e9", 1_000_000_001),
    ("fraction", 2.5),
    ("string", "5"),
    ("nan", NAN),
    ("inf", INF),
    ("bool", True),
    ("10**400", HUGE),
]
#: Weights: numbers 0.001..1000.
BAD_WEIGHTS: list[tuple[str, object]] = [
    ("zero", 0),
    ("negative", -1),
    ("over-1000", 1000.5),
    ("under-0.001", 0.0001),
    ("nan", NAN),
    ("inf", INF),
    ("string", "2"),
    ("bool", True),
    ("10**400", HUGE),
]


def _enq(**kw: Any) -> Call:
    base: dict[str, Any] = {"queue": "q", "run_id": "new-run"}
    base.update(kw)
    queue, run_id = base.pop("queue"), base.pop("run_id")
    return lambda c: c.rq.enqueue(c.env, queue, run_id, **base)


def _req(c: Ctx, **kw: Any) -> EnqueueRequest:
    base: dict[str, Any] = {"queue": "q", "run_id": "batch-run"}
    base.update(kw)
    return EnqueueRequest(c.env, **base)


def _with_token(c: Ctx, token: object) -> Delivery:
    return replace(c.delivery, lease_token=token)  # type: ignore[arg-type]


# ---------------------------------------------------------------- store cases

STORE: list[Case] = []
STORE += [(f"enqueue queue {n}", InvalidNameError, _enq(queue=v)) for n, v in BAD_NAMES]
STORE += [(f"enqueue run_id {n}", InvalidNameError, _enq(run_id=v)) for n, v in BAD_RUN_IDS]
STORE += [(f"enqueue key {n}", InvalidNameError, _enq(concurrency_key=v)) for n, v in BAD_KEYS]
STORE += [(f"enqueue tenant {n}", InvalidNameError, _enq(tenant=v)) for n, v in BAD_KEYS]
for field_name in ("delay_ms", "head_start_ms", "ttl_ms"):
    STORE += [
        (f"enqueue {field_name} {n}", InvalidLimitError, _enq(**{field_name: v}))
        for n, v in BAD_DURATIONS
    ]
STORE += [("enqueue ttl_ms zero", InvalidLimitError, _enq(ttl_ms=0))]
STORE += [
    (f"enqueue available_at_ms {n}", InvalidLimitError, _enq(available_at_ms=v))
    for n, v in BAD_TIMES
]
STORE += [(f"enqueue now_ms {n}", InvalidLimitError, _enq(now_ms=v)) for n, v in BAD_TIMES]
STORE += [
    (f"enqueue payload {n}", PayloadError, (lambda make: _enq(payload=make()))(make))
    for n, make in BAD_PAYLOADS
]
STORE += [
    (f"enqueue keep_outcome {n}", InvalidLimitError, _enq(keep_outcome=v)) for n, v in BAD_BOOLS
]
STORE += [
    (
        f"enqueue env {n}",
        InvalidNameError,
        (lambda v: lambda c: c.rq.enqueue(v, "q", "r"))(v),  # type: ignore[arg-type]
    )
    for n, v in [("string", "org1:proj1:prod"), ("none", None), ("int", 5)]
]
# enqueue_many: one bad request among good ones writes nothing
STORE += [
    (
        f"enqueue_many one bad {what}",
        exc,
        (
            lambda kw: (
                lambda c: c.rq.enqueue_many(
                    [_req(c, run_id=f"ok-{i}") for i in range(50)] + [_req(c, **kw)]
                )
            )
        )(kw),
    )
    for what, exc, kw in [
        ("queue", InvalidNameError, {"queue": "bad queue"}),
        ("run id", InvalidNameError, {"run_id": "bad:id"}),
        ("key", InvalidNameError, {"concurrency_key": "x" * 300}),
        ("delay", InvalidLimitError, {"delay_ms": NAN}),
        ("available_at", InvalidLimitError, {"available_at_ms": HUGE}),
        ("timeout", InvalidLimitError, {"timeout_ms": 0}),
        ("payload nan", PayloadError, {"payload": NAN}),
        ("payload deep", PayloadError, {"payload": nested(100_000)}),
    ]
]
STORE += [
    (
        f"enqueue_many now_ms {n}",
        InvalidLimitError,
        (lambda v: lambda c: c.rq.enqueue_many([_req(c)], now_ms=v))(v),
    )
    for n, v in BAD_TIMES
]
STORE += [
    ("enqueue_many a non-request", InvalidLimitError,
     lambda c: c.rq.enqueue_many([_req(c), {"queue": "q"}])),  # type: ignore[list-item]
    ("enqueue_many a string", InvalidLimitError,
     lambda c: c.rq.enqueue_many("abc")),  # type: ignore[arg-type]
]  # fmt: skip
# dequeue
STORE += [
    (f"dequeue max_count {n}", InvalidLimitError, (lambda v: lambda c: c.rq.dequeue(v))(v))
    for n, v in BAD_COUNTS
]
STORE += [
    (
        f"dequeue lease_ms {n}",
        InvalidLimitError,
        (lambda v: lambda c: c.rq.dequeue(5, lease_ms=v))(v),
    )
    for n, v in BAD_LEASES
]
STORE += [
    (f"dequeue now_ms {n}", InvalidLimitError, (lambda v: lambda c: c.rq.dequeue(5, now_ms=v))(v))
    for n, v in BAD_TIMES
]
STORE += [
    (
        f"dequeue queues {n}",
        InvalidNameError,
        (lambda v: lambda c: c.rq.dequeue(5, env=c.env, queues=["q", v]))(v),
    )
    for n, v in BAD_NAMES[:8]
]
STORE += [
    (
        f"dequeue_from_queue max_count {n}",
        InvalidLimitError,
        (lambda v: lambda c: c.rq.dequeue_from_queue(c.env, "q", max_count=v))(v),
    )
    for n, v in BAD_COUNTS[:5]
]
STORE += [
    (
        f"dequeue_variant key {n}",
        InvalidNameError,
        (lambda v: lambda c: c.rq.dequeue_variant(c.env, "q", v))(v),
    )
    for n, v in BAD_KEYS[:5]
]
STORE += [
    (
        f"dequeue_variant max_count {n}",
        InvalidLimitError,
        (lambda v: lambda c: c.rq.dequeue_variant(c.env, "q", "k", max_count=v))(v),
    )
    for n, v in BAD_COUNTS[:4]
]
# finish / ack
STORE += [
    ("ack a non-delivery", InvalidLimitError, lambda c: c.rq.ack([object()])),  # type: ignore[list-item]
    ("ack None", InvalidLimitError, lambda c: c.rq.ack([None])),  # type: ignore[list-item]
    ("ack a string", InvalidLimitError, lambda c: c.rq.ack("abc")),  # type: ignore[arg-type]
    ("ack 10001 deliveries", InvalidLimitError, lambda c: c.rq.ack([c.delivery] * 10_001)),
    ("ack good then bad", InvalidLimitError, lambda c: c.rq.ack([c.delivery, 5])),  # type: ignore[list-item]
    ("finish a bare delivery", InvalidLimitError, lambda c: c.rq.finish([c.delivery])),  # type: ignore[list-item]
    ("finish status done", InvalidLimitError,
     lambda c: c.rq.finish([Finish(c.delivery, status="done")])),
    ("finish status None", InvalidLimitError,
     lambda c: c.rq.finish([Finish(c.delivery, status=None)])),  # type: ignore[arg-type]
    ("finish outcome a JSON string", InvalidLimitError,
     lambda c: c.rq.finish([Finish(c.delivery, "completed", '{"result": 1}')])),  # type: ignore[arg-type]
]  # fmt: skip
STORE += [
    (f"finish outcome {n}", InvalidLimitError,
     (lambda o: lambda c: c.rq.finish([Finish(c.delivery, "completed", o)]))(o))
    for n, o in [
        ("result not JSON", KeptOutcome("{nope")), ("result not text", KeptOutcome(5)),  # type: ignore[arg-type]
        ("error lone-surrogate", KeptOutcome(error="boom \ud800")),
        ("traceback not text", KeptOutcome(traceback=b"tb")),  # type: ignore[arg-type]
    ]
]  # fmt: skip
STORE += [
    (
        f"ack lease token {n}",
        InvalidLimitError,
        (lambda v: lambda c: c.rq.ack([_with_token(c, v)]))(v),
    )
    for n, v in [("negative", -1), ("10**400", HUGE), ("string", "1"), ("float", 1.0), ("nan", NAN)]
]
# nack


def _nack(**kw: Any) -> Call:
    return lambda c: c.rq.nack(c.delivery, **kw)


STORE += [(f"nack retry_at_ms {n}", InvalidLimitError, _nack(retry_at_ms=v)) for n, v in BAD_TIMES]
STORE += [
    (f"nack retry_delay_ms {n}", InvalidLimitError, _nack(retry_delay_ms=v))
    for n, v in BAD_DURATIONS
]
STORE += [
    (f"nack max_attempts {n}", InvalidLimitError, _nack(max_attempts=v))
    for n, v in [("zero", 0), ("1001", 1001), ("fraction", 1.5), ("string", "3"), ("nan", NAN)]
]
STORE += [
    (f"nack increment_attempt {n}", InvalidLimitError, _nack(increment_attempt=v))
    for n, v in BAD_BOOLS
]
STORE += [
    (f"nack error {n}", InvalidLimitError, _nack(error=v))
    for n, v in [("int", 5), ("lone-surrogate", "boom \ud800"), ("100k+1", "e" * 100_001)]
]
STORE += [
    (f"nack keep_outcome {n}", InvalidLimitError, _nack(keep_outcome=v)) for n, v in BAD_BOOLS
]
STORE += [
    (f"nack delivery {n}", InvalidLimitError, (lambda v: lambda c: c.rq.nack(v))(v))
    for n, v in [("none", None), ("string", "d"), ("dict", {"run_id": "running"})]
]
# heartbeat / release
STORE += [
    (
        f"heartbeat lease_ms {n}",
        InvalidLimitError,
        (lambda v: lambda c: c.rq.heartbeat([c.delivery], lease_ms=v))(v),
    )
    for n, v in BAD_LEASES
]
STORE += [
    (
        f"heartbeat progress {n}",
        InvalidLimitError,
        (lambda v: lambda c: c.rq.heartbeat([c.delivery], progress={"running": v}))(v),
    )
    for n, v in [
        ("nan", (NAN, "")),
        ("over-1", (1.5, "")),
        ("negative", (-0.1, "")),
        ("string-fraction", ("0.5", "")),
        ("int-message", (0.5, 5)),
        ("surrogate-message", (0.5, "\ud800")),
        ("10k+1-message", (0.5, "m" * 10_001)),
    ]
]
STORE += [
    ("heartbeat a non-delivery", InvalidLimitError, lambda c: c.rq.heartbeat([1])),  # type: ignore[list-item]
    ("heartbeat 10001", InvalidLimitError, lambda c: c.rq.heartbeat([c.delivery] * 10_001)),
    ("release a non-delivery", InvalidLimitError, lambda c: c.rq.release(["x"])),  # type: ignore[list-item]
    ("release 10001", InvalidLimitError, lambda c: c.rq.release([c.delivery] * 10_001)),
    ("release bad token", InvalidLimitError, lambda c: c.rq.release([_with_token(c, -3)])),
]  # fmt: skip
# cancel / redrive
STORE += [
    (f"cancel run_id {n}", InvalidNameError, (lambda v: lambda c: c.rq.cancel(c.env, v))(v))
    for n, v in BAD_RUN_IDS
]
STORE += [
    (f"redrive run_id {n}", InvalidNameError, (lambda v: lambda c: c.rq.redrive(c.env, v))(v))
    for n, v in BAD_RUN_IDS[:8]
]
STORE += [
    ("redrive a queued run", RunNotFoundError, lambda c: c.rq.redrive(c.env, "queued")),
    ("redrive an unknown run", RunNotFoundError, lambda c: c.rq.redrive(c.env, "nope")),
]
# maintenance
for method in ("reclaim_lapsed_leases", "expire_ttl"):
    STORE += [
        (
            f"{method} batch {n}",
            InvalidLimitError,
            (lambda m, v: lambda c: getattr(c.rq, m)(batch=v))(method, v),
        )
        for n, v in [("zero", 0), ("10001", 10_001), ("fraction", 1.5), ("string", "5")]
    ]
    STORE += [
        (
            f"{method} now_ms {n}",
            InvalidLimitError,
            (lambda m, v: lambda c: getattr(c.rq, m)(now_ms=v))(method, v),
        )
        for n, v in BAD_TIMES[:5]
    ]
STORE += [
    (f"maintain interval_s {n}", InvalidLimitError,
     (lambda v: lambda c: c.rq.maintain(interval_s=v))(v))
    for n, v in [("nan", NAN), ("string", "1"), ("10**400", HUGE)]
]  # fmt: skip
# shares received vs entitled: the backlog sample and its reader
STORE += [
    (f"sample_shares {kw}", InvalidLimitError,
     (lambda k: lambda c: c.rq.sample_shares(**k))(kw))
    for kw in [{"queues": 0}, {"queues": 10_001}, {"flows": 0}, {"flows": 1.5},
               {"queues": "5"}, {"now_ms": -1}, {"now_ms": NAN}]
]  # fmt: skip
STORE += [
    (f"tenant_shares window {w!r}"[:60], InvalidLimitError,
     (lambda v: lambda c: c.rq.tenant_shares(c.env, "q", window=v))(w))
    for w in [0, 5, 15, 3_610, 1.5, "60", True, NAN, HUGE]
]  # fmt: skip
STORE += [
    ("tenant_shares queue a:b", InvalidNameError,
     lambda c: c.rq.tenant_shares(c.env, "a:b")),
    ("tenant_shares now_ms -1", InvalidLimitError,
     lambda c: c.rq.tenant_shares(c.env, "q", now_ms=-1)),
    ("tenant_shares_windows none", InvalidLimitError,
     lambda c: c.rq.tenant_shares_windows(c.env, "q", windows=())),
]  # fmt: skip
# admin: limits, options, weights, caps, rates


def _admin(method: str, *args: Any, **kw: Any) -> Call:
    return lambda c: getattr(c.rq, method)(c.env, *args, **kw)


STORE += [
    (f"set_env_limits concurrency {n}", InvalidLimitError, _admin("set_env_limits", concurrency=v))
    for n, v in BAD_LIMITS
]
STORE += [
    (f"set_env_limits burst {n}", InvalidLimitError, _admin("set_env_limits", burst_factor=v))
    for n, v in [("half", 0.5), ("101", 101), ("nan", NAN), ("inf", INF), ("string", "2"),
                 ("10**400", HUGE)]
]  # fmt: skip
STORE += [
    (
        f"set_env_limits size {n}",
        InvalidLimitError,
        _admin("set_env_limits", concurrency=5, queue_size_limit=v),
    )
    for n, v in BAD_LIMITS[:4]
]
for method in ("set_queue_concurrency", "set_queue_size_limit", "set_queue_total_concurrency"):
    STORE += [(f"{method} {n}", InvalidLimitError, _admin(method, "q", v)) for n, v in BAD_LIMITS]
    STORE += [
        (f"{method} queue {n}", InvalidNameError, _admin(method, v, 3)) for n, v in BAD_NAMES[:6]
    ]
STORE += [
    (f"set_queue_options {what}", InvalidLimitError, _admin("set_queue_options", "q", **kw))
    for what, kw in [
        ("unknown option", {"speed": 3}),
        ("internal option", {"parked": True}),
        ("order random", {"order": "random"}),
        ("order int", {"order": 1}),
        ("max_per_key 0", {"max_per_key": 0}),
        ("max_per_key 1001", {"max_per_key": 1001}),
        ("paused string", {"paused": "yes"}),
        ("quantum 0", {"quantum": 0}),
        ("quantum nan", {"quantum": NAN}),
        ("quantum 10**400", {"quantum": HUGE}),
        ("window 0", {"window": 0}),
        ("join sideways", {"join": "sideways"}),
        ("charge time", {"charge": "time"}),
        ("arrival_cap -1", {"arrival_cap": -1}),
        ("concurrency nan", {"concurrency": NAN}),
        ("concurrency 2.5", {"concurrency": 2.5}),
        ("good then bad", {"concurrency": 4, "max_size": -1}),
        ("rate fast", {"rate": "fast"}),
        ("borrow 1", {"borrow": 1}),
    ]
]
STORE += [
    (f"set_env_options {what}", InvalidLimitError, _admin("set_env_options", **kw))
    for what, kw in [
        ("unknown", {"colour": "red"}),
        ("order random", {"order": "random"}),
        ("max_per_key 0", {"max_per_key": 0}),
        ("quantum inf", {"quantum": INF}),
        ("window 101", {"window": 101}),
        ("good then bad", {"order": "fair", "window": 0}),
    ]
]
STORE += [
    (f"set_env_weight {n}", InvalidLimitError, _admin("set_env_weight", v)) for n, v in BAD_WEIGHTS
]
STORE += [
    (f"set_tenant_weight {n}", InvalidLimitError, _admin("set_tenant_weight", "acme", v))
    for n, v in BAD_WEIGHTS
]
STORE += [
    (f"set_tenant_weight tenant {n}", InvalidNameError, _admin("set_tenant_weight", v, 2.0))
    for n, v in BAD_KEYS[:5]
]
STORE += [
    (
        f"set_concurrency_key_weight {n}",
        InvalidLimitError,
        _admin("set_concurrency_key_weight", "q", "k", v),
    )
    for n, v in BAD_WEIGHTS
]
STORE += [
    (
        f"set_concurrency_key_weight key {n}",
        InvalidNameError,
        _admin("set_concurrency_key_weight", "q", v, 2.0),
    )
    for n, v in BAD_KEYS[:5]
]
STORE += [
    (f"set_key_concurrency {n}", InvalidLimitError, _admin("set_key_concurrency", "q", "k", v))
    for n, v in BAD_LIMITS
]
STORE += [
    (f"set_key_concurrency key {n}", InvalidNameError, _admin("set_key_concurrency", "q", v, 1))
    for n, v in BAD_KEYS[:4]
]
STORE += [
    (
        f"set_tenant_concurrency {n}",
        InvalidLimitError,
        _admin("set_tenant_concurrency", "q", "acme", v),
    )
    for n, v in BAD_LIMITS
]
STORE += [
    (
        f"set_tenant_concurrency queue {n}",
        InvalidNameError,
        _admin("set_tenant_concurrency", v, "acme", 1),
    )
    for n, v in BAD_NAMES[:4]
]
STORE += [
    (f"set_rate_limit rate {n}", InvalidLimitError, _admin("set_rate_limit", "q", v))
    for n, v in [("word", "fast"), ("per-year", "5/y"), ("negative", "-5/s"), ("nan", NAN),
                 ("inf", INF), ("string-nan", "nan/s"), ("bool", True), ("list", [1]),
                 ("10**400", HUGE), ("1e400/s", "1e400/s")]
]  # fmt: skip
STORE += [
    (f"set_rate_limit burst {n}", InvalidLimitError, _admin("set_rate_limit", "q", "5/s", burst=v))
    for n, v in [("zero", 0), ("over-1e6", 10**7), ("fraction", 1.5), ("string", "2")]
]
STORE += [
    ("set_rate_limit key and tenant", InvalidLimitError,
     _admin("set_rate_limit", "q", "5/s", key="k", tenant="t")),
    ("set_rate_limit per month", InvalidLimitError,
     _admin("set_rate_limit", "q", "5/s", per="month")),
    ("set_rate_limit key bad", InvalidNameError,
     _admin("set_rate_limit", "q", "5/s", key="x" * 300)),
    ("set_rate_limit tenant bad queue", InvalidNameError,
     _admin("set_rate_limit", "a:b", "5/s", tenant="t")),
    ("configure env string", InvalidNameError,
     lambda c: c.rq.configure("org1:proj1:prod", [])),  # type: ignore[arg-type]
    ("configure 10001 changes", InvalidLimitError,
     lambda c: c.rq.configure(c.env, [Change("config", None, "concurrency", "5")] * 10_001)),
]  # fmt: skip
# readers
STORE += [
    (f"get_run {n}", InvalidNameError, (lambda v: lambda c: c.rq.get_run(c.env, v))(v))
    for n, v in BAD_RUN_IDS[:8]
]
STORE += [
    (f"dead_letters limit {n}", InvalidLimitError,
     (lambda v: lambda c: c.rq.dead_letters(c.env, limit=v))(v))
    for n, v in [("zero", 0), ("10001", 10_001), ("string", "5"), ("10**400", HUGE)]
]  # fmt: skip
STORE += [
    (f"recent_runs limit {n}", InvalidLimitError,
     (lambda v: lambda c: c.rq.recent_runs(c.env, "q", limit=v))(v))
    for n, v in [("zero", 0), ("100001", 100_001), ("nan", NAN)]
]  # fmt: skip
STORE += [
    (f"history window {n}", InvalidLimitError,
     (lambda v: lambda c: c.rq.history(c.env, "q", window_ms=v))(v))
    for n, v in [("zero", 0), ("over-an-hour", 3_600_001), ("string", "60000")]
]  # fmt: skip

# caps, rates, bursts and queue options, at every scope (from the limits suite)
BAD_CAPS: list[object] = [-1, 1.5, NAN, INF, -INF, "3", True, False, 10**10, [1]]
BAD_RATES: list[object] = [
    -1, 0, "0/s", NAN, INF, "abc", "5/fortnight", "nan/s", True, 1e12, "1e12/s", "-3/m",
    b"1/s", [1],
]  # fmt: skip
BAD_BURSTS: list[object] = [0, -1, 1.5, NAN, INF, "2", True, 10**7]
_CAP_SETTERS: list[tuple[str, Callable[[Ctx, object], Any]]] = [
    ("total", lambda c, v: c.rq.set_queue_total_concurrency(c.env, "q", v)),
    ("key", lambda c, v: c.rq.set_key_concurrency(c.env, "q", "k", v)),
    ("tenant", lambda c, v: c.rq.set_tenant_concurrency(c.env, "q", "acme", v)),
    ("queue", lambda c, v: c.rq.set_queue_concurrency(c.env, "q", v)),
    ("option total", lambda c, v: c.rq.set_queue_options(c.env, "q", total=v)),
]
STORE += [
    (f"cap {scope} {v!r}", InvalidLimitError, (lambda f, v: lambda c: f(c, v))(setter, v))
    for scope, setter in _CAP_SETTERS
    for v in BAD_CAPS
]
_RATE_SCOPES: dict[str, dict[str, Any]] = {
    "queue": {}, "key": {"key": "k"}, "tenant": {"tenant": "acme"}, "per-key": {"per": "key"},
    "per-tenant": {"per": "tenant"},
}  # fmt: skip
STORE += [
    (f"rate {scope} {v!r}", InvalidLimitError,
     (lambda v, kw: lambda c: c.rq.set_rate_limit(c.env, "q", v, burst=2, **kw))(v, kw))
    for scope, kw in _RATE_SCOPES.items()
    for v in BAD_RATES
]  # fmt: skip
STORE += [
    (f"rate burst {scope} {v!r}", InvalidLimitError,
     (lambda v, kw: lambda c: c.rq.set_rate_limit(c.env, "q", 5, burst=v, **kw))(v, kw))
    for scope, kw in list(_RATE_SCOPES.items())[:3]
    for v in BAD_BURSTS
]  # fmt: skip
STORE += [
    (f"set_queue_options rate_burst {v!r}", InvalidLimitError,
     (lambda v: lambda c: c.rq.set_queue_options(c.env, "q", rate=5.0, rate_burst=v))(v))
    for v in BAD_BURSTS
]  # fmt: skip
STORE += [
    (f"set_queue_options {kw!r}", InvalidLimitError,
     (lambda kw: lambda c: c.rq.set_queue_options(c.env, "q", **kw))(kw))
    for kw in [
        {"borrow": "yes"}, {"borrow": NAN}, {"charge": 1}, {"charge": True}, {"rate": 1e12},
        {"key_rate": -1.0}, {"tenant_rate_burst": 0}, {"total": 5, "borrow": "no"},
    ]
]  # fmt: skip
STORE += [
    ("set_env_limits valid limit with a bad burst", InvalidLimitError,
     lambda c: c.rq.set_env_limits(c.env, concurrency=9, burst_factor=0)),
    ("heartbeat of no runs with lease 0", InvalidLimitError,
     lambda c: c.rq.heartbeat([], lease_ms=0)),
]  # fmt: skip
STORE += [
    (f"rate scopes {kw!r}", InvalidLimitError,
     (lambda kw: lambda c: c.rq.set_rate_limit(c.env, "q", 5, **kw))(kw))
    for kw in [{"key": "k", "tenant": "acme"}, {"key": "k", "per": "key"},
               {"tenant": "acme", "per": "tenant"}, {"per": "queue"}, {"per": "keys"},
               {"per": ""}, {"per": 1}]
]  # fmt: skip
# the audit list and trace contexts (from the run-details suite)
STORE += [
    (f"record_audit {kw!r}"[:70], InvalidLimitError,
     (lambda kw: lambda c: c.rq.record_audit(c.env, **{"who": "w", "action": "a",
                                                       "target": "t", **kw}))(kw))
    for kw in [
        {"who": ""}, {"who": "x" * 201}, {"action": "two words"}, {"action": ""},
        {"action": "é"}, {"target": ""}, {"target": "é" * 251}, {"detail": "d" * 2001},
        {"who": 7}, {"now_ms": -1},
    ]
]  # fmt: skip
STORE += [
    (f"enqueue_many trace_context {v!r}"[:70], InvalidLimitError,
     (lambda v: lambda c: c.rq.enqueue_many([_req(c, trace_context=v)]))(v))
    for v in ["", "has space", "é", "x" * 513, 5]
]  # fmt: skip
# schedule ticks: the name and tick as the store takes them
STORE += [
    (f"enqueue_tick schedule {n}", InvalidLimitError,
     (lambda v: lambda c: c.rq.enqueue_tick(v, 1_000, _req(c)))(v))  # type: ignore[arg-type]
    for n, v in [("empty", ""), ("colon", "a:b"), ("201-chars", "s" * 201),
                 ("lone-surrogate", "\udc80"), ("int", 5), ("none", None)]
]  # fmt: skip
STORE += [
    (f"enqueue_tick tick_ms {n}", InvalidLimitError,
     (lambda v: lambda c: c.rq.enqueue_tick("ok", v, _req(c)))(v))  # type: ignore[arg-type]
    for n, v in BAD_TIMES
]  # fmt: skip
STORE += [
    (f"enqueue_tick request {what}", exc,
     (lambda kw: lambda c: c.rq.enqueue_tick("ok", 1_000, _req(c, **kw)))(kw))
    for what, exc, kw in [
        ("payload nan", PayloadError, {"payload": NAN}),
        ("tenant empty", InvalidNameError, {"tenant": ""}),
        ("run id", InvalidNameError, {"run_id": "a:b"}),
    ]
]  # fmt: skip
# cancel: a state no run is cancelled in
STORE += [
    (f"cancel only_if {n}", InvalidLimitError,
     (lambda v: lambda c: c.rq.cancel(c.env, "queued", only_if=v))(v))  # type: ignore[arg-type]
    for n, v in [("completed", RunStatus.COMPLETED), ("expired", RunStatus.EXPIRED),
                 ("string", "sometime"), ("list", ["queued"]), ("int", 1)]
]  # fmt: skip

# ---------------------------------------------------------------- app / task cases

APP: list[Case] = []


def _trigger(*args: Any, **kw: Any) -> Call:
    return lambda c: c.task.trigger(*args, **kw)


APP += [
    (f"trigger payload {n}", PayloadError, (lambda make: lambda c: c.task.trigger(make()))(make))
    for n, make in BAD_PAYLOADS
]
for option in ("delay", "ttl", "head_start", "timeout"):
    APP += [
        (f"trigger {option} {n}", ConfigurationError, _trigger(None, **{option: v}))
        for n, v in [("negative", -1), ("nan", NAN), ("inf", INF), ("string", "5"),
                     ("bool", True), ("10**400", HUGE), ("10-years+1", 10 * 365 * 86_400 + 1)]
    ]  # fmt: skip
APP += [("trigger timeout zero", ConfigurationError, _trigger(None, timeout=0))]
APP += [
    (f"trigger priority {n}", InvalidLimitError, _trigger(None, priority=v))
    for n, v in [("zero", 0), ("ten", 10), ("negative", -1), ("float", 1.5), ("string", "1"),
                 ("bool", True), ("nan", NAN)]
]  # fmt: skip
APP += [
    (f"trigger key {n}", InvalidNameError, _trigger(None, concurrency_key=v)) for n, v in BAD_KEYS
]
APP += [
    (f"trigger tenant {n}", InvalidNameError, _trigger(None, tenant=v)) for n, v in BAD_KEYS[1:]
]
APP += [
    (f"trigger run_id {n}", InvalidNameError, _trigger(None, run_id=v))
    for n, v in BAD_RUN_IDS[1:]
    if v is not None  # None asks for a fresh id
]
APP += [
    (f"trigger keep_result {n}", InvalidLimitError, _trigger(None, keep_result=v))
    for n, v in [("string", "yes"), ("int", 2)]
]
APP += [
    (
        f"trigger_many one bad {what}",
        exc,
        (
            lambda item: (
                lambda c: c.task.trigger_many([TriggerItem({"n": i}) for i in range(20)] + [item])
            )
        )(item),
    )
    for what, exc, item in [
        ("payload", PayloadError, TriggerItem(NAN)),
        ("deep payload", PayloadError, TriggerItem(nested(100_000))),
        ("delay", ConfigurationError, TriggerItem(None, delay=-1)),
        ("key", InvalidNameError, TriggerItem(None, concurrency_key="")),
        ("run id", InvalidNameError, TriggerItem(None, run_id="a b")),
    ]
]
APP += [
    (f"Fairq env {n}", InvalidNameError, (lambda v: lambda c: Fairq(v))(v))
    for n, v in [("two parts", "a:b"), ("four parts", "a:b:c:d"), ("bad org", "a b:c:d"),
                 ("empty part", "a::c"), ("int", 5), ("surrogate", "\ud800:p:e"),
                 ("10kb", "o" * 10_000 + ":p:e")]
]  # fmt: skip
APP += [
    (f"Fairq {what}", ConfigurationError, (lambda kw: lambda c: Fairq("a:b:c", **kw))(kw))
    for what, kw in [
        ("url int", {"url": 5}),
        ("config string", {"config": "prefix=x"}),
        ("fair string", {"fair": "yes"}),
        ("eager string", {"eager": "no"}),
        ("result ttl 0", {"result_ttl_seconds": 0}),
        ("result ttl fraction", {"result_ttl_seconds": 1.5}),
        ("result ttl over a year", {"result_ttl_seconds": 365 * 86_400 + 1}),
        ("result ttl string", {"result_ttl_seconds": "60"}),
        ("result ttl bool", {"result_ttl_seconds": True}),
        ("result ttl 10**400", {"result_ttl_seconds": HUGE}),
    ]
]
APP += [
    (f"app.task {what}", exc, (lambda kw: lambda c: c.app.task(**kw)(lambda p: p))(kw))
    for what, exc, kw in [
        ("queue with colon", InvalidNameError, {"queue": "a:b"}),
        ("queue 10kb", InvalidNameError, {"queue": "q" * 10_000}),
        ("queue surrogate", InvalidNameError, {"queue": "\ud800"}),
        ("duplicate queue", ConfigurationError, {"queue": "jobs"}),
        ("timeout negative", ConfigurationError, {"queue": "t1", "timeout": -1}),
        ("timeout nan", ConfigurationError, {"queue": "t2", "timeout": NAN}),
        ("keep_result string", ConfigurationError, {"queue": "t3", "keep_result": "y"}),
        ("tenant_from int", ConfigurationError, {"queue": "t4", "tenant_from": 5}),
        ("rate word", InvalidLimitError, {"queue": "t5", "rate": "fast"}),
        ("rate nan", InvalidLimitError, {"queue": "t6", "rate": NAN}),
    ]
]
APP += [
    (f"app.schedule {what}", ConfigurationError,
     (lambda kw: lambda c: c.app.schedule(c.task, **kw))(kw))
    for what, kw in [
        ("neither cron nor every", {}),
        ("both", {"cron": "* * * * *", "every": 60}),
        ("bad cron", {"cron": "every day"}),
        ("every nan", {"every": NAN}),
        ("unknown zone", {"cron": "* * * * *", "timezone": "Mars/Olympus"}),
    ]
]  # fmt: skip
APP += [
    ("app.schedule a foreign task", ConfigurationError,
     lambda c: c.app.schedule("jobs", every=60)),  # type: ignore[arg-type]
]  # fmt: skip


def _schedule(**kw: Any) -> Call:
    if "cron" not in kw:
        kw["every"] = 60
    return lambda c: c.app.schedule(c.task, **kw)


# a schedule's runs are checked as a trigger's: the same values, the same errors
APP += [(f"app.schedule payload {n}", PayloadError, (lambda make: lambda c: c.app.schedule(
    c.task, every=60, payload=make()))(make)) for n, make in BAD_PAYLOADS]  # fmt: skip
APP += [
    (f"app.schedule key {n}", InvalidNameError, _schedule(concurrency_key=v)) for n, v in BAD_KEYS
]
APP += [(f"app.schedule tenant {n}", InvalidNameError, _schedule(tenant=v)) for n, v in BAD_KEYS]
APP += [
    (f"app.schedule name {n}", InvalidLimitError, _schedule(name=v))
    for n, v in [("colon", "a:b"), ("201-chars", "s" * 201), ("10kb", "s" * 10_000),
                 ("lone-surrogate", "tick \ud800"), ("int", 5), ("list", ["a"])]
]  # fmt: skip
APP += [
    (f"app.schedule timezone {n}", ConfigurationError, _schedule(cron="* * * * *", timezone=v))
    for n, v in [("10kb", "Z" * 10_000), ("int", 5), ("none", None), ("nul", "UTC\x00"),
                 ("path", "../../etc/passwd"), ("surrogate", "\udc80")]
]  # fmt: skip
APP += [
    (f"app.schedule {what}", ConfigurationError, _schedule(**kw))
    for what, kw in [
        ("catch_up sideways", {"catch_up": "sideways"}),
        ("max_catch_up 0", {"max_catch_up": 0}),
        ("max_catch_up bool", {"max_catch_up": True}),
        ("cron int", {"cron": 5}),
    ]
]

APP += [
    (f"app.cancel only_if {n}", InvalidLimitError,
     (lambda v: lambda c: c.app.cancel("job-1", only_if=v))(v))  # type: ignore[arg-type]
    for n, v in [("completed", RunStatus.COMPLETED), ("string", "later")]
]  # fmt: skip


def _progress(fraction: object, message: object) -> Call:
    """A running task's progress report (no server call: it must refuse at once)."""
    return lambda c: RunContext(c.delivery, {}).progress(fraction, message)  # type: ignore[arg-type]


APP += [
    (f"progress {n}", ConfigurationError, _progress(f, m))
    for n, f, m in [
        ("nan", NAN, ""), ("string fraction", "0.5", ""), ("bool fraction", True, ""),
        ("none fraction", None, ""), ("list fraction", [0.5], ""),
        ("lone-surrogate note", 0.5, "file \udcff.csv"), ("int note", 0.5, 5),
        ("bytes note", 0.5, b"note"), ("none note", 0.5, None),
    ]
]  # fmt: skip

# ---------------------------------------------------------------- worker / consumer cases

WORKER: list[Case] = []
WORKER += [
    (f"Worker {what}", ConfigurationError, (lambda kw: lambda c: Worker(c.app, **kw))(kw))
    for what, kw in [
        ("concurrency 0", {"concurrency": 0}),
        ("concurrency 2000", {"concurrency": 2000}),
        ("concurrency fraction", {"concurrency": 1.5}),
        ("concurrency string", {"concurrency": "4"}),
        ("concurrency bool", {"concurrency": True}),
        ("concurrency None", {"concurrency": None}),
        ("concurrency 10**400", {"concurrency": HUGE}),
        ("max_count 0", {"max_count": 0}),
        ("max_count 1001", {"max_count": 1001}),
        ("max_count string", {"max_count": "10"}),
        ("max_count float", {"max_count": 10.0}),
        ("grace negative", {"grace_period": -1}),
        ("grace nan", {"grace_period": NAN}),
        ("grace inf", {"grace_period": INF}),
        ("grace string", {"grace_period": "1"}),
        ("grace over a day", {"grace_period": 86_401}),
        ("cancel_grace nan", {"cancel_grace": NAN}),
        ("idle_timeout 0", {"idle_timeout": 0}),
        ("maintenance 0", {"maintenance_interval": 0}),
        ("maintenance nan", {"maintenance_interval": NAN}),
        ("max_runs 0", {"max_runs": 0}),
        ("max_runs fraction", {"max_runs": 1.5}),
        ("unknown queue", {"queues": ["nope"]}),
        ("no queues", {"queues": []}),
    ]
]
WORKER += [
    ("Worker of a non-app", ConfigurationError, lambda c: Worker("app")),  # type: ignore[arg-type]
]
WORKER += [
    (f"Consumer {what}", ConfigurationError, (lambda kw: lambda c: Consumer(c.rq, **kw))(kw))
    for what, kw in [
        ("idle_timeout negative", {"idle_timeout": -1}),
        ("idle_timeout nan", {"idle_timeout": NAN}),
        ("idle_timeout string", {"idle_timeout": "1"}),
        ("maintenance nan", {"maintenance_interval": NAN}),
        ("env string", {"env": "org1:proj1:prod"}),
        ("bad queue", {"queues": ["a b"]}),
    ]
]
WORKER += [
    ("Consumer of a non-store", ConfigurationError, lambda c: Consumer("rq")),  # type: ignore[arg-type]
]

WORKER += [
    (f"{kind} linger {n}", ConfigurationError,
     (lambda make, v: lambda c: make(c, v))(make, v))
    for kind, make in [("Worker", lambda c, v: Worker(c.app, linger=v)),
                       ("Consumer", lambda c, v: Consumer(c.rq, linger=v))]
    for n, v in [("negative", -0.001), ("over a second", 1.5), ("nan", NAN), ("string", "2"),
                 ("bool", True)]
]  # fmt: skip

# ---------------------------------------------------------------- option objects

CONFIG: list[Case] = []
CONFIG += [
    (f"RunQueueConfig {what}", ConfigurationError, (lambda kw: lambda c: RunQueueConfig(**kw))(kw))
    for what, kw in [
        ("prefix empty", {"prefix": ""}),
        ("prefix space", {"prefix": "a b"}),
        ("prefix brace", {"prefix": "a{b"}),
        ("prefix colon", {"prefix": "a:b"}),
        ("prefix 65", {"prefix": "p" * 65}),
        ("prefix int", {"prefix": 5}),
        ("prefix surrogate", {"prefix": "\ud800"}),
        ("shard_count 0", {"shard_count": 0}),
        ("shard_count 16385", {"shard_count": 16385}),
        ("shard_count string", {"shard_count": "4"}),
        ("env concurrency 0", {"default_env_concurrency": 0}),
        ("env concurrency fraction", {"default_env_concurrency": 1.5}),
        ("burst half", {"default_burst_factor": 0.5}),
        ("burst nan", {"default_burst_factor": NAN}),
        ("burst 10**400", {"default_burst_factor": HUGE}),
        ("size limit negative", {"default_queue_size_limit": -1}),
        ("counter ttl 0", {"counter_ttl_seconds": 0}),
        ("lease 99", {"lease_ms": 99}),
        ("lease over a day", {"lease_ms": 86_400_001}),
        ("lease nan", {"lease_ms": NAN}),
        ("lease string", {"lease_ms": "1000"}),
        ("max_per_key 0", {"max_per_key_per_call": 0}),
        ("max_per_key 1001", {"max_per_key_per_call": 1001}),
        ("payload bytes 15", {"max_payload_bytes": 15}),
        ("outcome ttl 0", {"outcome_ttl_seconds": 0}),
        ("recent -1", {"recent_runs": -1}),
        ("recent 100001", {"recent_runs": 100_001}),
        ("retry string", {"retry": "3"}),
        ("vtime dict", {"vtime": {"enabled": True}}),
    ]
]
CONFIG += [
    (f"with_vtime {what}", ConfigurationError,
     (lambda kw: lambda c: RunQueueConfig().with_vtime(**kw))(kw))
    for what, kw in [
        ("enabled string", {"enabled": "yes"}),
        ("quantum 0", {"quantum": 0}),
        ("quantum nan", {"quantum": NAN}),
        ("quantum inf", {"quantum": INF}),
        ("quantum 10**400", {"quantum": HUGE}),
        ("window 0", {"scan_window_multiplier": 0}),
        ("window 101", {"scan_window_multiplier": 101}),
        ("state ttl 0", {"state_ttl_seconds": 0}),
        ("join sideways", {"join_policy": "sideways"}),
        ("arrival cap -1", {"arrival_cap": -1}),
        ("charge time", {"charge": "time"}),
        ("charge unit 0", {"charge_unit_ms": 0}),
    ]
]  # fmt: skip
CONFIG += [
    (f"VirtualTimeOptions {what}", ConfigurationError,
     (lambda kw: lambda c: VirtualTimeOptions(**kw))(kw))
    for what, kw in [("enabled int", {"enabled": 1}), ("quantum string", {"quantum": "1"})]
]  # fmt: skip
CONFIG += [
    (f"RetryPolicy {what}", ConfigurationError, (lambda kw: lambda c: RetryPolicy(**kw))(kw))
    for what, kw in [
        ("max_attempts 0", {"max_attempts": 0}),
        ("max_attempts 1001", {"max_attempts": 1001}),
        ("factor half", {"factor": 0.5}),
        ("factor nan", {"factor": NAN}),
        ("min above max", {"min_delay_ms": 10, "max_delay_ms": 5}),
        ("max over a year", {"max_delay_ms": 365 * 86_400_000 + 1}),
        ("randomize string", {"randomize": "y"}),
    ]
]
CONFIG += [
    (f"from_env {name}={raw!r}"[:60], ConfigurationError,
     (lambda e: lambda c: RunQueueConfig.from_env(e))({name: raw}))
    for name, raw in [
        ("FAIRQ_LEASE_MS", "abc"),
        ("FAIRQ_LEASE_MS", "50"),
        ("FAIRQ_LEASE_MS", "1e400"),
        ("FAIRQ_SHARD_COUNT", "0"),
        ("FAIRQ_SHARD_COUNT", "4.5"),
        ("FAIRQ_PREFIX", "a b"),
        ("FAIRQ_CK_VTIME_ENABLED", "maybe"),
        ("FAIRQ_CK_VTIME_QUANTUM", "nan"),
        ("FAIRQ_CK_VTIME_QUANTUM", "inf"),
        ("FAIRQ_CK_VTIME_JOIN_POLICY", "sideways"),
        ("FAIRQ_MAX_PER_KEY_PER_CALL", "0"),
        ("FAIRQ_OUTCOME_TTL_SECONDS", "9" * 500),
    ]
]  # fmt: skip

ALL: list[Case] = STORE + APP + WORKER + CONFIG

# Product bugs this corpus found (B1-B8, B10 in /work/notes/bugs-faults.md) were fixed in
# 7de48d3 and 4b5783b; every case is a plain assertion again. A new bug found here gets a
# ``pytest.param(..., marks=pytest.mark.xfail(strict=True, reason="Bn: ..."))`` in _params.


def _params(cases: list[tuple[Any, ...]]) -> list[Any]:
    return [pytest.param(*case, id=case[0]) for case in cases]


# ---------------------------------------------------------------- harness


def private_db(url: str) -> str:
    """The session server's logical database 9 for a plain ``redis://`` URL: every
    snapshot SCANs the whole database, so the corpus keeps its own (other tests leave
    100,000s of keys in db 0). Cluster and unix URLs are used as they are."""
    parsed = urlparse(url)
    if parsed.scheme not in ("redis", "rediss"):
        return url
    return urlunparse(parsed._replace(path="/9"))


@pytest.fixture(scope="module")
async def ctx(redis_url: str) -> AsyncIterator[Ctx]:
    """One seeded store for the module (a bad call writes nothing, so the cases share
    it; each case still compares its own before/after): limits, queued, keyed, delayed
    and running runs, and an app with a task on the same prefix."""
    import os

    env = Environment("org1", "proj1", "prod")
    prefix = f"corpus{os.getpid()}"
    url = private_db(redis_url)
    rq = RunQueue(await connect(url), RunQueueConfig(prefix=prefix))
    await rq.purge()
    await rq.set_env_limits(env, concurrency=5)
    await rq.set_queue_concurrency(env, "q", 3)
    await rq.enqueue(env, "q", "running", {"a": 0}, head_start_ms=60_000)
    await rq.enqueue(env, "q", "queued", {"a": 1})
    await rq.enqueue(env, "q", "keyed", concurrency_key="k", tenant="acme")
    await rq.enqueue(env, "q", "later", delay_ms=3_600_000, ttl_ms=7_200_000)
    (delivery,) = await rq.dequeue(1, env=env, queues=["q"], lease_ms=3_600_000)
    assert delivery.run_id == "running"
    app = Fairq(env, url=url, config=RunQueueConfig(prefix=prefix))

    @app.task(queue="jobs")
    async def jobs(payload: Any) -> Any:
        return payload

    await jobs.trigger({"n": 1}, run_id="job-1")
    yield Ctx(rq, env, delivery, app, jobs)
    await app.aclose()
    await rq.purge()
    await rq.close()


async def snapshot(rq: RunQueue) -> dict[str, bytes]:
    """:func:`tests.state.keyspace` with the DUMPs in one pipeline (same result, a
    fraction of the round trips; checked against it in a control test)."""
    names: list[bytes] = []
    for pattern in ("{" + rq.keys.prefix + ".*", rq.keys.prefix + ":*"):
        names += [k async for k in rq.client.scan_iter(match=pattern, count=1000)]
    pipe = rq.client.pipeline(transaction=False)
    for name in names:
        pipe.dump(name)
    dumps = await pipe.execute()
    return {n.decode(): d for n, d in zip(names, dumps, strict=True) if d is not None}


async def restore(rq: RunQueue, before: dict[str, bytes]) -> None:
    """Put the shared store back as it was (only a buggy case writes): later cases then
    start from the seeded state, and nothing a bug wrote (e.g. a lock with an expiry)
    can change under them."""
    after = await snapshot(rq)
    if after == before:
        return
    for name in after.keys() - before.keys():
        await rq.client.delete(name)
    for name, dumped in before.items():
        if after.get(name) != dumped:
            await rq.client.restore(name, 0, dumped, replace=True)


async def _invoke(call: Call, c: Ctx) -> None:
    result = call(c)
    if inspect.isawaitable(result):
        await result


def _ids(cases: list[Case]) -> list[str]:
    return [name for name, _, _ in cases]


def test_the_corpus_is_large_and_unique() -> None:
    """At least 300 cases, each named once (a name collision would hide a case)."""
    names = _ids(ALL) + [n for n, _ in CLI]
    assert len(names) >= 300, len(names)
    assert len(set(names)) == len(names), [n for n in names if names.count(n) > 1]


@pytest.mark.parametrize(("name", "expected", "call"), _params(ALL))
async def test_bad_input_raises_a_specific_error_and_changes_nothing(
    ctx: Ctx, name: str, expected: type[BaseException], call: Call
) -> None:
    """The call raises ``expected`` (a FairqError, except where the API documents
    another type), its message is short, and every key of the prefix is unchanged."""
    before = await snapshot(ctx.rq)
    try:
        with pytest.raises(expected) as caught:
            await _invoke(call, ctx)
        assert isinstance(caught.value, FairqError), type(caught.value)
        assert len(str(caught.value)) < MAX_MESSAGE, str(caught.value)[:500]
        assert await snapshot(ctx.rq) == before
    finally:
        await restore(ctx.rq, before)


async def test_the_snapshot_sees_a_good_call(ctx: Ctx) -> None:
    """Control: the snapshot equals tests.state.keyspace, and a valid call changes it
    (so 'unchanged' means something)."""
    assert await snapshot(ctx.rq) == await keyspace(ctx.rq)
    before = await snapshot(ctx.rq)
    await ctx.rq.enqueue(ctx.env, "control", "fresh-run")
    changed = await snapshot(ctx.rq) != before
    await restore(ctx.rq, before)
    assert changed
    assert await snapshot(ctx.rq) == before


# ---------------------------------------------------------------- the CLI

ENV_ID = "org1:proj1:prod"
CLI: list[tuple[str, list[str]]] = [
    (f"cli {' '.join(argv)}"[:80], argv)
    for argv in [
        ["limits", "set", ENV_ID, "--concurrency", "abc"],
        ["limits", "set", ENV_ID, "--concurrency", "-1"],
        ["limits", "set", ENV_ID, "--concurrency", "1.5"],
        ["limits", "set", ENV_ID, "--concurrency", "nan"],
        ["limits", "set", ENV_ID, "--concurrency", "9" * 500],
        ["limits", "set", ENV_ID, "--burst", "0.5"],
        ["limits", "set", ENV_ID, "--burst", "nan"],
        ["limits", "set", ENV_ID, "--burst", "inf"],
        ["limits", "set", ENV_ID, "--size-limit", "-1"],
        ["limits", "set", ENV_ID, "--order", "random"],
        ["limits", "set", ENV_ID, "--concurrency", "5", "--order", "random"],
        ["limits", "set", ENV_ID, "q", "--rate", "fast"],
        ["limits", "set", ENV_ID, "q", "--rate", "1e400/s"],
        ["limits", "set", ENV_ID, "q", "--total", "-3"],
        ["limits", "set", ENV_ID, "q", "--concurrency", "4", "--size-limit", "x"],
        ["limits", "set", ENV_ID, "q", "--burst", "2"],
        ["limits", "set", ENV_ID, "--rate", "5/s"],
        ["limits", "set", ENV_ID, "bad queue", "--concurrency", "3"],
        ["limits", "set", ENV_ID, "q" * 10_000, "--concurrency", "3"],
        ["limits", "set", "a:b", "--concurrency", "3"],
        ["limits", "set", "o" * 10_000 + ":p:e", "--concurrency", "3"],
        ["limits", "set", ENV_ID],
        ["limits", "weight", ENV_ID, "q", "k", "nan"],
        ["limits", "weight", ENV_ID, "q", "k", "abc"],
        ["limits", "weight", ENV_ID, "q", "k", "0"],
        ["limits", "weight", ENV_ID, "q", "k", "1e400"],
        ["limits", "weight", ENV_ID, "q", "x" * 300, "2"],
        ["limits", "pause", ENV_ID, "a:b"],
        ["worker", "app:app", "--linger-ms", "-1"],
        ["worker", "app:app", "--linger-ms", "5000"],
        ["cancel", ENV_ID, "bad:id"],
        ["cancel", ENV_ID, "r" * 10_000],
        ["dlq", "list", ENV_ID, "--limit", "0"],
        ["dlq", "list", ENV_ID, "--limit", "abc"],
        ["dlq", "redrive", ENV_ID, "not-there"],
        ["dlq", "redrive", ENV_ID, "bad:id"],
        ["stats", "--env", "a:b"],
        ["stats", "--tenants", "--env", "a:b"],
        ["stats", "--tenants", "--env", ENV_ID, "--queue", "a:b"],
    ]
]


@pytest.mark.parametrize(("name", "argv"), _params(CLI))
async def test_bad_cli_input_exits_with_a_short_message_and_changes_nothing(
    ctx: Ctx, redis_url: str, name: str, argv: list[str]
) -> None:
    """``fairq ...`` with a bad argument exits non-zero with a one-line error (no
    traceback, short), and the keyspace is unchanged."""
    from fairq.cli import main

    before = await snapshot(ctx.rq)
    runner = CliRunner()
    result = await asyncio.to_thread(
        runner.invoke,
        main,
        argv,
        env={"FAIRQ_REDIS_URL": private_db(redis_url), "FAIRQ_PREFIX": ctx.rq.config.prefix},
    )
    assert result.exit_code in (1, 2), (result.exit_code, result.output[-500:], result.exception)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    error = result.output.strip().splitlines()[-1]
    assert error.startswith("Error"), result.output[-500:]
    assert len(error) < MAX_MESSAGE, error[:500]
    after = await snapshot(ctx.rq)
    await restore(ctx.rq, before)
    assert after == before


async def test_the_cli_writes_the_test_prefix(ctx: Ctx, redis_url: str) -> None:
    """Control: a valid ``fairq limits set`` changes the snapshot (same server, prefix)."""
    from fairq.cli import main

    before = await snapshot(ctx.rq)
    result = await asyncio.to_thread(
        CliRunner().invoke, main, ["limits", "set", ENV_ID, "--concurrency", "7"],
        env={"FAIRQ_REDIS_URL": private_db(redis_url), "FAIRQ_PREFIX": ctx.rq.config.prefix},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    changed = await snapshot(ctx.rq) != before
    await restore(ctx.rq, before)
    assert changed


# ---------------------------------------------------------------- errors that explain


@pytest.mark.parametrize(
    "parts",
    [("o:x", "p", "e"), ("o", "p/q", "e"), ("o", "p", "e:1"), ("o", "p", "{e}"), ("", "p", "e")],
)
def test_separators_in_environment_names_are_refused(parts: tuple[str, str, str]) -> None:
    with pytest.raises(InvalidNameError) as info:
        Environment(*parts)
    assert isinstance(info.value, ValueError)


async def test_payload_errors_name_the_problem(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue(max_payload_bytes=64)
    with pytest.raises(PayloadError, match="larger than the maximum 64"):
        await rq.enqueue(env, "q", "r", "x" * 100, now_ms=1_700_000_000_000)
    with pytest.raises(PayloadError, match="not JSON"):
        await rq.enqueue(env, "q", "r", object(), now_ms=1_700_000_000_000)


async def test_invalid_name_errors_carry_their_fields(make_queue: Any, env: Environment) -> None:
    rq: RunQueue = await make_queue()
    with pytest.raises(InvalidNameError) as info:
        await rq.enqueue(env, "task:1", "r", now_ms=1_700_000_000_000)
    assert (info.value.kind, info.value.value) == ("queue", "task:1")
    assert "task:1" in str(info.value)


async def test_a_dead_server_url_names_the_url() -> None:
    url = "redis://127.0.0.1:1/0"
    with pytest.raises(ServerUnavailableError) as info:
        await connect(url)
    assert info.value.url == url
    assert url in str(info.value)


async def test_a_dead_server_url_hides_the_password() -> None:
    url = "redis://user:s3cret@127.0.0.1:1/0"
    with pytest.raises(ServerUnavailableError) as info:
        await connect(url)
    assert "s3cret" not in str(info.value)
    assert "127.0.0.1:1" in str(info.value)


async def test_a_missing_unix_socket_names_the_path() -> None:
    url = "unix:///nonexistent/fairq.sock"
    with pytest.raises(ServerUnavailableError) as info:
        await connect(url)
    assert "/nonexistent/fairq.sock" in str(info.value)


async def test_a_malformed_url_is_a_server_error() -> None:
    with pytest.raises(ServerUnavailableError):
        await connect("http://localhost:6379")
