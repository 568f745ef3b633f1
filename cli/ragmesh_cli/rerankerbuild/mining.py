"""Training material from a BEIR corpus, mined with ragmesh's own components in-process.

Passages are the chunks ingestion would store (same normaliser, same chunker), so the model learns on
the text the reranker is served. Hard negatives come from our two main legs: BM25 over the chunks
(the sparse service's tantivy collection) and dense retrieval over the documents (the embedder's ONNX
model). Self-supervised groups come from the corpus alone: a sentence of an abstract against the rest
of its passage (an inverse cloze task), its negatives mined the same way.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from meshkit.domain.ids import chunk_id_for
from meshkit.settings import EmbedderSettings
from ragmesh_cli.documents import WalkStats, read_corpus
from services.embedder.public import TextKind, load_model
from services.ingestion.public import DocumentPreparer
from services.sparse.public import ChunkRecord, Collection, DocumentUpdate, open_collection

log = logging.getLogger("ragmesh.rerankerbuild")

MINING_VERSION = 1
COLLECTION = "train"
# Mining candidates per leg; negatives are drawn from the top of each list.
BM25_DEPTH = 40
DENSE_DEPTH = 40
# Dense mining reads the start of each document only: it finds neighbours, it is not evaluated.
DENSE_MINING_TOKENS = 128
_SENTENCE_RE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(])")
_WORD_RE = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class Passage:
    chunk_id: str
    doc_id: str
    text: str


@dataclass
class Mined:
    """One query with its positives and each leg's ranked candidates (passage indexes)."""

    query_id: str
    query: str
    positives: list[int]
    positive_docs: list[str]
    # Ranked candidates of each leg, positives included (validation ranks with them; training
    # draws negatives from the rest).
    bm25: list[int]
    dense: list[int]
    source: str  # "claim" or "cloze"


@dataclass
class Corpus:
    passages: list[Passage]
    by_doc: dict[str, list[int]]
    titles: dict[str, str]


def progress(message: str) -> None:
    print(f"[reranker-build {time.strftime('%H:%M:%S')}] {message}", flush=True)


def read_beir_corpus(path: Path) -> Iterator[tuple[str, str, str]]:
    """(doc id, title, text) as `ragmesh ingest` reads them: ids sanitised the same way, so they
    match the qrels (which ``load_dataset`` maps alike) and the ids ingestion stores."""
    for document in read_corpus(path, WalkStats()):
        yield document.doc_id, document.title, document.content.decode("utf-8")


def chunk_corpus(records: Iterable[tuple[str, str, str]], collection: str) -> Corpus:
    """Chunks exactly as ingestion makes them from a plain-text document."""
    preparer = DocumentPreparer()
    passages: list[Passage] = []
    by_doc: dict[str, list[int]] = {}
    titles: dict[str, str] = {}
    for doc_id, title, text in records:
        if not text.strip():
            continue
        prepared = preparer.prepare_text(text, title)
        titles[doc_id] = prepared.title
        for draft in prepared.drafts:
            by_doc.setdefault(doc_id, []).append(len(passages))
            passages.append(Passage(chunk_id_for(collection, doc_id, draft.text), doc_id, draft.text))
    return Corpus(passages, by_doc, titles)


def words(text: str) -> set[str]:
    return set(_WORD_RE.findall(text.lower()))


def best_chunk(corpus: Corpus, doc_id: str, query: str) -> int:
    """The chunk of a document that shares most words with the query (the one a reader would
    point at); ties go to the earlier chunk."""
    wanted = words(query)
    chunks = corpus.by_doc[doc_id]
    return max(chunks, key=lambda i: (len(wanted & words(corpus.passages[i].text)), -i))


def bm25_collection(corpus: Corpus, workdir: Path) -> Collection:
    """The corpus's chunks in a sparse-service collection (its analyzer, its title boost)."""
    collection = open_collection(workdir, COLLECTION)
    updates = [
        DocumentUpdate(
            doc_id,
            [
                ChunkRecord(p.chunk_id, doc_id, corpus.titles[doc_id], p.text)
                for p in (corpus.passages[i] for i in chunks)
            ],
            [],
        )
        for doc_id, chunks in corpus.by_doc.items()
    ]
    collection.replace_documents(updates)
    return collection


class Legs:
    """BM25 over the chunks and dense over the documents, built once per build."""

    def __init__(self, corpus: Corpus, workdir: Path) -> None:
        self.corpus = corpus
        self.index_of = {p.chunk_id: i for i, p in enumerate(corpus.passages)}
        self.bm25 = bm25_collection(corpus, workdir)
        self.doc_ids = sorted(corpus.by_doc)
        self.model = load_model(EmbedderSettings(embedder_max_tokens=DENSE_MINING_TOKENS))
        self.doc_vectors = self._embed_documents()

    def _embed_documents(self) -> np.ndarray:
        texts = [self.corpus.passages[self.corpus.by_doc[d][0]].text for d in self.doc_ids]
        vectors = []
        step = 256
        started = time.monotonic()
        for start in range(0, len(texts), step):
            batch, _ = self.model.embed(texts[start : start + step], TextKind.PASSAGE)
            vectors.append(batch)
            done = min(start + step, len(texts))
            rate = done / max(time.monotonic() - started, 1e-6)
            progress(f"dense mining: embedded {done}/{len(texts)} documents ({rate:.0f}/s)")
        return np.vstack(vectors).astype(np.float32)

    def bm25_chunks(self, query: str, depth: int = BM25_DEPTH) -> list[int]:
        hits = self.bm25.search_bm25(query, depth, [])
        return [self.index_of[h.chunk_id] for h in hits if h.chunk_id in self.index_of]

    def dense_docs(self, queries: Sequence[str], depth: int = DENSE_DEPTH) -> list[list[str]]:
        vectors, _ = self.model.embed(list(queries), TextKind.QUERY)
        scores = vectors @ self.doc_vectors.T
        top = np.argsort(-scores, axis=1, kind="stable")[:, :depth]
        return [[self.doc_ids[j] for j in row] for row in top]

    def close(self) -> None:
        self.bm25.close()


def mine_queries(
    legs: Legs, queries: Sequence[tuple[str, str, list[str]]], source: str, batch: int = 64
) -> list[Mined]:
    """Each (id, text, positive doc ids) with both legs' candidates, positives excluded from them."""
    corpus = legs.corpus
    mined: list[Mined] = []
    for start in range(0, len(queries), batch):
        part = queries[start : start + batch]
        dense = legs.dense_docs([q for _, q, _ in part])
        for (query_id, query, positive_docs), dense_docs in zip(part, dense, strict=True):
            known = [d for d in positive_docs if d in corpus.by_doc]
            if not known:
                continue
            positives = [best_chunk(corpus, d, query) for d in known]
            dense_chunks = [best_chunk(corpus, d, query) for d in dense_docs]
            mined.append(
                Mined(query_id, query, positives, known, legs.bm25_chunks(query), dense_chunks, source)
            )
        progress(f"mined {source} queries: {min(start + batch, len(queries))}/{len(queries)}")
    return mined


def cloze_queries(
    corpus: Corpus, count: int, rng: random.Random
) -> tuple[list[tuple[str, str, list[str]]], Corpus]:
    """Inverse cloze: a sentence from a document's first chunk is the query; the passage with that
    sentence removed is its positive. Returns the queries and a corpus copy whose positive
    passages have the sentence cut out (so the pair is not a string match)."""
    doc_ids = sorted(corpus.by_doc)
    rng.shuffle(doc_ids)
    queries: list[tuple[str, str, list[str]]] = []
    passages = list(corpus.passages)
    for doc_id in doc_ids:
        if len(queries) >= count:
            break
        first = corpus.by_doc[doc_id][0]
        text = passages[first].text
        _head, _, body = text.partition("\n\n")
        sentences = [s for s in _SENTENCE_RE.split(body) if 40 <= len(s) <= 300]
        if len(sentences) < 3:
            continue
        sentence = rng.choice(sentences[1:])
        passages[first] = Passage(passages[first].chunk_id, doc_id, text.replace(sentence, "").strip())
        queries.append((f"cloze:{doc_id}", sentence, [doc_id]))
    return queries, Corpus(passages, corpus.by_doc, corpus.titles)


def split_claims(
    claims: dict[str, str], qrels: dict[str, dict[str, int]], validation_share: float, seed: int
) -> tuple[list[tuple[str, str, list[str]]], list[tuple[str, str, list[str]]]]:
    """Train claims with at least one positive, split by a seeded shuffle into fit / validation."""
    usable = sorted(
        (qid, text, sorted(d for d, rel in qrels.get(qid, {}).items() if rel > 0))
        for qid, text in claims.items()
    )
    usable = [u for u in usable if u[2]]
    random.Random(seed).shuffle(usable)
    cut = round(len(usable) * validation_share)
    return usable[cut:], usable[:cut]


def fingerprint(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def save_mined(path: Path, corpus: Corpus, groups: dict[str, list[Mined]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "passages": [asdict(p) for p in corpus.passages],
        "groups": {name: [asdict(m) for m in items] for name, items in groups.items()},
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload))
    tmp.replace(path)


def load_mined(path: Path) -> tuple[list[Passage], dict[str, list[Mined]]]:
    payload = json.loads(path.read_text())
    passages = [Passage(**p) for p in payload["passages"]]
    groups = {name: [Mined(**m) for m in items] for name, items in payload["groups"].items()}
    return passages, groups


def mine(
    corpus_path: Path,
    claims: dict[str, str],
    qrels: dict[str, dict[str, int]],
    *,
    seed: int,
    validation_share: float,
    cloze_count: int,
) -> tuple[list[Passage], dict[str, list[Mined]]]:
    """Fit, validation and cloze groups over one shared passage list (cloze positives appended)."""
    progress(f"chunking {corpus_path}")
    corpus = chunk_corpus(read_beir_corpus(corpus_path), COLLECTION)
    progress(f"{len(corpus.passages)} passages from {len(corpus.by_doc)} documents")
    fit, validation = split_claims(claims, qrels, validation_share, seed)
    with tempfile.TemporaryDirectory(prefix="ragmesh-rerank-mine-") as workdir:
        legs = Legs(corpus, Path(workdir))
        try:
            groups = {
                "fit": mine_queries(legs, fit, "claim"),
                "validation": mine_queries(legs, validation, "claim"),
            }
            cloze, cut_corpus = cloze_queries(corpus, cloze_count, random.Random(seed + 1))
            cloze_mined = mine_queries(legs, cloze, "cloze")
        finally:
            legs.close()
    # A cloze positive is its document's first chunk with the sentence cut out: append those
    # passages and point the cloze groups at them.
    passages = list(corpus.passages)
    for item in cloze_mined:
        first = corpus.by_doc[item.positive_docs[0]][0]
        passages.append(cut_corpus.passages[first])
        item.positives = [len(passages) - 1]
    groups["cloze"] = cloze_mined
    return passages, groups
