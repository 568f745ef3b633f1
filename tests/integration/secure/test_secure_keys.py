"""Key management on a running secure stack, end to end: ``ragmesh keys add`` and ``revoke``
change what the ingestion API accepts without a restart (within the reload interval), and
``ragmesh up`` after ``down`` keeps the keys that were added.

The stack is this module's own and as small as a secure stack gets (the ingestion API, with NATS
and S3), not the folder's package-scoped one, so it costs a few seconds beyond its start."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from grpc import aio

from meshkit.rpc.tls import ClientTLS, open_channel
from ragmesh.ingestion.v1 import ingestion_pb2 as ing
from ragmesh.ingestion.v1 import ingestion_pb2_grpc
from ragmesh_cli.main import main
from ragmesh_cli.stack import Stack

pytestmark = pytest.mark.integration

GAMMA, DELTA = "gamma", "delta"
RELOAD_S = 0.5


@pytest.fixture(scope="module")
def keys_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = Stack(
        tmp_path_factory.mktemp("secure-keys"),
        services=["ingestion"],
        workers=0,
        secure=True,
        extra_env={"RAGMESH_API_KEYS_RELOAD_S": str(RELOAD_S)},
    )
    try:
        stack.up()
        yield stack
    finally:
        stack.down()


def cli(capsys: pytest.CaptureFixture[str], stack: Stack, *args: str) -> str:
    """Run ``ragmesh keys ...`` on the stack's state dir; its stdout."""
    code = main(["keys", *args, "--state-dir", str(stack.state_dir)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def add_key(capsys: pytest.CaptureFixture[str], stack: Stack, name: str, collection: str) -> str:
    added: dict[str, Any] = json.loads(
        cli(capsys, stack, "add", "--name", name, "--collection", collection, "--json")
    )
    key: str = added["api_key"]
    return key


class Ingestion:
    """The ingestion API as a tenant reaches it: TLS verified with the stack's CA, no certificate."""

    def __init__(self, stack: Stack) -> None:
        tls = ClientTLS(stack.client_tls().ca_file, server_name="localhost")
        self.channel = open_channel(stack.address("ingestion"), tls=tls)
        self.stub = ingestion_pb2_grpc.IngestionServiceStub(self.channel)

    async def status(self, key: str, collection: str) -> grpc.StatusCode:
        """The code GetCollectionStatus gets with ``key`` (NOT_FOUND: let in, no documents yet)."""
        try:
            await self.stub.GetCollectionStatus(
                ing.GetCollectionStatusRequest(collection=collection),
                metadata=[("x-api-key", key)],
                timeout=10,
            )
        except aio.AioRpcError as exc:
            return exc.code()
        return grpc.StatusCode.OK

    async def ingest(self, key: str, collection: str, doc_id: str) -> None:
        document = ing.Document(doc_id=doc_id, format=ing.DOCUMENT_FORMAT_TEXT, content=b"gamma notes")
        reply = await self.stub.IngestDocuments(
            ing.IngestDocumentsRequest(collection=collection, documents=[document]),
            metadata=[("x-api-key", key)],
            timeout=10,
        )
        assert [r.outcome for r in reply.results] == [ing.SUBMIT_OUTCOME_QUEUED], reply

    async def wait_for(self, key: str, collection: str, want: grpc.StatusCode, within: float) -> float:
        """Seconds until GetCollectionStatus gets ``want``; fails after ``within``."""
        started = time.monotonic()
        while (code := await self.status(key, collection)) != want:
            assert time.monotonic() - started < within, (
                f"still {code.name} after {within}s, wanted {want.name}"
            )
            await asyncio.sleep(0.05)
        return time.monotonic() - started

    async def close(self) -> None:
        await self.channel.close()


# A reload within its interval, plus a poll and the round trips of a loaded CI machine.
WITHIN = RELOAD_S + 2.0


async def test_keys_are_added_and_revoked_without_a_restart_and_survive_one(
    keys_stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    api = Ingestion(keys_stack)
    try:
        key = add_key(capsys, keys_stack, "gamma-app", GAMMA)
        await api.wait_for(key, GAMMA, grpc.StatusCode.NOT_FOUND, WITHIN)  # let in: the collection is empty
        await api.ingest(key, GAMMA, "notes.txt")  # read and write on gamma by default
        await api.wait_for(key, GAMMA, grpc.StatusCode.OK, WITHIN)  # its status counts the document
        assert await api.status(key, DELTA) == grpc.StatusCode.PERMISSION_DENIED
        listing = cli(capsys, keys_stack, "list")
        assert "gamma-app" in listing and key not in listing

        assert "revoked" in cli(capsys, keys_stack, "revoke", "--name", "gamma-app")
        await api.wait_for(key, GAMMA, grpc.StatusCode.UNAUTHENTICATED, WITHIN)

        other = add_key(capsys, keys_stack, "gamma-next", GAMMA)
        await api.wait_for(other, GAMMA, grpc.StatusCode.OK, WITHIN)
    finally:
        await api.close()

    keys_stack.down()
    # ragmesh up: prepares the secure material again, and keeps the keys file's entries.
    await keys_stack.up_async()
    api = Ingestion(keys_stack)  # new ports after a restart
    try:
        assert await api.status(other, GAMMA) == grpc.StatusCode.OK
        assert await api.status(key, GAMMA) == grpc.StatusCode.UNAUTHENTICATED  # not revived
    finally:
        await api.close()
    keys_file = (keys_stack.state_dir / "secure" / "api-keys.json").read_text()
    assert '"gamma-next"' in keys_file and '"gamma-app"' not in keys_file
