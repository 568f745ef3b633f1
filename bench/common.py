"""What the benchmarks share: corpus subsets, ingesting through the CLI as an operator would,
and reading a collection's counts."""

from __future__ import annotations

import gzip
import subprocess
import sys
import time
from pathlib import Path

from grpc import aio

from ragmesh.ingestion.v1 import ingestion_pb2, ingestion_pb2_grpc


def corpus_file(dataset: Path, limit: int, scratch: Path) -> Path:
    """The dataset's corpus, or its first ``limit`` documents written to a scratch file."""
    source = dataset / "corpus.jsonl.gz"
    source = source if source.exists() else dataset / "corpus.jsonl"
    if not limit:
        return source
    opener = gzip.open if source.suffix == ".gz" else open
    target = scratch / "corpus.jsonl"
    with opener(source, "rt", encoding="utf-8") as src, target.open("w", encoding="utf-8") as dst:
        for i, line in enumerate(src):
            if i >= limit:
                break
            dst.write(line)
    return target


def cli_ingest(state_dir: Path, corpus: Path, collection: str, timeout: float) -> float:
    """``ragmesh ingest --wait`` exactly as an operator runs it; returns wall seconds."""
    ragmesh = str(Path(sys.executable).parent / "ragmesh")
    command = [ragmesh, "--state-dir", str(state_dir), "ingest", str(corpus), "--collection", collection]
    started = time.perf_counter()
    subprocess.run([*command, "--wait", "--timeout", str(timeout)], check=True)
    return time.perf_counter() - started


async def collection_counts(address: str, collection: str) -> ingestion_pb2.GetCollectionStatusResponse:
    async with aio.insecure_channel(address) as channel:
        stub = ingestion_pb2_grpc.IngestionServiceStub(channel)
        request = ingestion_pb2.GetCollectionStatusRequest(collection=collection)
        return await stub.GetCollectionStatus(request, timeout=10)
