"""Distributed traces (OpenTelemetry): a span on every gRPC hop, NATS publish and consume, S3
call and LLM request, joined into one trace per request by W3C trace context (``traceparent``) carried in gRPC
metadata and NATS message headers.

Off by default, and then free: every hook checks one module global and returns a shared no-op.
``configure_tracing`` (called by meshkit.rpc.server for every service process) turns it on when
``RAGMESH_TRACE_FILE`` (JSON lines, one span a line; ``ragmesh up --trace-file``) or
``RAGMESH_OTLP_ENDPOINT`` (an OpenTelemetry collector over OTLP/gRPC) is set.

    with tracing.outgoing("embedder/Embed", tracing.CLIENT, {...}) as carrier:
        await stub.Embed(request, metadata=(*metadata, *carrier.items()))

Spans carry the request id (``ragmesh.request_id``) so a trace and the logs of a request meet.
Attribute values are ids, names and status codes only, never request text or secrets.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from meshkit.core.logs import current_request_id

if TYPE_CHECKING:
    from meshkit.settings import MeshSettings

log = logging.getLogger("meshkit.rpc.tracing")

CLIENT, SERVER, PRODUCER, CONSUMER, INTERNAL = (
    SpanKind.CLIENT,
    SpanKind.SERVER,
    SpanKind.PRODUCER,
    SpanKind.CONSUMER,
    SpanKind.INTERNAL,
)
REQUEST_ID_ATTRIBUTE = "ragmesh.request_id"
# The W3C headers: what a carrier (gRPC metadata, NATS headers) may bring in.
TRACE_HEADERS = ("traceparent", "tracestate")
# Spans wait at most this long in memory before the exporter writes them.
EXPORT_DELAY_MS = 1000

_PROPAGATOR = TraceContextTextMapPropagator()
# The tracer of this process; None: tracing off (every hook returns at once).
_tracer: trace.Tracer | None = None
_provider: TracerProvider | None = None


def enabled() -> bool:
    return _tracer is not None


# ------------------------------------------------------------------------------------ set-up


def configure_tracing(service: str, settings: MeshSettings) -> bool:
    """Turn tracing on for this process when a file or an OTLP endpoint is configured; returns
    whether it is on."""
    global _tracer, _provider
    exporters = _exporters(settings)
    if not exporters:
        return False
    provider = TracerProvider(
        # The pid tells apart the processes of one service (shards, replicas, pre-fork workers).
        resource=Resource.create({"service.name": service, "service.instance.id": str(os.getpid())}),
        sampler=ParentBased(TraceIdRatioBased(settings.trace_sample_ratio)),
    )
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=EXPORT_DELAY_MS))
    _provider, _tracer = provider, provider.get_tracer("meshkit")
    log.info(
        "tracing on",
        extra={"trace_file": str(settings.trace_file or ""), "otlp_endpoint": settings.otlp_endpoint},
    )
    return True


def flush_tracing(timeout_s: float = 5.0) -> bool:
    """Export every span ended so far (tests, and before a process hands over its file)."""
    return _provider is None or _provider.force_flush(int(timeout_s * 1000))


def shutdown_tracing() -> None:
    """Export what is still buffered (the provider also does it at interpreter exit)."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer, _provider = None, None


def _exporters(settings: MeshSettings) -> list[SpanExporter]:
    exporters: list[SpanExporter] = []
    if settings.trace_file is not None:
        exporters.append(JsonLinesExporter(settings.trace_file))
    if settings.otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporters.append(
            OTLPSpanExporter(
                endpoint=settings.otlp_endpoint,
                insecure=settings.otlp_endpoint.startswith("http://"),
                credentials=_otlp_credentials(settings),
            )
        )
    return exporters


def _otlp_credentials(settings: MeshSettings) -> Any:
    if not settings.otlp_endpoint.startswith("https://") or settings.tls_ca_file is None:
        return None  # plaintext, or TLS verified against the system CAs
    import grpc

    return grpc.ssl_channel_credentials(root_certificates=Path(settings.tls_ca_file).read_bytes())


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """One finished span as the JSON object the file exporter writes."""
    ctx = span.get_span_context()
    parent = span.parent
    return {
        "trace_id": f"{ctx.trace_id:032x}" if ctx else "",
        "span_id": f"{ctx.span_id:016x}" if ctx else "",
        "parent_id": f"{parent.span_id:016x}" if parent else None,
        "name": span.name,
        "kind": span.kind.name,
        "service": str(span.resource.attributes.get("service.name", "")),
        "instance": str(span.resource.attributes.get("service.instance.id", "")),
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
        "links": [
            {"trace_id": f"{link.context.trace_id:032x}", "span_id": f"{link.context.span_id:016x}"}
            for link in span.links
        ],
    }


class JsonLinesExporter(SpanExporter):
    """Appends finished spans to a file, one JSON object a line. Each batch is one write to a
    file opened O_APPEND, so the processes of a local stack can share the file without
    interleaving their lines."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._fd is None:
            return SpanExportResult.FAILURE
        data = "".join(json.dumps(span_record(s), default=str) + "\n" for s in spans).encode()
        try:
            os.write(self._fd, data)
        except OSError:
            log.warning("could not write spans", extra={"trace_file": str(self.path), "spans": len(spans)})
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def read_spans(path: Path) -> list[dict[str, Any]]:
    """The spans a JsonLinesExporter wrote (none yet: no file; a torn last line, still being
    written, is skipped)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    spans = []
    for line in text.splitlines():
        try:
            spans.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return spans


# ------------------------------------------------------------------------- outgoing spans


class Outgoing:
    """A span around one outgoing operation (a gRPC call, a NATS publish, an S3 request). It is
    not made the current span (streams and threads outlive a ``with`` in the caller's context);
    ``carrier`` holds the trace headers that make the callee's spans its children."""

    __slots__ = ("carrier", "span")

    def __init__(self, span: Span | None) -> None:
        self.span = span
        self.carrier: dict[str, str] = {}
        if span is not None:
            _PROPAGATOR.inject(self.carrier, context=trace.set_span_in_context(span))

    def __enter__(self) -> dict[str, str]:
        return self.carrier

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.span is None:
            return
        if isinstance(exc, GeneratorExit):
            # A stream its reader stopped reading: not a failure of the call.
            self.span.set_attribute("ragmesh.closed_early", True)
        elif exc is not None:
            mark_failed(self.span, exc)
        self.span.end()


NO_SPAN = Outgoing(None)


def outgoing(name: str, kind: SpanKind, attributes: Mapping[str, str | int] | None = None) -> Outgoing:
    """A child of the current span for a call to another process (no-op when tracing is off)."""
    if _tracer is None:
        return NO_SPAN
    span = _tracer.start_span(name, kind=kind, attributes=_with_request_id(attributes))
    return Outgoing(span)


def rpc_call(target: str, method: str) -> Outgoing:
    """The span of one outgoing gRPC call to ``target`` (a downstream's name)."""
    if _tracer is None:
        return NO_SPAN
    attributes = {"rpc.system": "grpc", "rpc.method": method, "ragmesh.target": target}
    return outgoing(f"{target}/{method}", CLIENT, attributes)


def llm_call(operation: str, model: str) -> Outgoing:
    """The span of one call to the OpenAI-compatible LLM server (all its attempts; a stream until
    its last delta). Its carrier goes into the HTTP headers: vLLM started with
    ``--otlp-traces-endpoint`` makes its own spans children of it."""
    if _tracer is None:
        return NO_SPAN
    attributes = {"gen_ai.operation.name": operation, "gen_ai.request.model": model}
    return outgoing(f"llm.{operation}", CLIENT, attributes)


def nats_publish(subject: str) -> Outgoing:
    """The span of one NATS publish; its carrier goes into the message headers."""
    if _tracer is None:
        return NO_SPAN
    attributes = {"messaging.system": "nats", "messaging.destination.name": subject}
    return outgoing(f"nats.publish {subject.split('.', 1)[0]}", PRODUCER, attributes)


def mark_failed(span: Span, exc: BaseException) -> None:
    """Status ERROR with the gRPC code when the error has one (AioRpcError, DownstreamError);
    the description is the error's type, never its message."""
    code = getattr(exc, "code", None)
    code = code() if callable(code) else code
    if code is not None and hasattr(code, "value"):
        span.set_attribute("rpc.grpc.status_code", int(code.value[0]))
    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))


def _with_request_id(attributes: Mapping[str, str | int] | None) -> dict[str, str | int]:
    attrs: dict[str, str | int] = dict(attributes or {})
    rid = current_request_id()
    if rid:
        attrs[REQUEST_ID_ATTRIBUTE] = rid
    return attrs


# ------------------------------------------------------------------------- incoming spans


@dataclass
class Incoming:
    """A span started for work that arrived from another process (a gRPC call, a NATS message);
    ``token`` is set while it is the current span."""

    span: Span
    token: object | None = None


def extract(headers: Iterable[tuple[str, Any]] | Mapping[str, Any] | None) -> otel_context.Context:
    """The remote parent carried by gRPC metadata pairs or NATS headers (empty when none)."""
    items = headers.items() if isinstance(headers, Mapping) else headers or ()
    carrier: dict[str, str] = {}
    for key, value in items:
        if key in TRACE_HEADERS:
            carrier[key] = value if isinstance(value, str) else bytes(value).decode("ascii", "replace")
    return _PROPAGATOR.extract(carrier)


def start_server_span(service: str, method: str, metadata: Any) -> Incoming | None:
    """The span of one served RPC, child of the caller's span, made current until ``finish``."""
    if _tracer is None:
        return None
    parent = extract(metadata)
    attributes = _with_request_id({"rpc.system": "grpc", "rpc.service": service, "rpc.method": method})
    span = _tracer.start_span(f"{service}/{method}", context=parent, kind=SERVER, attributes=attributes)
    return Incoming(span, otel_context.attach(trace.set_span_in_context(span, parent)))


def start_consumer_span(subject: str, headers: Mapping[str, str] | None) -> Incoming | None:
    """The span of one consumed NATS message, child of its publisher's span (not made current:
    a batch holds several; ``attached`` makes it current for one message's work)."""
    if _tracer is None:
        return None
    span = _tracer.start_span(
        f"nats.consume {subject.split('.', 1)[0]}",
        context=extract(headers),
        kind=CONSUMER,
        attributes=_with_request_id({"messaging.system": "nats", "messaging.destination.name": subject}),
    )
    return Incoming(span)


def record_rpc_code(code: Any) -> None:
    """Put the status of the RPC being served on its span (a grpc.StatusCode)."""
    if _tracer is None:
        return
    span = trace.get_current_span()
    span.set_attribute("rpc.grpc.status_code", int(code.value[0]))
    if code.name != "OK":
        span.set_status(Status(StatusCode.ERROR, code.name))


def finish(incoming: Incoming | None, **attributes: str | int) -> None:
    if incoming is None:
        return
    for key, value in attributes.items():
        incoming.span.set_attribute(f"ragmesh.{key}", value)
    incoming.span.end()
    if incoming.token is not None:
        otel_context.detach(incoming.token)  # type: ignore[arg-type]
        incoming.token = None


class attached:
    """Make an incoming span current for the work of one message (a ``with`` in one task)."""

    __slots__ = ("incoming", "token")

    def __init__(self, incoming: Incoming | None) -> None:
        self.incoming = incoming
        self.token: object | None = None

    def __enter__(self) -> None:
        if self.incoming is not None:
            self.token = otel_context.attach(trace.set_span_in_context(self.incoming.span))

    def __exit__(self, *exc_info: object) -> None:
        if self.token is not None:
            otel_context.detach(self.token)  # type: ignore[arg-type]


class grouped:
    """A current span for work done for several messages at once (an ingest group): the child
    of the first message's span, linked to the others'."""

    __slots__ = ("members", "name", "span", "token")

    def __init__(self, name: str, members: Sequence[Incoming | None]) -> None:
        self.name = name
        self.members = [m for m in members if m is not None]
        self.span: Span | None = None
        self.token: object | None = None

    def __enter__(self) -> None:
        if _tracer is None or not self.members:
            return
        first, *rest = self.members
        self.span = _tracer.start_span(
            self.name,
            context=trace.set_span_in_context(first.span),
            kind=INTERNAL,
            links=[Link(m.span.get_span_context()) for m in rest],
            attributes={"ragmesh.messages": len(self.members)},
        )
        self.token = otel_context.attach(trace.set_span_in_context(self.span))

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.span is None:
            return
        if exc is not None:
            mark_failed(self.span, exc)
        self.span.end()
        otel_context.detach(self.token)  # type: ignore[arg-type]
