"""A real local mesh for the integration tests: one stack per test session, started with the
same supervisor as ``ragmesh up`` and always stopped at the end (also when tests fail).

Services whose code does not exist yet are left out. ``RAGMESH_IT_SERVICES`` (comma
separated, '' for none) limits the services started, e.g. to debug the supervisor itself.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import pytest
from grpc import aio

from ragmesh.gateway.v1 import gateway_pb2_grpc
from ragmesh_cli.stack import ALL_SERVICES, Stack, available_services

from .meshclients import SERVICES_WITHOUT_LLM


def _wanted_services() -> list[str]:
    found = available_services()
    limit = os.environ.get("RAGMESH_IT_SERVICES")
    if limit is None:
        return found
    wanted = {s.strip() for s in limit.split(",") if s.strip()}
    unknown = wanted - set(ALL_SERVICES)
    if unknown:
        raise pytest.UsageError(f"RAGMESH_IT_SERVICES names unknown services {sorted(unknown)}")
    return [s for s in found if s in wanted]


# Failure paths must play out in seconds, not the production minutes: short redelivery and
# lease times, quick retries and breakers, and a small document limit to test it cheaply.
# The lifecycle's own tests run with production timings (test_lifecycle.py and
# services/ingestion/tests).
TEST_ENV = {
    "RAGMESH_INGEST_ACK_WAIT_S": "4",
    "RAGMESH_INGEST_LEASE_S": "4",
    "RAGMESH_INGEST_BATCH_TIMEOUT_S": "60",
    "RAGMESH_INGEST_MAX_DELIVER": "4",
    "RAGMESH_INGEST_RETRY_BACKOFF_S": "0.3,0.6,1",
    # Infrastructure outages (S3, the embedder down) wait this long before dead-lettering
    # (production: 10 min), retried at most 2 s apart.
    "RAGMESH_INGEST_TRANSIENT_RETRY_WINDOW_S": "15",
    "RAGMESH_INGEST_TRANSIENT_BACKOFF_MAX_S": "2",
    "RAGMESH_INGEST_MAX_DOCUMENT_BYTES": "1000000",
    "RAGMESH_BREAKER_RESET_S": "1",
    "RAGMESH_LLM_BREAKER_RESET_S": "1",
    "RAGMESH_CLIENT_TIMEOUT_S": "5",
    "RAGMESH_LOG_LEVEL": "INFO",
}


REPLICAS = {"embedder": 2, "planner": 2, "reranker": 2}


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The running mesh (NATS, S3 and every available service, one ingestion worker)."""
    services = _wanted_services()
    with Stack(
        tmp_path_factory.mktemp("stack"),
        workers=1,
        services=services,
        extra_env=TEST_ENV,
        # Two replicas of the search stages, balanced by the gateway's client, for the replica
        # fault tests; tests that stop a stage stop every replica of it.
        replicas={kind: n for kind, n in REPLICAS.items() if kind in services},
    ) as running:
        yield running


@pytest.fixture(scope="session")
def stack_addresses(stack: Stack) -> dict[str, str]:
    """Component name -> 127.0.0.1:port (nats client port, S3 API port, gRPC ports)."""
    return {name: stack.address(name) for name in stack.names()}


@pytest.fixture(scope="session")
def stack_env(stack: Stack) -> dict[str, str]:
    """The RAGMESH_* settings a client of the mesh needs (addresses, S3 credentials)."""
    return stack.client_env()


@pytest.fixture
async def gateway(stack: Stack) -> AsyncIterator[gateway_pb2_grpc.GatewayServiceStub]:
    """A channel to the stack's gateway that reconnects quickly after the gateway restarts."""
    channel = aio.insecure_channel(
        stack.address("gateway"),
        options=[("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 1000)],
    )
    yield gateway_pb2_grpc.GatewayServiceStub(channel)
    await channel.close()


# Collections the tenant of ``auth_stack`` may read and write.
AUTH_TENANT = "tenant-docs"
AUTH_COLLECTIONS = ["docs"]


@pytest.fixture(scope="session")
def auth_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The stack as ``ragmesh up --secure`` runs it, production timings: API keys on the gateway
    and the ingestion API (tenant ``AUTH_TENANT`` holds ``AUTH_COLLECTIONS``), TLS everywhere,
    two ingestion workers and two index shards. For the tests of the public clients (the Python
    client, the MCP server)."""
    stack = Stack(
        tmp_path_factory.mktemp("auth-stack"),
        workers=2,
        index_shards=2,
        services=[s for s in SERVICES_WITHOUT_LLM if s in available_services()],
        secure=True,
        api_keys={AUTH_TENANT: (AUTH_COLLECTIONS, AUTH_COLLECTIONS)},
    )
    try:
        stack.up()
        yield stack
    finally:
        stack.down()
