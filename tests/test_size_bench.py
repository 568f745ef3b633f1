"""bench/size_bench.py's pure parts, no stack: the synthetic corpus is deterministic and clustered,
exact top-k and recall, percentiles, and a size's JSON line carries every field (the measurement
functions run against in-memory fakes of the index, sparse and gateway stubs)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.size_bench import fill_line, parse_sizes, shard_names
from bench.size_corpus import ExactIndex, SyntheticCorpus, make_vocabulary, recall_at_k
from bench.size_fill import Filler
from bench.size_measure import Mesh, checkpoint, measure_searches, ms, restart, run_load
from bench.size_procs import disk_usage
from bench.size_report import REQUIRED_FIELDS, fill_bound, markdown_table, missing_fields, write_doc
from meshkit.domain.ids import document_shard
from ragmesh.gateway.v1 import gateway_pb2
from ragmesh.index.v1 import index_pb2
from ragmesh.sparse.v1 import sparse_pb2


def small(seed: int = 3, vectors: str = "clustered") -> SyntheticCorpus:
    return SyntheticCorpus(seed, dim=32, clusters=12, vocab_size=3000, vectors=vectors, block_docs=60)


def test_corpus_is_deterministic() -> None:
    a, b = small(), small()
    da, db = a.block(1), b.block(1)
    assert [d.chunk_ids for d in da] == [d.chunk_ids for d in db]
    assert [d.texts for d in da] == [d.texts for d in db]
    assert all(np.array_equal(x.vectors, y.vectors) for x, y in zip(da, db, strict=True))
    assert [q.text for q in a.queries(5)] == [q.text for q in b.queries(5)]
    other = small(seed=4).block(1)
    assert [d.chunk_ids for d in other] != [d.chunk_ids for d in da]
    # A new version: same document and chunk count, new ids, text and vectors.
    doc = da[0]
    new = a.version(doc.index, 1)
    assert (new.doc_id, len(new.chunk_ids), new.topic) == (doc.doc_id, len(doc.chunk_ids), doc.topic)
    assert not set(new.chunk_ids) & set(doc.chunk_ids) and new.texts != doc.texts
    assert a.version(doc.index, 1).chunk_ids == new.chunk_ids


def test_corpus_shape() -> None:
    corpus = small()
    docs = corpus.block(0) + corpus.block(1)
    counts = [len(d.chunk_ids) for d in docs]
    assert min(counts) >= 5 and max(counts) <= 15 and 8 <= np.mean(counts) <= 12
    vectors = np.concatenate([d.vectors for d in docs])
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    words = [len(t.split()) for d in docs for t in d.texts]
    assert min(words) >= 120 and max(words) <= 180
    assert set(docs[0].metadata) == {"dept", "lang", "year", "kind"}
    assert len({c for d in docs for c in d.chunk_ids}) == sum(counts)
    vocab = make_vocabulary(500, 1)
    assert len(set(vocab)) == 500 and all(w.isalpha() and w.islower() for w in vocab)


def _topic_cosines(corpus: SyntheticCorpus) -> tuple[float, float]:
    docs = corpus.block(0)
    same, other = [], []
    for i, a in enumerate(docs):
        for b in docs[i + 1 :]:
            (same if a.topic == b.topic else other).append(float((a.vectors @ b.vectors.T).mean()))
    return float(np.mean(same)), float(np.mean(other))


def test_clustered_vectors_cluster_and_random_do_not() -> None:
    same, other = _topic_cosines(small())
    assert same > 0.3 and abs(other) < 0.1
    same, other = _topic_cosines(small(vectors="random"))
    assert abs(same) < 0.1 and abs(other) < 0.1
    # Queries sit near their topic's centre.
    corpus = small()
    q = corpus.queries(20)
    near = [float(x.vector @ corpus.centres[x.topic]) for x in q]
    assert min(near) > 0.6


def test_exact_top_k_and_recall() -> None:
    corpus = small()
    exact = ExactIndex(corpus, 2000)
    docs = corpus.block(0)
    for doc in docs:
        exact.add(doc, range(len(doc.chunk_ids)))
    queries = np.stack([q.vector for q in corpus.queries(6)])
    ids = [c for d in docs for c in d.chunk_ids]
    matrix = np.concatenate([d.vectors for d in docs])
    brute = [[ids[j] for j in np.argsort(-(matrix @ q))[:10]] for q in queries]
    assert exact.top_k(queries, 10, block_rows=97) == brute
    dept = 2
    filtered = exact.top_k(queries, 10, dept=dept)
    owners = {c: d for d in docs for c in d.chunk_ids}
    assert all(owners[c].metadata["dept"] == f"d{dept}" for row in filtered for c in row)
    # A rewritten document: its new ids replace the old ones.
    new = corpus.version(docs[0].index, 1)
    exact.replace(new)
    assert exact.chunk_id(0) == new.chunk_ids[0]
    assert recall_at_k(brute, brute) == 1.0
    assert recall_at_k([["a", "b", "x"]], [["a", "b", "c", "d"]], 10) == pytest.approx(0.5)
    assert recall_at_k([["a"]], [["a", "b"]], 1) == 1.0


def test_percentiles_and_sizes() -> None:
    assert ms([0.001, 0.002, 0.003, 0.004, 0.005], 50) == 3.0
    assert ms([0.001, 0.002], 99) == pytest.approx(1.99)
    assert ms([], 50) is None
    assert parse_sizes("100000, 10000,1e6,10000") == [10_000, 100_000, 1_000_000]


def test_fill_bound() -> None:
    assert fill_bound({"bench": 0.95, "sparse": 0.5}, {"index": 1, "sparse": 2}, 4, 2)[0] == "bench"
    bound, detail = fill_bound({"bench": 0.3, "sparse": 0.5}, {"index": 1, "sparse": 2}, 4, 2)
    assert bound == "sparse" and "0.50 s on sparse" in detail
    assert fill_bound({"bench": 0.3}, {"index": 3, "sparse": 2}, 4, 2)[0] == "index"


def test_disk_usage(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x").write_bytes(b"1" * 5000)
    (tmp_path / "y").write_bytes(b"2" * 10)
    os_link = tmp_path / "z"
    os_link.hardlink_to(tmp_path / "y")
    usage = disk_usage(tmp_path)
    assert (usage.apparent_bytes, usage.files) == (5010, 2)


# ----- fakes of the stores and the gateway, in memory -----


class FakeIndex:
    def __init__(self, shard: int, shards: int) -> None:
        self.shard, self.shards = shard, shards
        self.chunks: dict[str, tuple[str, np.ndarray]] = {}
        self.dept: dict[str, str] = {}

    async def ReplaceDocuments(self, request: index_pb2.ReplaceDocumentsRequest, timeout: float = 0) -> Any:
        for doc in request.documents:
            assert document_shard(doc.doc_id, self.shards) == self.shard
            keep = set(doc.keep_chunk_ids) | {c.chunk_id for c in doc.upserts}
            for chunk_id in [c for c, (d, _) in self.chunks.items() if d == doc.doc_id and c not in keep]:
                del self.chunks[chunk_id]
            for chunk in doc.upserts:
                self.chunks[chunk.chunk_id] = (doc.doc_id, np.array(chunk.vector.values, dtype=np.float32))
            self.dept[doc.doc_id] = doc.source.metadata["dept"]
        return index_pb2.ReplaceDocumentsResponse()

    async def Search(self, request: index_pb2.SearchRequest, timeout: float = 0) -> Any:
        query = np.array(request.vector.values, dtype=np.float32)
        wanted = request.filter.clauses[0].values[0] if request.filter.clauses else None
        scored = [
            (float(v @ query), c, d)
            for c, (d, v) in self.chunks.items()
            if wanted is None or self.dept[d] == wanted
        ]
        scored.sort(reverse=True)
        hits = [index_pb2.SearchHit(chunk_id=c, doc_id=d, score=s) for s, c, d in scored[: request.top_k]]
        return index_pb2.SearchResponse(hits=hits, shard=self.shard)

    async def GetStats(self, request: index_pb2.GetStatsRequest, timeout: float = 0) -> Any:
        return index_pb2.GetStatsResponse(
            collection=request.collection,
            chunks=len(self.chunks),
            index_type="flat",
            dimension=32,
            shard=self.shard,
            shard_count=self.shards,
        )

    async def Snapshot(self, request: index_pb2.SnapshotRequest, timeout: float = 0) -> Any:
        return index_pb2.SnapshotResponse(sequence=1, uploaded=True)


class FakeSparse:
    def __init__(self) -> None:
        self.chunks: dict[str, str] = {}

    async def ReplaceDocuments(self, request: sparse_pb2.ReplaceDocumentsRequest, timeout: float = 0) -> Any:
        for doc in request.documents:
            keep = set(doc.keep_chunk_ids) | {c.chunk_id for c in doc.upserts}
            for chunk_id in [c for c, d in self.chunks.items() if d == doc.doc_id and c not in keep]:
                del self.chunks[chunk_id]
            self.chunks.update({c.chunk_id: doc.doc_id for c in doc.upserts})
        return sparse_pb2.ReplaceDocumentsResponse()


class FakeGateway:
    async def Search(self, request: gateway_pb2.SearchRequest, timeout: float = 0) -> Any:
        assert not request.rerank and request.max_variations == 1
        dept = request.filter.clauses[0].values[0] if request.filter.clauses else "d0"
        results = [gateway_pb2.SearchResult(chunk_id=f"{i:032x}", metadata={"dept": dept}) for i in range(10)]
        return gateway_pb2.SearchResponse(results=results)


class FakeStack:
    components: dict[str, Any] = {}

    def kill(self, name: str) -> None:
        pass

    async def start_async(self, name: str) -> None:
        pass


def fake_mesh(index: list[FakeIndex]) -> Mesh:
    mesh = Mesh.__new__(Mesh)
    mesh.gateway = FakeGateway()  # type: ignore[assignment]
    mesh.index = index  # type: ignore[assignment]
    mesh.index_names = [f"index-{i}" for i in range(len(index))]
    mesh.sparse = []
    mesh.sparse_names = []
    return mesh


def test_a_size_line_has_every_field() -> None:
    corpus = small()
    exact = ExactIndex(corpus, 2000)
    index = [FakeIndex(0, 2), FakeIndex(1, 2)]
    sparse = FakeSparse()
    filler = Filler(corpus, exact, index, [sparse], batch_docs=20, progress=False)  # type: ignore[list-item]
    asyncio.run(filler.fill(333))  # ends inside a document
    stats = asyncio.run(filler.fill(1200))  # sends its rest with the first chunks kept
    assert sum(len(i.chunks) for i in index) == len(sparse.chunks) == 1200 == exact.size
    mesh = fake_mesh(index)
    stack: Any = FakeStack()
    queries = corpus.queries(8)
    line = fill_line(
        1200, filler, stats, {"bench": 0.2}, [{"chunks": "1200", "indexType": "flat"}], 1, "clustered", 3
    )
    line.update(asyncio.run(measure_searches(mesh, corpus, exact, queries, 16)))
    assert line["recall_at_10"] == 1.0 and line["recall_at_10_filtered"] == 1.0  # the fake is exact
    assert line["filtered_wrong_results"] == 0
    ck = asyncio.run(checkpoint(stack, mesh, filler, 5))
    assert ck["checkpoint_changed_chunks"] >= 1000 or ck["checkpoint_changed_chunks"] == 1200
    assert sum(len(i.chunks) for i in index) == 1200  # rewritten documents keep their chunk count
    after = asyncio.run(measure_searches(mesh, corpus, exact, queries, 16))
    assert after["recall_at_10"] == 1.0  # the exact index follows the rewritten vectors
    line.update(ck)
    line.update(asyncio.run(restart(stack, mesh, "size", queries[0].vector)))
    footprint = {
        f"{kind}_{what}_bytes_per_chunk": 1.0 for kind in ("index", "sparse") for what in ("rss", "disk")
    }
    line.update(footprint)
    assert missing_fields(line) == []
    text = json.dumps(line, sort_keys=True)
    assert "\n" not in text and set(json.loads(text)) >= set(REQUIRED_FIELDS)
    assert "| 1,200 |" in markdown_table([line], (("chunks", "chunks"),))


def test_run_load_cycles_items() -> None:
    seen: list[int] = []

    async def call(x: int) -> int:
        seen.append(x)
        await asyncio.sleep(0)
        return x * 2

    run = asyncio.run(run_load(call, [1, 2, 3], 2, total=7))
    assert sorted(seen) == [1, 1, 1, 2, 2, 3, 3] and len(run.latencies_s) == 7


def test_write_doc_without_plots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.size_report as report

    monkeypatch.setattr(report, "plot", lambda lines, directory: ([], "plots skipped"))
    line = {f: 1 for f in REQUIRED_FIELDS} | {"chunks": 10_000, "fill_bound_detail": "x", "index_params": {}}
    meta = {
        "command": "python -m bench.size_bench --sizes 10000",
        "machine": {"cpus": 2, "cpu_model": "cpu", "ram_bytes": 2**34, "python": "3.11", "kernel": "6"},
        "index_shards": 2,
        "sparse_shards": 1,
        "vectors": "clustered",
        "seed": 7,
        "wall_s": 60,
        "clusters": 2000,
        "queries": 200,
        "throughput_calls": 400,
        "changed_chunks": 1000,
    }
    doc = tmp_path / "SCALE.md"
    assert write_doc([line], meta, doc, tmp_path / "scale") == ["plots skipped"]
    text = doc.read_text()
    assert "--sizes 10000" in text and "No query vector through the gateway" in text
    # A run stopped before its last size: what that size would take, from the last one's figures.
    line |= {"index_rss_bytes": 2**30, "index_rss_bytes_per_chunk": 1000.0, "index_peak_rss_mib": 2048}
    meta |= {"stopped": "time budget", "sizes": [10_000, 1_000_000]}
    write_doc([line], meta, doc, tmp_path / "scale")
    text = doc.read_text()
    assert "Projected at 1,000,000 chunks" in text and "index RSS 1.9 GiB" in text


def test_shard_names_order() -> None:
    class Comp:
        def __init__(self, name: str, kind: str, env: dict[str, str]) -> None:
            self.name, self.kind, self.env = name, kind, env

    stack: Any = type("S", (), {})()
    stack.components = {
        "index-1": Comp("index-1", "index", {"RAGMESH_INDEX_SHARD": "1"}),
        "index-0": Comp("index-0", "index", {"RAGMESH_INDEX_SHARD": "0"}),
        "index-0-2": Comp("index-0-2", "index", {"RAGMESH_INDEX_SHARD": "0"}),
        "sparse": Comp("sparse", "sparse", {}),
    }
    assert shard_names(stack, "index", "RAGMESH_INDEX_SHARD") == ["index-0", "index-1"]
    assert shard_names(stack, "sparse", "RAGMESH_SPARSE_SHARD") == ["sparse"]
