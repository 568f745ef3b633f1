"""``python -m services.ingestion.bootstrap``: create what the mesh keeps in NATS JetStream and
the object store, then exit: the ingest work-queue stream, its durable consumer, the dead-letter
stream, the ingestion state KV buckets, and the documents, snapshots and models buckets.

Idempotent (what exists is left as it is), so the Kubernetes Job ``ragmesh-bootstrap`` runs it
on every deploy; the services declare the same on start. Exits non-zero on failure (NATS or S3
unreachable), which the Job retries."""

from __future__ import annotations

import asyncio
import logging

import nats

from meshkit.core.logs import configure_logging
from meshkit.domain.collections import open_collections_bucket
from meshkit.settings import IngestionSettings
from meshkit.storage.natsconn import connect_options
from meshkit.storage.objectstore import ObjectStore
from services.ingestion.lifecycle.buckets import open_buckets
from services.ingestion.topology import ensure_topology

log = logging.getLogger("ragmesh.bootstrap")
CONNECT_TIMEOUT_S = 10.0


async def bootstrap(settings: IngestionSettings) -> None:
    nc = await nats.connect(
        **connect_options(settings),
        name="ragmesh-bootstrap",
        connect_timeout=CONNECT_TIMEOUT_S,
        allow_reconnect=False,
    )
    try:
        js = nc.jetstream()
        await ensure_topology(js, settings)
        await open_buckets(js, settings.nats_stream_replicas)
        await open_collections_bucket(js, settings.nats_stream_replicas)
    finally:
        await nc.drain()
    log.info("jetstream ready", extra={"stream": settings.ingest_stream, "dlq": settings.ingest_dlq_stream})
    store = ObjectStore.from_settings(settings)
    buckets = [settings.documents_bucket, settings.snapshots_bucket, settings.models_bucket]
    for bucket in buckets:
        await store.ensure_bucket(bucket)
    log.info("object store ready", extra={"buckets": buckets})


def main() -> None:
    settings = IngestionSettings()
    configure_logging("bootstrap", settings.log_level, settings.log_format)
    asyncio.run(bootstrap(settings))


if __name__ == "__main__":
    main()
