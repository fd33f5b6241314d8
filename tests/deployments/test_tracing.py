"""Traces (`deployments.tracing`) in-process: a request is one server span under the caller's
``traceparent``, with its admission, queue-and-prefill and decode phases (one event per engine
message), through the real `EngineClient` against a scripted engine; the exporter is chosen by
OpenTelemetry's own variable and tracing is off without it."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from deployments.tracing import RequestTrace, current_trace, tracer_from_environment
from tests.deployments.in_process import FakeEngineClient, ingress, post
from tests.deployments.test_engine_client_tools import SCRIPT, TOKENIZER, run

TRACE_ID, CALLER_SPAN_ID = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN_ID}-01"
PHASES = ["spout.admission", "spout.queue_and_prefill", "spout.decode"]


def in_memory_tracer():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test"), exporter


@pytest.mark.parametrize("streaming", [False, True])
def test_a_request_is_one_span_with_its_phases_under_the_callers_trace(streaming):
    tracer, exporter = in_memory_tracer()
    trace = RequestTrace(tracer, "POST", "/v1/chat/completions", {"traceparent": TRACEPARENT})
    token = current_trace.set(trace)  # as the ingress sets it for the request's task
    try:
        asyncio.run(run(3, streaming=streaming))
    finally:
        current_trace.reset(token)
    assert [s.name for s in exporter.get_finished_spans()] == PHASES, "the request's span waits for the handler's answer"
    trace.answered(200)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    request = spans["POST /v1/chat/completions"]
    assert (request.context.trace_id, request.parent.span_id) == (int(TRACE_ID, 16), int(CALLER_SPAN_ID, 16))
    assert request.kind == SpanKind.SERVER and request.attributes["http.response.status_code"] == 200
    script_tokens = len(TOKENIZER.encode(SCRIPT, add_special_tokens=False))
    assert request.attributes["completion_tokens"] == script_tokens
    phases = [spans[name] for name in PHASES]
    assert all(phase.parent.span_id == request.context.span_id for phase in phases)
    assert all(a.end_time <= b.start_time for a, b in zip(phases, phases[1:])) and phases[-1].end_time <= request.end_time
    assert spans["spout.queue_and_prefill"].attributes == {"prompt_tokens": len(TOKENIZER.encode("Weather?")), "choices": 1}
    events = spans["spout.decode"].events
    assert {e.name for e in events} == {"engine message"} and sum(e.attributes["tokens"] for e in events) == script_tokens


def test_a_request_refused_before_the_engine_ends_with_its_status():
    tracer, exporter = in_memory_tracer()
    RequestTrace(tracer, "POST", "/v1/completions", {}).answered(503)
    admission, request = exporter.get_finished_spans()
    assert admission.name == "spout.admission" and admission.parent.span_id == request.context.span_id
    assert request.parent is None and request.status.status_code == StatusCode.ERROR and request.attributes["http.response.status_code"] == 503


def test_the_exporter_comes_from_opentelemetrys_variable():
    assert tracer_from_environment({}) is None and tracer_from_environment({"OTEL_TRACES_EXPORTER": "none"}) is None
    assert tracer_from_environment({"OTEL_TRACES_EXPORTER": "console"}) is not None
    with pytest.raises(ValueError, match="one of"):
        tracer_from_environment({"OTEL_TRACES_EXPORTER": "zipkin"})


def test_the_ingress_traces_each_request_under_its_traceparent():
    """The replica's own request path (`tests.deployments.in_process`): a request the limits refuse is
    one span, child of the caller's, with its status."""
    tracer, exporter = in_memory_tracer()

    async def answer() -> int:
        made = ingress(FakeEngineClient(), tracer=tracer)
        request = post("/v1/completions", {"model": "tiny-random", "prompt": "hi", "max_tokens": -1}, headers=[(b"traceparent", TRACEPARENT.encode())])
        return (await made(request)).status_code

    assert asyncio.run(answer()) == 400
    admission, request = exporter.get_finished_spans()
    assert request.name == "POST /v1/completions" and request.attributes["http.response.status_code"] == 400
    assert (request.context.trace_id, request.parent.span_id) == (int(TRACE_ID, 16), int(CALLER_SPAN_ID, 16))
    assert admission.parent.span_id == request.context.span_id
