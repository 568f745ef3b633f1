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
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from grpc import aio

from bench.common import cli_ingest, collection_counts, corpus_file
from meshkit.settings import EmbedderSettings, IngestionSettings
from ragmesh.embedder.v1 import embedder_pb2, embedder_pb2_grpc
from ragmesh.index.v1 import index_pb2, index_pb2_grpc
from ragmesh.ingestion.v1 import ingestion_pb2
from ragmesh.sparse.v1 import sparse_pb2, sparse_pb2_grpc
from ragmesh_cli.stack import Stack
from services.embedder.model import EmbeddingModel, TextKind
from services.ingestion.chunking import Chunker
from services.ingestion.normalize import normalize


def load_corpus(corpus: Path) -> list[dict[str, str]]:
    opener = gzip.open if corpus.suffix == ".gz" else open
    with opener(corpus, "rt", encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return [{"_id": r["_id"], "title": r.get("title", ""), "text": r.get("text", "")} for r in rows]


def chunk_texts(docs: list[dict[str, str]]) -> list[str]:
    """The exact chunk texts the pipeline will embed (same chunker, same settings)."""
    chunker = Chunker.from_settings(IngestionSettings())
    texts: list[str] = []
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


async def spot_check(
    stack: Stack, collection: str, docs: list[dict[str, str]], sample: int
) -> dict[str, float]:
    """Do the stores' own search RPCs find the documents? Each sampled document's title is
    the query: the share found in the top 10 by the index (dense) and sparse (BM25) services."""
    rng = random.Random(7)
    picked = rng.sample([d for d in docs if d["title"]], min(sample, len(docs)))
    found = {"dense": 0, "bm25": 0}
    async with (
        aio.insecure_channel(stack.address("embedder")) as e_ch,
        aio.insecure_channel(stack.address("index-0")) as i_ch,
        aio.insecure_channel(stack.address("sparse")) as s_ch,
    ):
        embedder = embedder_pb2_grpc.EmbedderServiceStub(e_ch)
        index = index_pb2_grpc.IndexServiceStub(i_ch)
        sparse = sparse_pb2_grpc.SparseServiceStub(s_ch)
        for doc in picked:
            vector = (
                await embedder.Embed(embedder_pb2.EmbedRequest(texts=[doc["title"]]), timeout=30)
            ).vectors[0]
            dense = await index.Search(
                index_pb2.SearchRequest(collection=collection, vector=vector, top_k=10), timeout=10
            )
            bm25 = await sparse.SearchBm25(
                sparse_pb2.SearchBm25Request(collection=collection, query=doc["title"], top_k=10), timeout=10
            )
            found["dense"] += any(h.doc_id == doc["_id"] for h in dense.hits)
            found["bm25"] += any(h.doc_id == doc["_id"] for h in bm25.hits)
    return {leg: hits / len(picked) for leg, hits in found.items()}


def pipeline_run(stack: Stack, corpus: Path, docs: list[dict[str, str]], timeout: float) -> dict[str, Any]:
    collection = "bench"
    first_s = cli_ingest(stack.state_dir, corpus, collection, timeout)
    counts = asyncio.run(collection_counts(stack.address("ingestion"), collection))
    again_s = cli_ingest(stack.state_dir, corpus, collection, timeout)
    found = asyncio.run(spot_check(stack, collection, docs, 50))
    return {
        "documents": len(docs),
        "indexed": counts.indexed,
        "failed": counts.failed,
        "chunks": counts.chunks,
        "first_ingest_s": first_s,
        "docs_per_s": counts.indexed / first_s,
        "chunks_per_s": counts.chunks / first_s,
        "reingest_s": again_s,
        "title_found_top10": found,
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

    scratch = Path(tempfile.mkdtemp(prefix="ragmesh-bench-"))
    corpus = corpus_file(args.dataset, args.limit, scratch)
    docs = load_corpus(corpus)
    print(f"corpus: {len(docs)} documents from {args.dataset}", flush=True)
    started = time.perf_counter()
    texts = chunk_texts(docs)
    chunk_s = time.perf_counter() - started
    print(f"chunked into {len(texts)} chunks in {chunk_s:.1f}s", flush=True)

    raw = raw_embedder_throughput(texts, EmbedderSettings().embedder_max_batch)
    print(f"raw in-process embedder: {raw['chunks_per_s']:.1f} chunks/s", flush=True)

    stack = Stack(scratch / "state", workers=args.workers)
    try:
        stack.up()
        pipeline = pipeline_run(stack, corpus, docs, args.timeout)
    finally:
        stack.down()
        shutil.rmtree(scratch, ignore_errors=True)

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
    found = pipeline["title_found_top10"]
    print(
        f"| title query finds its doc in top 10: dense / BM25 | {found['dense']:.2f} / {found['bm25']:.2f} |"
    )
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
