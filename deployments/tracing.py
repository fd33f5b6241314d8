"""OpenTelemetry traces of a request's path through the ingress replica; off by default.

Turned on by OpenTelemetry's own variable ``OTEL_TRACES_EXPORTER`` in the replicas' environment:
``console`` (spans as JSON on the replica's stdout, in its Ray log) or ``otlp`` (OTLP over HTTP,
configured by the standard ``OTEL_EXPORTER_OTLP_*`` variables; needs the ``tracing`` extra). The
service is named by ``OTEL_SERVICE_NAME`` (``spout`` when unset).

Each HTTP request is one span (``POST /v1/chat/completions``, kind server), a child of the trace in
its ``traceparent`` header when it has one (W3C trace context), with one child per phase:

- ``spout.admission``: parsing, limits and tokenization, until the engine has taken the request;
- ``spout.queue_and_prefill``: from then to the request's first output (the engine's queue, the
  prefill, the first detokenized text);
- ``spout.decode``: from the first output to the last, with one event per engine message that
  reached the request (``tokens``: how many it carried).

The request's span ends when its response is complete: for a stream, after its last frame.
Tracing off costs a request one check per engine message. The API (``opentelemetry-api``) comes
with Ray Serve; the SDK and the exporter are imported only when tracing is on.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

EXPORTER_ENV = "OTEL_TRACES_EXPORTER"
SERVICE_NAME_ENV = "OTEL_SERVICE_NAME"
EXPORTERS = ("console", "otlp")

current_trace: ContextVar[RequestTrace | None] = ContextVar("spout_request_trace", default=None)
"""The trace of the request the running task handles (set by the ingress, read where the engine takes it)."""


def tracer_from_environment(environ: Mapping[str, str]) -> Tracer | None:
    """The replica's tracer, or None when ``OTEL_TRACES_EXPORTER`` is unset or ``none``."""
    name = environ.get(EXPORTER_ENV, "none").strip().lower()
    if name in ("", "none"):
        return None
    return tracer_exporting_to(exporter_named(name), environ.get(SERVICE_NAME_ENV) or "spout")


def tracer_exporting_to(exporter: SpanExporter, service_name: str) -> Tracer:
    """A tracer of its own provider (not the process's global one) that batches spans to ``exporter``."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider.get_tracer("spout")


def exporter_named(name: str) -> SpanExporter:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as error:
            raise ValueError(f"{EXPORTER_ENV}=otlp needs the tracing extra: pip install -e '.[tracing]'") from error
        return OTLPSpanExporter()
    raise ValueError(f"{EXPORTER_ENV}={name!r}: Spout exports traces to one of {EXPORTERS} (or none)")


class RequestTrace:
    """One HTTP request's spans. The request's span ends once both the handler has answered and, when
    the engine took the request, its outputs have ended (a stream's end comes after the answer)."""

    def __init__(self, tracer: Tracer, method: str, path: str, headers: Mapping[str, str]) -> None:
        parent = TraceContextTextMapPropagator().extract(headers)
        attributes = {"http.request.method": method, "url.path": path}
        self.tracer = tracer
        self.span = tracer.start_span(f"{method} {path}", context=parent, kind=SpanKind.SERVER, attributes=attributes)
        self.context = trace.set_span_in_context(self.span)
        self.phase: Span | None = self._start_phase("spout.admission")
        self.holders = 1  # the handler; the outputs hold it too once the engine took the request

    def _start_phase(self, name: str, **attributes: int) -> Span:
        return self.tracer.start_span(name, context=self.context, attributes=attributes)

    def _end_phase(self) -> None:
        if self.phase is not None:
            self.phase.end()
            self.phase = None

    def _next_phase(self, name: str, **attributes: int) -> None:
        self._end_phase()
        self.phase = self._start_phase(name, **attributes)

    def submitted(self, prompt_tokens: int, choices: int) -> None:
        """The engine took the request's choices."""
        self.holders += 1
        self._next_phase("spout.queue_and_prefill", prompt_tokens=prompt_tokens, choices=choices)

    def message(self, tokens: int, first: bool) -> None:
        """An engine message reached the request with ``tokens`` new tokens."""
        if first:
            self._next_phase("spout.decode")
        self.phase.add_event("engine message", {"tokens": tokens})

    def outputs_ended(self, completion_tokens: int) -> None:
        """The request's outputs ended (all its choices finished, or it was aborted)."""
        self.span.set_attribute("completion_tokens", completion_tokens)
        self._end_phase()
        self._release()

    def answered(self, status_code: int) -> None:
        self.span.set_attribute("http.response.status_code", status_code)
        if status_code >= 500:
            self.span.set_status(Status(StatusCode.ERROR))
        self._release()

    def _release(self) -> None:
        self.holders -= 1
        if self.holders == 0:
            self._end_phase()
            self.span.end()
