"""Spans only when a tracer provider is configured; the trace context of a caller's span."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from fairq import telemetry
from fairq.keys import Environment
from fairq.models import EnqueueRequest

REQUEST = EnqueueRequest(Environment("o", "p", "e"), "q", "r1", None)


@pytest.fixture
def provider() -> Iterator[TracerProvider]:
    given = TracerProvider()
    telemetry.use_tracer_provider(given)
    yield given
    telemetry.use_tracer_provider(None)
    given.shutdown()


def test_no_span_without_a_configured_provider() -> None:
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    with telemetry.trigger_span([REQUEST]) as span:
        assert span is None
    assert telemetry.with_trace_context(REQUEST) is REQUEST


def test_a_recording_span_with_a_provider_and_its_context_travels(
    provider: TracerProvider,
) -> None:
    with telemetry.trigger_span([REQUEST]) as span:
        assert span is not None and span.is_recording()
        carried = telemetry.with_trace_context(REQUEST)
    assert carried.trace_context is not None
    trace_id = format(span.get_span_context().trace_id, "032x")
    assert carried.trace_context.startswith(f"00-{trace_id}-")


def test_a_callers_own_span_is_carried_even_without_fairq_spans() -> None:
    """A caller tracing with a provider it did not make global still gets its context
    carried with the run (fairq makes no span of its own then)."""
    own = TracerProvider()
    with own.get_tracer("app").start_as_current_span("request"):
        carried = telemetry.with_trace_context(REQUEST)
    own.shutdown()
    assert carried.trace_context is not None


def test_a_global_provider_set_later_is_seen_after_the_recheck_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With no provider, the answer is kept for NO_PROVIDER_RECHECK_S (asking the API
    reads the process environment); a global provider set meanwhile is seen once that
    time has passed, and one given to fairq at once. (A fake clock; the global provider
    is the API's getter, replaced: a real global can be set once per process.)"""
    clock = [1_000.0]
    monkeypatch.setattr(telemetry, "_clock", lambda: clock[0])
    monkeypatch.setattr(telemetry, "_no_provider_until", 0.0)
    telemetry._load()
    later = TracerProvider()
    assert telemetry._tracing() is False
    monkeypatch.setattr(telemetry._trace, "get_tracer_provider", lambda: later)
    clock[0] += telemetry.NO_PROVIDER_RECHECK_S / 2
    assert telemetry._tracing() is False  # the kept answer
    telemetry.use_tracer_provider(later)
    try:
        assert telemetry._tracing() is True  # fairq's own provider: at once
    finally:
        telemetry.use_tracer_provider(None)
    clock[0] += telemetry.NO_PROVIDER_RECHECK_S
    assert telemetry._tracing() is True  # the global one, after the interval
    later.shutdown()
