"""A ``Call``: what one RPC of a client method sends (the service, the stub method, the request
and its deadline) and how its reply is read; and ``CallBuilder``, the configuration both clients
share (addresses, key, TLS, deadlines, retries) with the helpers the methods build calls with.
The methods themselves are in ``_operations.py``; the sync and asyncio clients only differ in
how they run a ``Call``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import grpc
from google.protobuf.message import Message

from ragmesh_client._pb.gateway.v1 import gateway_pb2_grpc
from ragmesh_client._pb.ingestion.v1 import ingestion_pb2_grpc
from ragmesh_client.config import TLS, ClientConfig, RetryPolicy, Timeouts, grpc_target
from ragmesh_client.errors import degraded_error

T = TypeVar("T")
GATEWAY, INGESTION = "gateway", "ingestion"
# What ingest does with rejected documents: return them in the result (report), raise
# DocumentsRejectedError when any was rejected (raise) or when none was accepted.
OnRejected = Literal["report", "raise", "raise_if_none_accepted"]
ON_REJECTED: tuple[OnRejected, ...] = ("report", "raise", "raise_if_none_accepted")
# The most documents one ListDocuments page may ask for (the API's own limit).
MAX_PAGE = 10_000


@dataclass(frozen=True)
class Call(Generic[T]):
    service: str  # GATEWAY or INGESTION
    method: str
    request: Any
    timeout: float
    read: Callable[[Any, str], T]


def checked(allow_degraded: bool, read: Callable[[Any, str], T]) -> Callable[[Any, str], T]:
    """``read``, raising UnavailableError (with them) when the reply carries degradations and the
    caller refused a degraded result."""

    def checked(reply: Any, request_id: str) -> T:
        result = read(reply, request_id)
        found = getattr(result, "degradations", ())
        if found and not allow_degraded:
            raise degraded_error(found, request_id)
        return result

    return checked


M = TypeVar("M", bound=Message)


def contract(message: Message, kind: type[M], options: Mapping[str, Any]) -> M:
    """A request given as a contract message (``request=``), checked to be the one expected."""
    if options:
        raise ValueError(f"give either request= or options, not both ({', '.join(sorted(options))})")
    expected = kind.DESCRIPTOR.full_name
    if message.DESCRIPTOR.full_name != expected:
        raise TypeError(f"request must be a {expected}, not a {message.DESCRIPTOR.full_name}")
    return message  # type: ignore[return-value]


def _stub_types() -> dict[str, Any]:
    return {
        GATEWAY: gateway_pb2_grpc.GatewayServiceStub,
        INGESTION: ingestion_pb2_grpc.IngestionServiceStub,
    }


class CallBuilder:
    """The configuration both clients share, and what their methods build calls with."""

    def __init__(
        self,
        gateway: str | None = None,
        *,
        ingestion: str | None = None,
        api_key: str | None = None,
        tls: TLS | None = None,
        timeouts: Timeouts | None = None,
        retry: RetryPolicy | None = None,
        config: ClientConfig | None = None,
    ) -> None:
        base = config or ClientConfig()
        self.config = ClientConfig(
            gateway=gateway or base.gateway,
            ingestion=ingestion or base.ingestion,
            api_key=api_key if api_key is not None else base.api_key,
            tls=tls if tls is not None else base.tls,
            timeouts=timeouts or base.timeouts,
            retry=retry or base.retry,
        )
        self._targets = {
            GATEWAY: grpc_target(self.config.gateway),
            INGESTION: grpc_target(self.config.ingestion),
        }

    def _target(self, service: str) -> str:
        return self._targets[service]

    def _stub(self, service: str, channel: Any) -> Any:
        return _stub_types()[service](channel)

    def _credentials(self) -> grpc.ChannelCredentials | None:
        return None if self.config.tls is None else self.config.tls.credentials()

    @staticmethod
    def _timeout(given: float | None, default: float) -> float:
        timeout = default if given is None else given
        if not timeout > 0:
            raise ValueError("timeout must be > 0 seconds")
        return timeout
