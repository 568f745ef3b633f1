"""A collection's calibration in its record (meshkit.domain.calibration, meshkit.domain.collections)."""

from __future__ import annotations

from dataclasses import replace

from meshkit.domain.calibration import Calibration
from meshkit.domain.collections import CollectionRecord, EmbedderIdentity

EMBEDDER = EmbedderIdentity("m", 4, "a" * 64)
CALIBRATION = Calibration(
    rerank=True,
    weights={"dense": 1.0, "bm25": 0.5, "exact": 0.4},
    keep_fused_margin=None,
    queries=200,
    documents=200,
    measured={"fused": 0.7, "reranked": 0.75},
    rerank_gain=0.05,
    rerank_gain_low=0.02,
    rerank_gain_high=0.08,
    method="pseudo-queries/v1",
    calibrated_at=1.5e9,
    embedder_sha256=EMBEDDER.sha256,
)


def test_a_record_round_trips_with_its_calibration() -> None:
    record = CollectionRecord(collection="c", embedder=EMBEDDER, calibration=CALIBRATION)
    assert CollectionRecord.from_bytes(record.to_bytes()) == record
    margin = replace(record, calibration=replace(CALIBRATION, keep_fused_margin=2.0))
    assert CollectionRecord.from_bytes(margin.to_bytes()) == margin


def test_a_record_written_before_calibrations_reads_without_one() -> None:
    old = (
        b'{"collection":"c","generation":2,"embedder":{"model":"m","dimension":4,"sha256":"'
        + b"a" * 64
        + b'"}}'
    )
    record = CollectionRecord.from_bytes(old)
    assert record.calibration is None and record.calibration_in_force() is None


def test_a_calibration_is_in_force_only_for_the_embedder_it_was_measured_with() -> None:
    record = CollectionRecord(collection="c", embedder=EMBEDDER, calibration=CALIBRATION)
    assert record.calibration_in_force() == CALIBRATION
    # After a reindex with another model the serving generation's vectors are another model's.
    other = replace(record, embedder=EmbedderIdentity("n", 4, "b" * 64))
    assert other.calibration_in_force() is None
    assert replace(record, embedder=None).calibration_in_force() is None
    unknown = replace(record, calibration=replace(CALIBRATION, embedder_sha256=""))
    assert unknown.calibration_in_force() is None
