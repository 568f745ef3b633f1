"""Errors of the ragmesh client: every failed call raises a ``RagmeshError`` carrying the gRPC
status code, the server's message (written for callers), the request id the server logged it
under, and the degradations a response carried where the caller refused a degraded answer.

One subclass per status a caller handles differently; any other status raises the base class.
"""

from __future__ import annotations

from typing import Any

import grpc

from ragmesh_client.types import Degradation, IngestResult

REQUEST_ID_HEADER = "x-request-id"

# What a call failed in transport says instead of gRPC's own text (addresses, socket errors):
# the status already tells the caller what happened.
_TRANSPORT_MESSAGES = {
    grpc.StatusCode.UNAVAILABLE: "could not reach the service",
    grpc.StatusCode.DEADLINE_EXCEEDED: "no answer before the deadline",
}


class RagmeshError(Exception):
    """A call that did not succeed."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        request_id: str = "",
        degradations: tuple[Degradation, ...] = (),
    ) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.request_id = request_id
        self.degradations = degradations


class InvalidArgumentError(RagmeshError):
    """The request was refused as malformed (empty query, bad id, a limit exceeded)."""


class DocumentsRejectedError(InvalidArgumentError):
    """``ingest(..., on_rejected="raise" | "raise_if_none_accepted")`` found rejected documents.
    ``rejected`` holds each one with its reason; ``result`` the whole outcome (with
    ``on_rejected="raise"`` the accepted documents of the call were stored and queued)."""

    # Reasons quoted in the message; every one is in ``rejected``.
    SHOWN = 5

    def __init__(self, result: IngestResult, request_id: str = "") -> None:
        rejected = result.rejected
        reasons = "; ".join(f"{s.doc_id}: {s.reason}" for s in rejected[: self.SHOWN])
        more = f"; and {len(rejected) - self.SHOWN} more" if len(rejected) > self.SHOWN else ""
        super().__init__(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{len(rejected)} of {len(result)} documents rejected ({reasons}{more})",
            request_id=request_id,
        )
        self.result = result
        self.rejected = rejected


class NotFoundError(RagmeshError):
    """An unknown collection or document."""


class UnauthenticatedError(RagmeshError):
    """No API key, or one the server does not know."""


class PermissionDeniedError(RagmeshError):
    """The API key may not read or write that collection."""


class ResourceExhaustedError(RagmeshError):
    """Rate limited, or a request over a size limit (retried with backoff where safe)."""


class FailedPreconditionError(RagmeshError):
    """The system is not in a state to run the call (see the message)."""


class UnavailableError(RagmeshError):
    """The service (or every stage the call needed) could not be reached; also raised, with the
    degradations, when a caller refused a degraded answer (``allow_degraded=False``)."""


class DeadlineExceededError(RagmeshError):
    """No answer within the call's deadline."""


_BY_CODE: dict[grpc.StatusCode, type[RagmeshError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
}


def error_for(
    code: grpc.StatusCode, message: str, request_id: str = "", degradations: tuple[Degradation, ...] = ()
) -> RagmeshError:
    cls = _BY_CODE.get(code, RagmeshError)
    return cls(code, message, request_id=request_id, degradations=degradations)


def _request_id_of(trailers: Any) -> str:
    for key, value in trailers or ():
        if key == REQUEST_ID_HEADER:
            return value if isinstance(value, str) else value.decode("ascii", "replace")
    return ""


def from_rpc_error(exc: grpc.RpcError, sent_request_id: str = "") -> RagmeshError:
    """The exception for a failed gRPC call. A status that a server handler produced carries its
    request id in the trailers; one gRPC produced on the way (no connection, the deadline)
    has none, and its text is replaced by what happened."""
    code: grpc.StatusCode = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details: str = (exc.details() if hasattr(exc, "details") else "") or ""
    trailers = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else ()
    request_id = _request_id_of(trailers)
    if not request_id and code in _TRANSPORT_MESSAGES:
        details = _TRANSPORT_MESSAGES[code]
    return error_for(code, details, request_id or sent_request_id)


def degraded_error(degradations: tuple[Degradation, ...], request_id: str) -> UnavailableError:
    stages = ", ".join(f"{d.stage}: {d.reason}" for d in degradations)
    return UnavailableError(
        grpc.StatusCode.UNAVAILABLE,
        f"the answer is degraded ({stages})",
        request_id=request_id,
        degradations=degradations,
    )
