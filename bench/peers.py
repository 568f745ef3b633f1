"""The peers of ``bench.peer_bench``, built in this process from the same chunks and vectors:
a Haystack 2.x pipeline and a LanceDB hybrid table. Both packages are the ``bench`` extra, imported
only when a peer is built."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from ragmesh_cli import metrics
from ragmesh_cli.rerankerbuild.mining import Passage
from services.embedder.model import EmbeddingModel, TextKind
from services.gateway.validation import DEFAULT_TOP_K

SyncSearch = Callable[[str], list[str]]


def progress(message: str) -> None:
    print(f"[peer-bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def top_documents(doc_ids: Iterable[str], k: int = DEFAULT_TOP_K) -> list[str]:
    """A fused chunk ranking as the first ``k`` documents (each at its best chunk)."""
    return metrics.first_occurrence(doc_ids)[:k]


def query_vector(model: EmbeddingModel, query: str) -> np.ndarray:
    return model.embed([query], TextKind.QUERY)[0][0]


def build_haystack(
    model: EmbeddingModel, chunks: Sequence[Passage], vectors: np.ndarray, pool: int
) -> SyncSearch:
    # Imported here: the peers are a bench extra. No telemetry (and no network on CI machines).
    os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")
    from haystack import Document, Pipeline, component
    from haystack.components.joiners import DocumentJoiner
    from haystack.components.retrievers.in_memory import InMemoryBM25Retriever, InMemoryEmbeddingRetriever
    from haystack.document_stores.in_memory import InMemoryDocumentStore

    @component
    class QueryEmbedder:
        """The project's ONNX model as a Haystack text embedder (no model hub here)."""

        @component.output_types(embedding=list[float])
        def run(self, text: str) -> dict[str, list[float]]:
            return {"embedding": query_vector(model, text).tolist()}

    # Vectors are L2-normalised: dot product is cosine. Results need no embeddings back.
    store = InMemoryDocumentStore(embedding_similarity_function="dot_product", return_embedding=False)
    started = time.perf_counter()
    store.write_documents(
        [
            Document(id=c.chunk_id, content=c.text, embedding=v.tolist(), meta={"doc_id": c.doc_id})
            for c, v in zip(chunks, vectors, strict=True)
        ]
    )
    progress(f"haystack: {store.count_documents()} chunks written in {time.perf_counter() - started:.1f}s")
    pipeline = Pipeline()
    pipeline.add_component("embedder", QueryEmbedder())
    pipeline.add_component("bm25", InMemoryBM25Retriever(store, top_k=pool))
    pipeline.add_component("dense", InMemoryEmbeddingRetriever(store, top_k=pool))
    pipeline.add_component("joiner", DocumentJoiner(join_mode="reciprocal_rank_fusion"))
    pipeline.connect("embedder.embedding", "dense.query_embedding")
    pipeline.connect("bm25.documents", "joiner.documents")
    pipeline.connect("dense.documents", "joiner.documents")

    def search(query: str) -> list[str]:
        out = pipeline.run({"embedder": {"text": query}, "bm25": {"query": query}})
        return top_documents(d.meta["doc_id"] for d in out["joiner"]["documents"])

    return search


def build_lancedb(
    model: EmbeddingModel, chunks: Sequence[Passage], vectors: np.ndarray, pool: int, workdir: Path
) -> SyncSearch:
    import lancedb
    import pyarrow as pa
    from lancedb.index import FTS
    from lancedb.rerankers import RRFReranker

    started = time.perf_counter()
    db = lancedb.connect(str(workdir))
    data = pa.table(
        {
            "chunk_id": [c.chunk_id for c in chunks],
            "doc_id": [c.doc_id for c in chunks],
            "text": [c.text for c in chunks],
            "vector": pa.FixedSizeListArray.from_arrays(
                pa.array(vectors.astype(np.float32).ravel()), vectors.shape[1]
            ),
        }
    )
    table = db.create_table("chunks", data=data)
    table.create_index("text", config=FTS())
    progress(
        f"lancedb: {table.count_rows()} chunks written and full-text indexed in "
        f"{time.perf_counter() - started:.1f}s"
    )
    reranker = RRFReranker()

    def search(query: str) -> list[str]:
        found = (
            table.search(query_type="hybrid")
            .vector(query_vector(model, query))
            .text(query)
            .rerank(reranker)
            .limit(pool)
            .to_arrow()
        )
        return top_documents(found.column("doc_id").to_pylist())

    return search
