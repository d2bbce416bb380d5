"""OpenTelemetry tracing: a span per trigger (producer) and per run attempt (consumer).

Optional: install ``fairq[otel]`` (``opentelemetry-api`` and ``-sdk``) and configure a
tracer provider as usual (``opentelemetry.trace.set_tracer_provider``, or
:func:`use_tracer_provider` for fairq alone). Without the package every function here is
a no-op costing one attribute check; with the API but no tracer provider configured (the
API's default proxy), no span is started either: one check per trigger and per run,
instead of the tens of microseconds a non-recording span and its context cost (a global
provider set after the first trigger is seen within a second).

Spans:

* ``fairq trigger <queue>`` (kind PRODUCER) around each ``Task.trigger`` /
  ``trigger_many`` enqueue: attributes ``fairq.env``, ``fairq.queue``, ``fairq.run_id``,
  ``fairq.concurrency_key``, ``fairq.tenant`` (``fairq.runs`` for a batch).
* ``fairq run <queue>`` (kind CONSUMER) around each attempt a worker runs, current while
  the task runs (a task's own spans are its children): the same attributes plus
  ``fairq.attempt`` (1 = first) and ``fairq.outcome``; a failure is recorded as an
  exception event with status ERROR.

The trigger's span context travels with the run as a W3C ``traceparent`` when the store
carries one (``EnqueueRequest.trace_context`` / ``Delivery.trace_context``): the run's span
is then linked to the span of the trigger that queued it (a link, not a parent: the run
may start much later, be retried, or be redriven).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar

if TYPE_CHECKING:
    from fairq.models import Delivery, EnqueueRequest

#: Whether the optional extra is installed (imported on the first span, not before: it
#: costs tens of milliseconds, which ``fairq --help`` need not pay).
AVAILABLE: Final = importlib.util.find_spec("opentelemetry") is not None
_trace: Any = None
_propagator: Any = None


def _load() -> None:
    global _trace, _propagator
    if _trace is None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        _propagator = TraceContextTextMapPropagator()
        _trace = trace


#: The instrumentation scope of fairq's spans.
TRACER_NAME: Final = "fairq"
#: Longest trace context carried with a run.
MAX_TRACE_CONTEXT_CHARS: Final = 512

_provider: Any = None
R = TypeVar("R")


def use_tracer_provider(provider: Any) -> None:
    """Use this tracer provider for fairq's spans (None: the global one again)."""
    global _provider
    _provider = provider


def _tracer() -> Any:
    _load()
    if _provider is not None:
        return _provider.get_tracer(TRACER_NAME)
    return _trace.get_tracer(TRACER_NAME)


#: While no tracer provider is set, how long (s) that answer is kept: asking the API
#: costs a look into the process environment (about 1.5 µs, on every trigger and run).
#: A global provider set later is seen within this time; one given to
#: :func:`use_tracer_provider` at once.
NO_PROVIDER_RECHECK_S: Final = 1.0
_no_provider_until = 0.0
#: The clock of that interval.
_clock: Callable[[], float] = time.monotonic


def _tracing() -> bool:
    """Whether spans would go anywhere: a provider given to fairq, or a global one set."""
    global _no_provider_until
    if not AVAILABLE:
        return False
    if _provider is not None:
        return True
    now = _clock()
    if now < _no_provider_until:
        return False
    _load()
    if isinstance(
        _trace.get_tracer_provider(), (_trace.ProxyTracerProvider, _trace.NoOpTracerProvider)
    ):
        _no_provider_until = now + NO_PROVIDER_RECHECK_S
        return False
    return True


def _attributes(
    env: str, queue: str, run_id: str, key: str | None, tenant: str | None
) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "messaging.system": "fairq",
        "fairq.env": env,
        "fairq.queue": queue,
        "fairq.run_id": run_id,
    }
    if key is not None:
        attrs["fairq.concurrency_key"] = key
    if tenant is not None:
        attrs["fairq.tenant"] = tenant
    return attrs


def trigger_span(requests: Sequence[EnqueueRequest]) -> contextlib.AbstractContextManager[Any]:
    """The producer span of one trigger (or one batch): current while the runs are
    enqueued. Gives the span (None when nothing traces)."""
    if not requests or not _tracing():
        return _NO_SPAN
    return _producer_span(requests)


#: What :func:`trigger_span` gives when nothing traces (reusable: it holds no state).
_NO_SPAN: Final = contextlib.nullcontext()


@contextlib.contextmanager
def _producer_span(requests: Sequence[EnqueueRequest]) -> Iterator[Any]:
    first = requests[0]
    attrs = _attributes(
        first.env.id, first.queue, first.run_id, first.concurrency_key, first.tenant
    )
    if len(requests) > 1:
        attrs["fairq.runs"] = len(requests)
    tracer = _tracer()
    with tracer.start_as_current_span(
        f"fairq trigger {first.queue}", kind=_trace.SpanKind.PRODUCER, attributes=attrs
    ) as span:
        yield span


def current_trace_context() -> str | None:
    """The current span's W3C ``traceparent`` (None without a recording span)."""
    if not AVAILABLE:
        return None
    _load()
    if not _trace.get_current_span().get_span_context().is_valid:
        return None  # the common case, without building a carrier
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    parent = carrier.get("traceparent")
    if parent is None:
        return None
    state = carrier.get("tracestate")
    text = parent if not state else f"{parent};{state}"
    return text if len(text) <= MAX_TRACE_CONTEXT_CHARS else parent


def with_trace_context(request: R) -> R:
    """``request`` carrying the current trace context, when the store's request type has
    a ``trace_context`` field (else unchanged)."""
    if not AVAILABLE:
        return request
    fields = getattr(type(request), "__dataclass_fields__", None)
    if fields is None or "trace_context" not in fields:
        return request
    if getattr(request, "trace_context", None) is not None:
        return request
    context = current_trace_context()
    if context is None:
        return request
    return dataclasses.replace(request, trace_context=context)  # type: ignore[type-var]


def _link_of(trace_context: str | None) -> list[Any]:
    if not trace_context:
        return []
    parent, _, state = trace_context.partition(";")
    carrier = {"traceparent": parent}
    if state:
        carrier["tracestate"] = state
    _load()
    context = _propagator.extract(carrier)
    span_context = _trace.get_current_span(context).get_span_context()
    if not span_context.is_valid:
        return []
    return [_trace.Link(span_context)]


class RunSpan:
    """The consumer span of one run attempt (a no-op without OpenTelemetry)."""

    __slots__ = ("span",)

    def __init__(self, span: Any) -> None:
        self.span = span

    def outcome(self, outcome: str, exc: BaseException | None = None) -> None:
        """Record how the attempt ended (and its exception, as an error)."""
        if self.span is None:
            return
        self.span.set_attribute("fairq.outcome", outcome)
        if exc is not None:
            self.span.record_exception(exc)
            self.span.set_status(_trace.Status(_trace.StatusCode.ERROR, type(exc).__name__))


def run_span(delivery: Delivery) -> contextlib.AbstractContextManager[RunSpan]:
    """The span of one attempt, current while it runs; linked to its trigger's span when
    the run carries a trace context."""
    if not _tracing():
        return _NO_RUN_SPAN
    return _consumer_span(delivery)


#: What :func:`run_span` gives when nothing traces (reusable: a span of None is a no-op).
_NO_RUN_SPAN: Final = contextlib.nullcontext(RunSpan(None))


@contextlib.contextmanager
def _consumer_span(delivery: Delivery) -> Iterator[RunSpan]:
    attrs = _attributes(
        delivery.env.id, delivery.queue, delivery.run_id, delivery.concurrency_key,
        delivery.tenant,
    )  # fmt: skip
    attrs["fairq.attempt"] = delivery.attempt + 1
    tracer = _tracer()
    links = _link_of(getattr(delivery, "trace_context", None))
    with tracer.start_as_current_span(
        f"fairq run {delivery.queue}", kind=_trace.SpanKind.CONSUMER, attributes=attrs,
        links=links, record_exception=False, set_status_on_exception=False,
    ) as span:  # fmt: skip
        yield RunSpan(span)


__all__ = [
    "AVAILABLE",
    "MAX_TRACE_CONTEXT_CHARS",
    "TRACER_NAME",
    "RunSpan",
    "current_trace_context",
    "run_span",
    "trigger_span",
    "use_tracer_provider",
    "with_trace_context",
]
