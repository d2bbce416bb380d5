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
