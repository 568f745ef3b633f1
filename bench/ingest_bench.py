"""Ingestion throughput of the whole pipeline against the embedder's raw in-process batch
throughput on the same chunks, and the time to re-ingest the unchanged corpus.

    make bench            # or: .venv/bin/python -m bench.ingest_bench --dataset ../shared/bench/scifact

Everything is measured in one run on one machine, side by side, so the ratios hold even on a
shared, noisy box. The raw embedder runs first with the mesh idle, then the mesh ingests the
same documents (a fresh state directory, so the first ingest really embeds everything).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from grpc import aio
from meshkit.settings import EmbedderSettings, IngestionSettings
from ragmesh.ingestion.v1 import ingestion_pb2, ingestion_pb2_grpc
from ragmesh_cli.stack import Stack

from services.embedder.model import EmbeddingModel, TextKind
from services.ingestion.chunking import Chunker
from services.ingestion.normalize import normalize

BATCH_DOCS = 256


def load_corpus(dataset: Path, limit: int) -> list[dict[str, str]]:
    path = dataset / "corpus.jsonl.gz"
    opener = gzip.open if path.exists() else open
    path = path if path.exists() else dataset / "corpus.jsonl"
    docs = []
    with opener(path, "rt", encoding="utf-8") as handle:  # type: ignore[operator]
        for line in handle:
            raw = json.loads(line)
            docs.append({"_id": raw["_id"], "title": raw.get("title", ""), "text": raw.get("text", "")})
            if limit and len(docs) >= limit:
                break
    return docs


def chunk_texts(docs: list[dict[str, str]]) -> list[str]:
    """The exact chunk texts the pipeline will embed (same chunker, same settings)."""
    settings = IngestionSettings()
    chunker = Chunker(
        settings.ingest_tokenizer_path,
        settings.ingest_chunk_tokens,
        settings.ingest_chunk_overlap_tokens,
        settings.ingest_model_max_tokens,
    )
    texts = []
    for doc in docs:
        normalized = normalize(doc["text"].encode(), ingestion_pb2.DOCUMENT_FORMAT_TEXT, doc["title"])
        texts.extend(c.text for c in chunker.chunk(normalized.markdown, normalized.title))
    return texts


def raw_embedder_throughput(texts: list[str], batch: int) -> dict[str, float]:
    model = EmbeddingModel.load(EmbedderSettings())
    model.embed(texts[:batch], TextKind.PASSAGE)  # warm-up
    started = time.perf_counter()
    for i in range(0, len(texts), batch):
        model.embed(texts[i : i + batch], TextKind.PASSAGE)
    elapsed = time.perf_counter() - started
    return {"chunks": len(texts), "seconds": elapsed, "chunks_per_s": len(texts) / elapsed}


async def submit(
    stub: ingestion_pb2_grpc.IngestionServiceStub, collection: str, docs: list[dict[str, str]]
) -> dict[str, int]:
    outcomes = {"queued": 0, "unchanged": 0}
    for i in range(0, len(docs), BATCH_DOCS):
        request = ingestion_pb2.IngestDocumentsRequest(
            collection=collection,
            documents=[
                ingestion_pb2.Document(
                    doc_id=d["_id"],
                    title=d["title"],
                    content=d["text"].encode(),
                    format=ingestion_pb2.DOCUMENT_FORMAT_TEXT,
                )
                for d in docs[i : i + BATCH_DOCS]
            ],
        )
        reply = await stub.IngestDocuments(request, timeout=120)
        for result in reply.results:
            key = "unchanged" if result.outcome == ingestion_pb2.SUBMIT_OUTCOME_UNCHANGED else "queued"
            outcomes[key] += 1
    return outcomes


async def wait_indexed(
    stub: ingestion_pb2_grpc.IngestionServiceStub, collection: str, total: int, timeout: float
) -> ingestion_pb2.GetCollectionStatusResponse:
    deadline = time.monotonic() + timeout
    last_print = 0.0
    while True:
        status = await stub.GetCollectionStatus(
            ingestion_pb2.GetCollectionStatusRequest(collection=collection), timeout=10
        )
        if status.indexed + status.failed >= total and status.queued == 0 and status.processing == 0:
            return status
        if time.monotonic() - last_print > 10:
            print(f"  ... indexed {status.indexed}/{total}", flush=True)
            last_print = time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {status.indexed}/{total} indexed after {timeout}s")
        await asyncio.sleep(0.1)


async def pipeline_run(stack: Stack, docs: list[dict[str, str]], timeout: float) -> dict[str, Any]:
    collection = "bench"
    async with aio.insecure_channel(stack.address("ingestion")) as channel:
        stub = ingestion_pb2_grpc.IngestionServiceStub(channel)
        started = time.perf_counter()
        first = await submit(stub, collection, docs)
        status = await wait_indexed(stub, collection, len(docs), timeout)
        first_s = time.perf_counter() - started

        started = time.perf_counter()
        again = await submit(stub, collection, docs)
        await wait_indexed(stub, collection, len(docs), timeout)
        again_s = time.perf_counter() - started
    return {
        "documents": len(docs),
        "indexed": status.indexed,
        "failed": status.failed,
        "chunks": status.chunks,
        "first_ingest_s": first_s,
        "docs_per_s": len(docs) / first_s,
        "chunks_per_s": status.chunks / first_s,
        "first_outcomes": first,
        "reingest_s": again_s,
        "reingest_outcomes": again,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", type=Path, default=Path("../shared/bench/scifact"))
    parser.add_argument("--limit", type=int, default=0, help="documents (0: all)")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--out", type=Path, default=Path("bench/results/ingest.json"))
    args = parser.parse_args()

    docs = load_corpus(args.dataset, args.limit)
    print(f"corpus: {len(docs)} documents from {args.dataset}", flush=True)
    started = time.perf_counter()
    texts = chunk_texts(docs)
    chunk_s = time.perf_counter() - started
    print(f"chunked into {len(texts)} chunks in {chunk_s:.1f}s", flush=True)

    raw = raw_embedder_throughput(texts, EmbedderSettings().embedder_max_batch)
    print(f"raw in-process embedder: {raw['chunks_per_s']:.1f} chunks/s", flush=True)

    state_dir = Path(tempfile.mkdtemp(prefix="ragmesh-bench-"))
    stack = Stack(state_dir, workers=args.workers)
    try:
        stack.up()
        pipeline = asyncio.run(pipeline_run(stack, docs, args.timeout))
    finally:
        stack.down()
        shutil.rmtree(state_dir, ignore_errors=True)

    result = {
        "dataset": str(args.dataset),
        "chunking_s": chunk_s,
        "raw_embedder": raw,
        "pipeline": pipeline,
        "pipeline_vs_raw": pipeline["chunks_per_s"] / raw["chunks_per_s"],
        "reingest_vs_first": pipeline["reingest_s"] / pipeline["first_ingest_s"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print()
    print("| measure | value |")
    print("|---|---|")
    print(f"| documents / chunks | {pipeline['documents']} / {pipeline['chunks']} |")
    print(f"| raw embedder, in-process (chunks/s) | {raw['chunks_per_s']:.1f} |")
    print(f"| pipeline first ingest (s) | {pipeline['first_ingest_s']:.1f} |")
    print(f"| pipeline (docs/s) | {pipeline['docs_per_s']:.1f} |")
    print(f"| pipeline (chunks/s) | {pipeline['chunks_per_s']:.1f} |")
    print(f"| pipeline / raw embedder | {result['pipeline_vs_raw']:.2f} |")
    print(f"| re-ingest unchanged (s) | {pipeline['reingest_s']:.2f} |")
    print(f"| re-ingest / first ingest | {result['reingest_vs_first']:.3f} |")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
