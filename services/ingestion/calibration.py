"""The ingestion API's calls on collection calibrations (meshkit.domain.calibration): recording
the one ``ragmesh calibrate`` measured (SetCollectionCalibration) and reporting it with the
collection's status. The API owns collection records; the calibration is written into the
record by compare-and-set, stamped with the embedder of the generation it was measured on."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import replace

import grpc

from meshkit.core.errors import ServiceError, failed_precondition, invalid_argument, unavailable
from meshkit.core.logs import current_request_id
from meshkit.domain.calibration import LEG_NAMES, Calibration
from meshkit.domain.collections import CollectionRecord, CollectionRegistry, split_physical
from ragmesh.ingestion.v1 import ingestion_pb2
from services.ingestion.status_messages import timestamp

log = logging.getLogger("ingestion.api")

MAX_MEASURED = 16
MAX_NAME_CHARS = 64
# Log-odds: the gateway's own bound on a keep-fused margin.
MAX_KEEP_FUSED_MARGIN = 100.0


def _finite(value: float, what: str, low: float, high: float) -> float:
    if not (math.isfinite(value) and low <= value <= high):
        raise invalid_argument(f"calibration.{what} must be in [{low}, {high}], got {value}")
    return float(value)


def calibration_from_message(message: ingestion_pb2.CollectionCalibration, embedder: str) -> Calibration:
    """The calibration a request carries, every value bounded (INVALID_ARGUMENT otherwise)."""
    weights = {
        leg: _finite(getattr(message, f"weight_{leg}"), f"weight_{leg}", 0.0, 1e3) for leg in LEG_NAMES
    }
    if len(message.measured) > MAX_MEASURED:
        raise invalid_argument(
            f"calibration.measured has {len(message.measured)} systems, at most {MAX_MEASURED}"
        )
    measured = {}
    for name, value in message.measured.items():
        if not 0 < len(name) <= MAX_NAME_CHARS:
            raise invalid_argument(
                f"calibration.measured: a system name must be 1..{MAX_NAME_CHARS} characters"
            )
        measured[name] = _finite(value, f"measured[{name!r}]", 0.0, 1.0)
    if len(message.method) > MAX_NAME_CHARS:
        raise invalid_argument(f"calibration.method is longer than {MAX_NAME_CHARS} characters")
    margin = message.keep_fused_margin if message.HasField("keep_fused_margin") else None
    return Calibration(
        rerank=message.rerank,
        weights=weights,
        keep_fused_margin=None
        if margin is None
        else _finite(margin, "keep_fused_margin", 0.0, MAX_KEEP_FUSED_MARGIN),
        queries=message.queries,
        documents=message.documents,
        measured=measured,
        rerank_gain=_finite(message.rerank_gain, "rerank_gain", -1.0, 1.0),
        rerank_gain_low=_finite(message.rerank_gain_low, "rerank_gain_low", -1.0, 1.0),
        rerank_gain_high=_finite(message.rerank_gain_high, "rerank_gain_high", -1.0, 1.0),
        method=message.method,
        calibrated_at=time.time(),
        embedder_sha256=embedder,
    )


def calibration_message(calibration: Calibration) -> ingestion_pb2.CollectionCalibration:
    message = ingestion_pb2.CollectionCalibration(
        rerank=calibration.rerank,
        weight_dense=calibration.weights["dense"],
        weight_bm25=calibration.weights["bm25"],
        weight_exact=calibration.weights["exact"],
        queries=calibration.queries,
        documents=calibration.documents,
        measured=calibration.measured,
        rerank_gain=calibration.rerank_gain,
        rerank_gain_low=calibration.rerank_gain_low,
        rerank_gain_high=calibration.rerank_gain_high,
        method=calibration.method,
        calibrated_at=timestamp(calibration.calibrated_at),
        embedder_sha256=calibration.embedder_sha256,
    )
    if calibration.keep_fused_margin is not None:
        message.keep_fused_margin = calibration.keep_fused_margin
    return message


class CalibrationCalls:
    """The calibration calls of the ingestion API (mixed into IngestionServicer)."""

    collections: CollectionRegistry | None

    async def _generations(self, name: str) -> list[str]:
        raise NotImplementedError

    async def SetCollectionCalibration(
        self, request: ingestion_pb2.SetCollectionCalibrationRequest, context: grpc.aio.ServicerContext
    ) -> ingestion_pb2.SetCollectionCalibrationResponse:
        assert self.collections is not None
        logical = split_physical((await self._generations(request.collection))[0])[0]
        if request.clear == request.HasField("calibration"):
            raise invalid_argument("give either a calibration or clear")
        # Checked before any write; stamped below with the embedder the record holds when written.
        checked = None if request.clear else calibration_from_message(request.calibration, "")

        def change(current: CollectionRecord | None) -> CollectionRecord:
            if current is None or current.embedder is None:
                raise failed_precondition(
                    f"collection {request.collection!r} has no indexed document yet: nothing to calibrate"
                )
            stamped = None if checked is None else replace(checked, embedder_sha256=current.embedder.sha256)
            return replace(current, calibration=stamped, updated_at=time.time())

        try:
            record = await self.collections.update(logical, change)
        except ServiceError:
            raise
        except Exception as exc:
            log.warning("calibration not recorded", extra={"collection": logical, "error": repr(exc)})
            raise unavailable(
                f"could not record the calibration of {logical!r}: the state store (NATS) is unavailable; "
                f"retry the call (request id {current_request_id()})"
            ) from exc
        calibration = record.calibration
        reply = ingestion_pb2.SetCollectionCalibrationResponse()
        if calibration is not None:
            reply.calibration.CopyFrom(calibration_message(calibration))
        return reply

    async def recorded_calibration(self, collection: str) -> ingestion_pb2.CollectionCalibration | None:
        """The calibration recorded for ``collection`` (for its status), or None. The counts are
        answered without it when the record cannot be read."""
        assert self.collections is not None
        try:
            record, _ = await self.collections.get(split_physical(collection)[0])
        except Exception as exc:
            log.warning("collection record unreadable", extra={"collection": collection, "error": repr(exc)})
            return None
        if record is None or record.calibration is None:
            return None
        return calibration_message(record.calibration)
