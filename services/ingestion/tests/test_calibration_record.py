"""Recording a collection's calibration through the ingestion API (services/ingestion/calibration.py):
the real API and a worker on a real nats-server, fake stores and embedder (conftest)."""

from __future__ import annotations

import math

import pytest

from meshkit.core.errors import ServiceError
from ragmesh.ingestion.v1 import ingestion_pb2

from .conftest import Harness
from .test_embedder_record import INDEXED, doc, record_of


def calibration(**changes: object) -> ingestion_pb2.CollectionCalibration:
    values: dict[str, object] = {
        "rerank": False,
        "weight_dense": 1.0,
        "weight_bm25": 0.5,
        "weight_exact": 0.0,
        "queries": 120,
        "documents": 120,
        "measured": {"fused": 0.61, "reranked": 0.58},
        "rerank_gain": -0.03,
        "rerank_gain_low": -0.05,
        "rerank_gain_high": -0.01,
        "method": "pseudo-queries/v1",
        **changes,
    }
    return ingestion_pb2.CollectionCalibration(**values)  # type: ignore[arg-type]


async def set_calibration(
    harness: Harness, collection: str, **fields: object
) -> ingestion_pb2.CollectionCalibration:
    request = ingestion_pb2.SetCollectionCalibrationRequest(collection=collection, **fields)  # type: ignore[arg-type]
    return (await harness.api.SetCollectionCalibration(request, None)).calibration


async def collection_status(harness: Harness, collection: str) -> ingestion_pb2.GetCollectionStatusResponse:
    request = ingestion_pb2.GetCollectionStatusRequest(collection=collection)
    return await harness.api.GetCollectionStatus(request, None)


async def test_a_calibration_is_recorded_with_the_embedder_shown_in_status_and_cleared(
    harness: Harness,
) -> None:
    await harness.start_api()
    await harness.start_worker()
    await harness.submit("c", "a.md", doc("alpha"))
    await harness.wait_state("c", "a.md", INDEXED)

    recorded = await set_calibration(harness, "c", calibration=calibration(keep_fused_margin=2.5))
    assert recorded.embedder_sha256 == "a" * 64  # the embedder of the generation measured
    assert recorded.calibrated_at.seconds > 0
    record = await record_of(harness, "c")
    assert record.calibration is not None and record.calibration_in_force() == record.calibration
    assert record.calibration.weights == {"dense": 1.0, "bm25": 0.5, "exact": 0.0}
    assert record.calibration.keep_fused_margin == 2.5 and record.calibration.rerank is False
    assert record.embedder is not None and record.generation == 1  # the rest of the record kept

    shown = (await collection_status(harness, "c")).calibration
    assert shown.method == "pseudo-queries/v1" and math.isclose(shown.measured["fused"], 0.61, rel_tol=1e-6)
    assert shown.HasField("keep_fused_margin")

    assert not (await set_calibration(harness, "c", clear=True)).method
    assert (await record_of(harness, "c")).calibration is None
    assert not (await collection_status(harness, "c")).HasField("calibration")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"weight_dense": math.nan}, "weight_dense"),
        ({"weight_bm25": -1.0}, "weight_bm25"),
        ({"keep_fused_margin": 101.0}, "keep_fused_margin"),
        ({"measured": {"fused": 1.5}}, "measured"),
        ({"measured": {f"s{i}": 0.5 for i in range(17)}}, "at most 16"),
        ({"method": "m" * 65}, "method"),
    ],
)
async def test_a_bad_calibration_is_refused_and_nothing_is_recorded(
    harness: Harness, fields: dict[str, object], message: str
) -> None:
    await harness.start_api()
    await harness.start_worker()
    await harness.submit("c", "a.md", doc("alpha"))
    await harness.wait_state("c", "a.md", INDEXED)
    with pytest.raises(ServiceError) as refused:
        await set_calibration(harness, "c", calibration=calibration(**fields))
    assert refused.value.code.name == "INVALID_ARGUMENT" and message in refused.value.message
    assert (await record_of(harness, "c")).calibration is None


async def test_a_collection_without_an_indexed_document_cannot_be_calibrated(harness: Harness) -> None:
    await harness.start_api()
    with pytest.raises(ServiceError) as refused:
        await set_calibration(harness, "empty", calibration=calibration())
    assert refused.value.code.name == "FAILED_PRECONDITION"
    with pytest.raises(ServiceError) as neither:
        await set_calibration(harness, "empty")
    assert neither.value.code.name == "INVALID_ARGUMENT"
