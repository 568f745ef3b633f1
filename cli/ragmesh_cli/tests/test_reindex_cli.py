"""``ragmesh reindex``'s driver against a scripted ingestion API: it starts the reindex once,
then only advances it, prints one line per change of progress, says what to do about failed
documents, and retries a step the API could not answer."""

from __future__ import annotations

import io
from typing import Any

import grpc
from grpc import aio

from ragmesh.ingestion.v1 import ingestion_pb2, ingestion_pb2_grpc
from ragmesh_cli.reindex import reindex

BUILDING = ingestion_pb2.REINDEX_PHASE_BUILDING
DONE = ingestion_pb2.REINDEX_PHASE_DONE


def reply(phase: int, **fields: Any) -> ingestion_pb2.ReindexCollectionResponse:
    return ingestion_pb2.ReindexCollectionResponse(collection="docs", phase=phase, **fields)


class ScriptedApi(ingestion_pb2_grpc.IngestionServiceServicer):
    def __init__(self, script: list[ingestion_pb2.ReindexCollectionResponse | None]) -> None:
        self.script = script
        self.starts: list[bool] = []

    async def ReindexCollection(self, request: Any, context: aio.ServicerContext) -> Any:
        self.starts.append(request.start)
        step = self.script.pop(0)
        if step is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "restarting")
        return step


async def test_the_driver_starts_once_reports_changes_and_ends_when_done() -> None:
    building = {"serving_generation": 1, "other_generation": 2, "documents": 30, "building_model": "m2"}
    api = ScriptedApi(
        [
            reply(BUILDING, indexed=0, pending=30, **building),
            None,  # the API restarts: the step is retried
            reply(BUILDING, indexed=0, pending=30, **building),
            reply(BUILDING, indexed=29, pending=0, failed=1, **building),
            reply(DONE, serving_generation=2, serving_model="m2"),
        ]
    )
    server = aio.server()
    ingestion_pb2_grpc.add_IngestionServiceServicer_to_server(api, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    out = io.StringIO()
    try:
        code = await reindex(f"127.0.0.1:{port}", "docs", interval_s=0.01, timeout_s=30, out=out)
    finally:
        await server.stop(None)
    lines = out.getvalue().splitlines()
    assert code == 0
    assert api.starts == [True, False, False, False, False]
    assert "building generation 2 with m2: 0/30 indexed, 30 waiting, 0 failed" in lines[0]
    assert "29/30 indexed" in lines[1]  # the unchanged repeat printed nothing
    assert "ragmesh dlq list --collection docs__g2" in lines[2]
    assert lines[3].endswith("done: generation 2 (m2) serves")
    assert len(lines) == 4
