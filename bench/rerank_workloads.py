"""What the reranker benchmarks (bench.rerank_bench, bench.rerank_variants) score: a model as
served or as a variant (tokens per pair, passage window, opening tokens, candidates), and
workloads of queries with their BM25 candidate passages."""

from __future__ import annotations

import argparse
import random
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from meshkit.settings import RerankerSettings
from ragmesh_cli.datasets import load_dataset
from ragmesh_cli.rerankerbuild.mining import Corpus, bm25_collection, chunk_corpus, read_beir_corpus
from ragmesh_cli.stats import percentile as stats_percentile
from services.reranker.model import CrossEncoderModel
from services.reranker.window import WindowPolicy


@dataclass(frozen=True)
class ModelSpec:
    """A model directory and how it is served: tokens per pair (0: its limit), passage window,
    opening tokens an overlap window keeps."""

    model_dir: Path
    max_tokens: int = 0
    window: WindowPolicy = "head"
    head: int = 0

    def load(self) -> CrossEncoderModel:
        return CrossEncoderModel.load(
            self.model_dir, max_tokens=self.max_tokens, window=self.window, window_head_tokens=self.head
        )

    def label(self) -> str:
        return f"{self.model_dir} ({self.max_tokens or 'full'} tokens, {self.window} windows)"


def served_spec(model_dir: Path) -> ModelSpec:
    """The model as the reranker service serves it by default (RAGMESH_RERANKER_* settings)."""
    settings = RerankerSettings()
    window = settings.reranker_passage_window
    # Opening tokens only matter to overlap windows: a head window served with any is the same.
    head = settings.reranker_window_head_tokens if window == "overlap" else 0
    return ModelSpec(model_dir, settings.reranker_max_tokens, window, head)


@dataclass(frozen=True)
class Variant:
    """One cell of a trade-off: tokens per pair, window, opening tokens kept, candidates."""

    tokens: int
    window: WindowPolicy
    head: int
    candidates: int

    @classmethod
    def parse(cls, text: str) -> Variant:
        parts = text.split(":")
        if (
            len(parts) != 4
            or parts[1] not in ("head", "overlap")
            or not all(p.isdigit() for p in (parts[0], parts[2], parts[3]))
        ):
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected TOKENS:head|overlap:OPENING:CANDIDATES, e.g. 160:overlap:32:35"
            )
        window: WindowPolicy = "overlap" if parts[1] == "overlap" else "head"
        return cls(int(parts[0]), window, int(parts[2]), int(parts[3]))

    def spec(self, model_dir: Path) -> ModelSpec:
        return ModelSpec(model_dir, self.tokens, self.window, self.head)

    def __str__(self) -> str:
        return f"{self.tokens}:{self.window}:{self.head}:{self.candidates}"


TRADE_OFF = tuple(
    Variant.parse(v)
    for v in ("256:head:0:35", "192:head:0:35", "160:overlap:32:35", "128:overlap:32:35", "160:overlap:32:20")
)


@dataclass
class Workload:
    queries: list[str]
    # Per query: its candidate passages, best BM25 first.
    candidates: list[list[str]]
    # Per query: the documents of those candidates, in the same order.
    doc_ids: list[list[str]] = field(default_factory=list)
    query_ids: list[str] = field(default_factory=list)


def bm25_workload(corpus: Corpus, queries: Sequence[tuple[str, str]], depth: int) -> Workload:
    """Each (query id, text) with its BM25 top ``depth`` chunks, as the gateway would send them."""
    with tempfile.TemporaryDirectory(prefix="ragmesh-rerank-bench-") as workdir:
        bm25 = bm25_collection(corpus, Path(workdir))
        index = {p.chunk_id: p for p in corpus.passages}
        work = Workload([], [])
        for qid, text in queries:
            hits = [index[h.chunk_id] for h in bm25.search_bm25(text, depth, [])]
            work.query_ids.append(qid)
            work.queries.append(text)
            work.candidates.append([p.text for p in hits])
            work.doc_ids.append([p.doc_id for p in hits])
        bm25.close()
    return work


def train_workload(dataset: Path, claims: int, depth: int, seed: int) -> Workload:
    """Train claims (never test) with their BM25 top chunks."""
    data = load_dataset(dataset, "train")
    corpus = chunk_corpus(read_beir_corpus(data.corpus_path), "bench")
    chosen = sorted(data.queries.items())
    random.Random(seed).shuffle(chosen)
    return bm25_workload(corpus, chosen[:claims], depth)


def percentile(values: Sequence[float], q: float) -> float:
    """Latency percentiles of the offline benchmarks: interpolated, 0 for no values."""
    return stats_percentile(values, q, method="linear", empty=0.0)
