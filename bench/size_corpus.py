"""The size bench's synthetic corpus: documents, chunk text, metadata and vectors made from a seed,
and the exact answers the ANN index is scored against (bench/size_bench.py).

Everything is a pure function of the seed, so two runs fill the same collection:

- **Documents** come in blocks of ``block_docs`` (1000); document ``d`` has 5-15 chunks (10 on average),
  a topic (one of ``clusters``), a title and four metadata keys (``dept`` one of ten values,
  uniform: a filter on one of them matches ~10% of the documents; ``lang``, ``year``, ``kind``).
- **Text**: ~150 words per chunk from a vocabulary of ``vocab_size`` made-up words (syllables,
  no real word on purpose), drawn from a Zipf distribution (s = 1.07), a quarter of them from the
  40 topic words of the document's topic, so BM25 has topics to find.
- **Vectors** (``clustered``): a mixture of Gaussian clusters on the unit sphere: a centre per
  topic, a document vector around it, each chunk around its document, normalised (cosines of
  ~0.4-0.75 between chunks of one topic, ~0 between topics, as sentence embeddings have);
  ``random``: uniform on the sphere (the worst case for an ANN index).
- **Queries**: vectors near a topic's centre (perturbed), text from its topic words plus two
  common words.
- **Versions**: a changed document (the checkpoint measurement) is regenerated from
  ``(seed, doc, version)`` with the same chunk count and topic and new text, vectors and ids.

``ExactIndex`` keeps the vectors the bench wrote, in fill order, and answers top-k by brute force
(numpy, float32 inner product): the ground truth of ``recall_at_k``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from meshkit.domain.ids import chunk_id_for

BLOCK_DOCS = 1000
MIN_CHUNKS, MAX_CHUNKS = 5, 15
WORDS_PER_CHUNK = (120, 180)
TOPIC_WORDS = 40
TOPIC_SHARE = 0.25
ZIPF_S = 1.07
DEPTS = 10
LANGS = ("en", "de", "fr", "es", "ja")
LANG_WEIGHTS = (0.6, 0.15, 0.12, 0.08, 0.05)
KINDS = ("report", "note", "spec", "faq")
# Noise norms (relative to the unit centre): document around its topic, chunk around its document,
# query around its topic's centre. Each topic scales them by its own factor (tight and loose ones).
DOC_SIGMA, CHUNK_SIGMA, QUERY_SIGMA = 0.7, 0.7, 0.6
_CONSONANTS = "bcdfghjklmnprstvz"
_VOWELS = "aeiou"
# Stream tags of np.random.default_rng([seed, tag, ...]): one per kind of draw.
_VOCAB, _TOPICS, _CENTRES, _ATTRS, _VECTORS, _TEXT, _VERSION, _QUERIES = range(1, 9)


def make_vocabulary(size: int, seed: int) -> list[str]:
    """``size`` distinct made-up lower-case words of 2-4 consonant-vowel syllables (+ a final
    consonant sometimes), in Zipf rank order (index 0 is the most frequent)."""
    rng = np.random.default_rng([seed, _VOCAB])
    words: dict[str, None] = {}
    while len(words) < size:
        n = max(1024, size - len(words))
        syllables = rng.integers(2, 5, n)
        cons = rng.integers(0, len(_CONSONANTS), (n, 5))
        vows = rng.integers(0, len(_VOWELS), (n, 4))
        tails = rng.integers(0, 3 * len(_CONSONANTS), n)
        for i in range(n):
            word = "".join(_CONSONANTS[cons[i, j]] + _VOWELS[vows[i, j]] for j in range(syllables[i]))
            if tails[i] < len(_CONSONANTS) and _CONSONANTS[tails[i]] != "s":
                word += _CONSONANTS[tails[i]]
            words.setdefault(word, None)
            if len(words) == size:
                break
    return list(words)


def zipf_cdf(size: int, s: float = ZIPF_S) -> np.ndarray:
    weights = 1.0 / np.arange(1, size + 1, dtype=np.float64) ** s
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]


def normalise(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return (x / np.maximum(norms, 1e-12)).astype(np.float32)


@dataclass(frozen=True)
class Document:
    index: int
    doc_id: str
    version: int
    title: str
    topic: int
    metadata: dict[str, str]
    texts: list[str]
    vectors: np.ndarray  # (chunks, dim) float32, unit norm
    chunk_ids: list[str]


@dataclass(frozen=True)
class Query:
    topic: int
    text: str
    vector: np.ndarray


@dataclass(frozen=True)
class BlockAttrs:
    """What a block's documents are, before their text and vectors: chunk counts, topics,
    metadata codes (``dept`` index, ``lang`` index, year, ``kind`` index)."""

    counts: np.ndarray
    topics: np.ndarray
    dept: np.ndarray
    lang: np.ndarray
    year: np.ndarray
    kind: np.ndarray


class SyntheticCorpus:
    def __init__(
        self,
        seed: int = 7,
        *,
        dim: int = 384,
        clusters: int = 2000,
        vocab_size: int = 50_000,
        vectors: str = "clustered",
        collection: str = "size",
        block_docs: int = BLOCK_DOCS,
    ) -> None:
        if vectors not in ("clustered", "random"):
            raise ValueError(f"vectors must be clustered or random, not {vectors!r}")
        self.seed = seed
        self.dim = dim
        self.clusters = clusters
        self.vectors_mode = vectors
        self.collection = collection
        self.block_docs = block_docs
        self.vocab = np.array(make_vocabulary(vocab_size, seed), dtype=object)
        self.cdf = zipf_cdf(vocab_size)
        rng = np.random.default_rng([seed, _TOPICS])
        # Topic words are mid-frequency: ranks 200.. (the head is every topic's filler).
        low = min(200, vocab_size // 4)
        self.topic_words = rng.integers(low, vocab_size, (clusters, TOPIC_WORDS))
        rng = np.random.default_rng([seed, _CENTRES])
        self.centres = normalise(rng.standard_normal((clusters, dim), dtype=np.float32))
        self.spread = rng.uniform(0.8, 1.25, clusters).astype(np.float32)
        self._attrs: dict[int, BlockAttrs] = {}

    # ----- documents -----

    def doc_id(self, d: int) -> str:
        return f"doc-{d:08d}"

    def chunk_id(self, d: int, ordinal: int, version: int) -> str:
        """Content-addressed as the ingestion's ids are (meshkit.domain.ids.chunk_id_for), over a key of
        the chunk instead of its text: the same chunk of the same version keeps its id."""
        return chunk_id_for(self.collection, self.doc_id(d), f"{self.seed}:{ordinal}:{version}")

    def attrs(self, block: int) -> BlockAttrs:
        cached = self._attrs.get(block)
        if cached is None:
            rng = np.random.default_rng([self.seed, _ATTRS, block])
            n = self.block_docs
            cached = BlockAttrs(
                counts=rng.integers(MIN_CHUNKS, MAX_CHUNKS + 1, n),
                topics=rng.integers(0, self.clusters, n),
                dept=rng.integers(0, DEPTS, n),
                lang=rng.choice(len(LANGS), n, p=LANG_WEIGHTS),
                year=rng.integers(2010, 2026, n),
                kind=rng.integers(0, len(KINDS), n),
            )
            if len(self._attrs) > 64:
                self._attrs.clear()
            self._attrs[block] = cached
        return cached

    def chunk_count(self, d: int) -> int:
        block, i = divmod(d, self.block_docs)
        return int(self.attrs(block).counts[i])

    def dept_of(self, d: int) -> int:
        block, i = divmod(d, self.block_docs)
        return int(self.attrs(block).dept[i])

    def block(self, block: int) -> list[Document]:
        """The block's documents at version 0 (one vector and one text draw for the block)."""
        a = self.attrs(block)
        total = int(a.counts.sum())
        rng = np.random.default_rng([self.seed, _VECTORS, block])
        doc_of_row = np.repeat(np.arange(self.block_docs), a.counts)
        vectors = self._vectors(rng, a.topics, doc_of_row, total)
        texts = self._texts(np.random.default_rng([self.seed, _TEXT, block]), a.topics[doc_of_row])
        docs, start = [], 0
        for i in range(self.block_docs):
            k = int(a.counts[i])
            d = block * self.block_docs + i
            docs.append(self._document(d, 0, a, i, texts[start : start + k], vectors[start : start + k]))
            start += k
        return docs

    def version(self, d: int, version: int) -> Document:
        """Document ``d`` rewritten (version >= 1): same topic, chunk count and metadata, new text,
        vectors and chunk ids."""
        if version < 1:
            raise ValueError("version 0 comes from block()")
        block, i = divmod(d, self.block_docs)
        a = self.attrs(block)
        k = int(a.counts[i])
        rng = np.random.default_rng([self.seed, _VERSION, d, version])
        topics = a.topics[i : i + 1]
        vectors = self._vectors(rng, topics, np.zeros(k, dtype=np.int64), k)
        texts = self._texts(rng, np.repeat(topics, k))
        return self._document(d, version, a, i, texts, vectors)

    def _document(
        self, d: int, version: int, a: BlockAttrs, i: int, texts: list[str], vectors: np.ndarray
    ) -> Document:
        topic = int(a.topics[i])
        words = self.vocab[self.topic_words[topic, (d % 7) : (d % 7) + 3]]
        title = " ".join(words.tolist()) + f" {d}"
        metadata = {
            "dept": f"d{int(a.dept[i])}",
            "lang": LANGS[int(a.lang[i])],
            "year": str(int(a.year[i])),
            "kind": KINDS[int(a.kind[i])],
        }
        ids = [self.chunk_id(d, j, version) for j in range(len(texts))]
        return Document(d, self.doc_id(d), version, title, topic, metadata, texts, vectors, ids)

    def _vectors(
        self, rng: np.random.Generator, topics: np.ndarray, doc_of_row: np.ndarray, rows: int
    ) -> np.ndarray:
        if self.vectors_mode == "random":
            return normalise(rng.standard_normal((rows, self.dim), dtype=np.float32))
        scale = np.float32(1.0 / math.sqrt(self.dim))
        spread = self.spread[topics][:, None]
        docs = self.centres[topics] + DOC_SIGMA * scale * spread * rng.standard_normal(
            (len(topics), self.dim), dtype=np.float32
        )
        noise = rng.standard_normal((rows, self.dim), dtype=np.float32)
        chunks = docs[doc_of_row] + CHUNK_SIGMA * scale * spread[doc_of_row] * noise
        return normalise(chunks)

    def _texts(self, rng: np.random.Generator, topic_of_row: np.ndarray) -> list[str]:
        rows = len(topic_of_row)
        lengths = rng.integers(WORDS_PER_CHUNK[0], WORDS_PER_CHUNK[1] + 1, rows)
        width = WORDS_PER_CHUNK[1]
        words = np.searchsorted(self.cdf, rng.random((rows, width)))
        from_topic = rng.random((rows, width)) < TOPIC_SHARE
        topical = self.topic_words[topic_of_row[:, None], rng.integers(0, TOPIC_WORDS, (rows, width))]
        words = np.where(from_topic, topical, words)
        strings = self.vocab[words]
        return [" ".join(strings[r, : lengths[r]].tolist()) for r in range(rows)]

    # ----- queries -----

    def queries(self, n: int) -> list[Query]:
        rng = np.random.default_rng([self.seed, _QUERIES, n])
        topics = rng.integers(0, self.clusters, n)
        if self.vectors_mode == "random":
            vectors = normalise(rng.standard_normal((n, self.dim), dtype=np.float32))
        else:
            scale = np.float32(QUERY_SIGMA / math.sqrt(self.dim))
            noise = rng.standard_normal((n, self.dim), dtype=np.float32)
            vectors = normalise(self.centres[topics] + scale * self.spread[topics][:, None] * noise)
        out = []
        for i, topic in enumerate(topics.tolist()):
            own = self.vocab[self.topic_words[topic, rng.integers(0, TOPIC_WORDS, 4)]].tolist()
            common = self.vocab[rng.integers(20, 2000, 2)].tolist()
            out.append(Query(topic, " ".join([*own[:2], *common[:1], *own[2:], *common[1:]]), vectors[i]))
        return out


class ExactIndex:
    """The vectors written so far, by position in fill order (documents are contiguous), with
    their owners: brute-force top-k over them is the ground truth."""

    def __init__(self, corpus: SyntheticCorpus, capacity: int) -> None:
        self.corpus = corpus
        self.vectors = np.empty((capacity, corpus.dim), dtype=np.float32)
        self.doc = np.empty(capacity, dtype=np.int64)
        self.ordinal = np.empty(capacity, dtype=np.int32)
        self.dept = np.empty(capacity, dtype=np.int16)
        self.size = 0
        self.versions: dict[int, int] = {}
        self.start_of: dict[int, int] = {}

    def add(self, doc: Document, ordinals: range) -> None:
        """Chunks ``ordinals`` of ``doc`` (a document may come in two parts across sizes)."""
        n = len(ordinals)
        if self.size + n > len(self.vectors):
            raise ValueError("ExactIndex capacity exceeded")
        at = slice(self.size, self.size + n)
        self.vectors[at] = doc.vectors[ordinals.start : ordinals.stop]
        self.doc[at] = doc.index
        self.ordinal[at] = np.arange(ordinals.start, ordinals.stop)
        self.dept[at] = self.corpus.dept_of(doc.index)
        self.start_of.setdefault(doc.index, self.size)
        self.size += n

    def replace(self, doc: Document) -> None:
        """A new version of a document already written whole (same chunk count)."""
        start = self.start_of[doc.index]
        self.vectors[start : start + len(doc.chunk_ids)] = doc.vectors
        self.versions[doc.index] = doc.version

    def chunk_id(self, position: int) -> str:
        d = int(self.doc[position])
        return self.corpus.chunk_id(d, int(self.ordinal[position]), self.versions.get(d, 0))

    def top_k(
        self, queries: np.ndarray, k: int, dept: int | None = None, block_rows: int = 65536
    ) -> list[list[str]]:
        """The ``k`` best chunk ids per query by inner product (only ``dept``'s documents when given)."""
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        best_scores = np.full((len(queries), 0), -np.inf, dtype=np.float32)
        best_pos = np.zeros((len(queries), 0), dtype=np.int64)
        for start in range(0, self.size, block_rows):
            stop = min(self.size, start + block_rows)
            scores = queries @ self.vectors[start:stop].T
            if dept is not None:
                scores[:, self.dept[start:stop] != dept] = -np.inf
            take = min(k, stop - start)
            part = np.argpartition(-scores, take - 1, axis=1)[:, :take]
            best_scores = np.concatenate([best_scores, np.take_along_axis(scores, part, 1)], axis=1)
            best_pos = np.concatenate([best_pos, part + start], axis=1)
            if best_scores.shape[1] > k:
                keep = np.argpartition(-best_scores, k - 1, axis=1)[:, :k]
                best_scores = np.take_along_axis(best_scores, keep, 1)
                best_pos = np.take_along_axis(best_pos, keep, 1)
        order = np.argsort(-best_scores, axis=1, kind="stable")
        out = []
        for row in range(len(queries)):
            ids = [
                self.chunk_id(int(best_pos[row, j])) for j in order[row] if np.isfinite(best_scores[row, j])
            ]
            out.append(ids)
        return out


def recall_at_k(found: Sequence[Sequence[str]], truth: Sequence[Sequence[str]], k: int = 10) -> float:
    """Mean over queries of |found[:k] & truth[:k]| / min(k, |truth|) (queries with no truth skipped)."""
    if len(found) != len(truth):
        raise ValueError("found and truth must have one list per query")
    shares = []
    for got, want in zip(found, truth, strict=True):
        wanted = set(want[:k])
        if wanted:
            shares.append(len(set(got[:k]) & wanted) / len(wanted))
    return sum(shares) / len(shares) if shares else float("nan")
