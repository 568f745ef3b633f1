"""The lifecycle's entries as the ingestion API's messages: states as ``DocumentState``
values, a ``DocStatus`` as a ``DocumentStatus``, and times as protobuf timestamps.
"""

from __future__ import annotations

from google.protobuf.timestamp_pb2 import Timestamp

from meshkit.domain.collections import split_physical
from ragmesh.ingestion.v1 import ingestion_pb2
from services.ingestion.lifecycle.entries import DocStatus
from services.ingestion.lifecycle.machine import DELETED, DELETING, FAILED, INDEXED, PROCESSING, QUEUED

STATE_TO_PROTO: dict[str, ingestion_pb2.DocumentState] = {
    QUEUED: ingestion_pb2.DOCUMENT_STATE_QUEUED,
    PROCESSING: ingestion_pb2.DOCUMENT_STATE_PROCESSING,
    INDEXED: ingestion_pb2.DOCUMENT_STATE_INDEXED,
    FAILED: ingestion_pb2.DOCUMENT_STATE_FAILED,
    DELETING: ingestion_pb2.DOCUMENT_STATE_DELETING,
    DELETED: ingestion_pb2.DOCUMENT_STATE_DELETED,
}


def timestamp(seconds: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def status_message(status: DocStatus) -> ingestion_pb2.DocumentStatus:
    return ingestion_pb2.DocumentStatus(
        collection=split_physical(status.collection)[0],
        doc_id=status.doc_id,
        state=STATE_TO_PROTO.get(status.state, ingestion_pb2.DOCUMENT_STATE_UNSPECIFIED),
        reason=status.reason,
        attempts=status.attempts,
        chunks=status.chunks,
        content_sha256=status.indexed_sha256 or status.target_sha256,
        updated_at=timestamp(status.updated_at),
    )
