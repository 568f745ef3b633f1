"""``python -m services.ingestion``: the ingestion API (workers run as
``python -m services.ingestion.worker``)."""

from __future__ import annotations

from meshkit.rpc.server import ServiceSpec, run_service
from meshkit.settings import IngestionSettings
from ragmesh.ingestion.v1 import ingestion_pb2, ingestion_pb2_grpc
from services.ingestion.servicer import ACCESS, IngestionServicer


def main() -> None:
    settings = IngestionSettings()
    servicer = IngestionServicer(settings)
    spec = ServiceSpec(
        name="ingestion",
        grpc_services=[ingestion_pb2.DESCRIPTOR.services_by_name["IngestionService"].full_name],
        register=lambda server: ingestion_pb2_grpc.add_IngestionServiceServicer_to_server(servicer, server),
        on_start=[servicer.start],
        on_stop=[servicer.stop],
        access=ACCESS,
        # Documents of up to ingest_max_document_bytes, several per call: the mesh-wide limit bounds it.
        max_request_bytes=settings.max_message_bytes,
        max_concurrent_rpcs=256,
    )
    run_service(spec, settings)


if __name__ == "__main__":
    main()
