"""bench/peer_bench.py: the CPU-side logic (goals and ratios, ABBA order, the docs subset, the
embedding cache, the load harness) without the peers; each peer built on a few SciFact documents
when its package (the bench extra) is installed."""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from bench.peer_bench import (
    HAYSTACK,
    LANCEDB,
    RAGMESH,
    cache_key,
    cached_vectors,
    comparison,
    doc_subset,
    load_chunks,
    main,
    ndcg_scores,
    pass_order,
    system_figures,
)
from bench.peer_load import Cursor, run_threads
from bench.peers import build_haystack, build_lancedb
from bench.search_bench import Answer, LoadRun
from meshkit.settings import EmbedderSettings
from ragmesh_cli.datasets import load_dataset
from ragmesh_cli.rerankerbuild.mining import Passage
from services.embedder.model import EmbeddingModel, TextKind

SCIFACT = Path(__file__).resolve().parents[1] / ".." / "shared" / "bench" / "scifact"
needs_scifact = pytest.mark.skipif(not SCIFACT.is_dir(), reason=f"no SciFact at {SCIFACT}")


def figures(p50_c1: float, throughput_c8: float) -> dict[str, float]:
    return {
        "p50_ms_c1": p50_c1,
        "p95_ms_c1": 2 * p50_c1,
        "p50_ms_c8": 4 * p50_c1,
        "searches_per_s_c8": throughput_c8,
    }


# ---------------------------------------------------------------------------- goals and ratios


def test_ratios_are_against_the_faster_peer_of_each_measure() -> None:
    # haystack has the lower p50, lancedb the higher throughput: each ratio takes its own best.
    rows = {RAGMESH: figures(30.0, 40.0), HAYSTACK: figures(25.0, 20.0), LANCEDB: figures(50.0, 50.0)}
    out = comparison(rows, {RAGMESH: 0.70, HAYSTACK: 0.68, LANCEDB: 0.71})
    assert out["fastest_peer_p50"] == HAYSTACK
    assert out["fastest_peer_throughput"] == LANCEDB
    assert out["p50_ratio_vs_fastest_peer"] == pytest.approx(1.2)
    assert out["throughput_ratio_c8_vs_fastest_peer"] == pytest.approx(0.8)
    assert out["goals"] == {
        "ndcg10_ge_every_peer": False,  # lancedb's 0.71 beats 0.70
        "p50_le_1_5x_fastest_peer": True,
        "throughput_c8_ge_fastest_peer": False,
    }
    assert out["ndcg10"] == {RAGMESH: 0.70, HAYSTACK: 0.68, LANCEDB: 0.71}
    assert "\n" not in json.dumps(out)  # printed as the last line


def test_goals_met_and_p50_goal_boundary() -> None:
    rows = {RAGMESH: figures(30.0, 60.0), HAYSTACK: figures(20.0, 10.0), LANCEDB: figures(40.0, 50.0)}
    out = comparison(rows, {RAGMESH: 0.72, HAYSTACK: 0.70, LANCEDB: 0.72})
    assert out["p50_ratio_vs_fastest_peer"] == pytest.approx(1.5)
    assert out["goals"] == {
        "ndcg10_ge_every_peer": True,  # a tie counts as not losing
        "p50_le_1_5x_fastest_peer": True,
        "throughput_c8_ge_fastest_peer": True,
    }


def test_one_peer_missing_compares_with_the_other() -> None:
    out = comparison(
        {RAGMESH: figures(30.0, 40.0), LANCEDB: figures(20.0, 50.0)}, {RAGMESH: 0.7, LANCEDB: 0.6}
    )
    assert (out["fastest_peer_p50"], out["fastest_peer_throughput"]) == (LANCEDB, LANCEDB)
    assert out["goals"]["ndcg10_ge_every_peer"] is True


def test_no_ratios_without_ragmesh_or_without_peers() -> None:
    peers_only = comparison({HAYSTACK: figures(20.0, 10.0)}, {HAYSTACK: 0.6})
    assert peers_only["p50_ratio_vs_fastest_peer"] is None and peers_only["goals"] is None
    assert peers_only["p50_ms_c1"] == {HAYSTACK: 20.0}
    mesh_only = comparison({RAGMESH: figures(20.0, 10.0)}, {RAGMESH: 0.6})
    assert mesh_only["throughput_ratio_c8_vs_fastest_peer"] is None


def test_figures_from_runs() -> None:
    runs = {
        (RAGMESH, 1): [LoadRun([0.010] * 50, 0.5, []), LoadRun([0.030] * 50, 1.5, [])],
        (RAGMESH, 8): [LoadRun([0.080] * 100, 1.0, [])],
    }
    rows = system_figures(runs)[RAGMESH]
    assert rows["p50_ms_c1"] == pytest.approx(20.0)  # both passes pooled
    assert rows["searches_c1"] == 100
    assert rows["searches_per_s_c8"] == pytest.approx(100.0)
    assert rows["p50_ms_c8"] == pytest.approx(80.0)


def test_ndcg_scores_per_query() -> None:
    qrels = {"q1": {"d1": 1}, "q2": {"d9": 1}}
    answers = [Answer(("d1", "d2"), False), Answer(("d2", "d3"), False)]
    assert ndcg_scores(answers, ["q1", "q2"], qrels) == {"q1": pytest.approx(1.0), "q2": 0.0}


# ---------------------------------------------------------------------------- ABBA order


def test_pass_order_is_abba_over_every_cell() -> None:
    names = [RAGMESH, HAYSTACK, LANCEDB]
    first, second = pass_order(0, names), pass_order(1, names)
    assert first == [(n, c) for c in (1, 8) for n in names]
    assert second == first[::-1]
    assert pass_order(2, names) == first
    # Over an A-B pair of passes every cell sits at the same mean position: drift falls evenly.
    positions: Counter[tuple[str, int]] = Counter()
    for order in (first, second):
        for i, cell in enumerate(order):
            positions[cell] += i
    assert len(set(positions.values())) == 1


# ---------------------------------------------------------------------------- docs subset


def test_doc_subset_keeps_every_gold_document() -> None:
    corpus = [f"d{i}" for i in range(10)]
    qrels = {"q1": {"d7": 1}, "q2": {"d9": 1, "missing": 1}}
    assert doc_subset(corpus, qrels, 4) == ["d0", "d1", "d7", "d9"]
    assert doc_subset(corpus, qrels, 0) == corpus
    # Fewer than the gold documents asked for: the gold ones all stay.
    assert doc_subset(corpus, qrels, 1) == ["d7", "d9"]
    assert doc_subset(corpus, qrels, 100) == corpus


@needs_scifact
def test_scifact_subset_chunks_hold_the_gold_documents() -> None:
    dataset = load_dataset(SCIFACT, "test", 5)
    chunks, documents = load_chunks(dataset, 30)
    assert documents == 30
    gold = {doc for rels in dataset.qrels.values() for doc in rels}
    assert gold <= {c.doc_id for c in chunks}


# ---------------------------------------------------------------------------- embedding cache


def test_cache_key_follows_corpus_model_and_passage_settings() -> None:
    settings = EmbedderSettings()
    key = cache_key("a" * 64, "b" * 64, settings)
    assert key == cache_key("a" * 64, "b" * 64, EmbedderSettings())
    assert key != cache_key("c" * 64, "b" * 64, settings)
    assert key != cache_key("a" * 64, "c" * 64, settings)
    prefixed = settings.model_copy(update={"embedder_passage_prefix": "passage: "})
    assert key != cache_key("a" * 64, "b" * 64, prefixed)


@pytest.fixture(scope="module")
def model() -> EmbeddingModel:
    return EmbeddingModel.load(EmbedderSettings())


def test_cached_vectors_embed_each_chunk_once(tmp_path: Path, model: EmbeddingModel) -> None:
    embedded: list[str] = []

    def embed(texts: list[str]) -> np.ndarray:
        embedded.extend(texts)
        return model.embed(texts, TextKind.PASSAGE)[0]

    chunks = [Passage(f"c{i}", f"d{i}", text) for i, text in enumerate(["red apples", "blue sky", "gRPC"])]
    path = tmp_path / "cache.npz"
    first, fresh = cached_vectors(path, chunks, embed)
    assert fresh == 3 and embedded == ["red apples", "blue sky", "gRPC"]
    np.testing.assert_allclose(first, model.embed(["red apples", "blue sky", "gRPC"], TextKind.PASSAGE)[0])
    again, fresh = cached_vectors(path, chunks[::-1], embed)
    assert fresh == 0 and len(embedded) == 3
    np.testing.assert_array_equal(again, first[::-1])
    more = [*chunks, Passage("c3", "d3", "green grass")]
    _, fresh = cached_vectors(path, more, embed)
    assert fresh == 1 and embedded[-1] == "green grass"
    assert not list(tmp_path.glob("*.partial*"))


# ---------------------------------------------------------------------------- load harness


def test_cursor_hands_each_query_out_once_across_threads() -> None:
    cursor = Cursor(500, None)
    taken: list[int] = []

    def client() -> None:
        while (i := cursor.take()) is not None:
            taken.append(i)

    threads = [threading.Thread(target=client) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(taken) == list(range(500))


def test_cursor_cycles_until_the_deadline() -> None:
    cursor = Cursor(3, time.perf_counter() + 0.05)
    taken = [cursor.take() for _ in range(7)]
    assert taken == [0, 1, 2, 0, 1, 2, 0]
    time.sleep(0.06)
    assert cursor.take() is None


def test_run_threads_answers_every_query_in_order() -> None:
    queries = [f"q{i}" for i in range(40)]
    run = run_threads(lambda q: [q, "other"], queries, 8, None)
    assert [a.chunk_ids[0] for a in run.answers] == queries
    assert len(run.latencies_s) == 40
    timed = run_threads(lambda q: [q], queries, 2, 0.05)
    assert timed.answers == [] and len(timed.latencies_s) > 0 and timed.wall_s >= 0.05


def test_run_threads_fails_when_a_search_fails() -> None:
    def search(query: str) -> list[str]:
        if query == "q7":
            raise RuntimeError("peer broke")
        return [query]

    with pytest.raises(RuntimeError, match="peer broke"):
        run_threads(search, [f"q{i}" for i in range(20)], 4, None)


# ---------------------------------------------------------------------------- the peers


def installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


@pytest.fixture(scope="module")
def small_corpus(model: EmbeddingModel) -> tuple[list[Passage], np.ndarray]:
    if not SCIFACT.is_dir():
        pytest.skip(f"no SciFact at {SCIFACT}")
    chunks, _ = load_chunks(load_dataset(SCIFACT, "test", 1), 50)
    return chunks, model.embed([c.text for c in chunks], TextKind.PASSAGE)[0]


def title_queries(chunks: list[Passage]) -> list[tuple[str, str]]:
    """(a document's title, the document) for a few documents: the title opens each chunk."""
    firsts = {c.doc_id: c.text.split("\n\n", 1)[0] for c in chunks}
    return [(title, doc) for doc, title in list(firsts.items())[:5] if len(title) > 20]


@pytest.mark.skipif(not installed("haystack"), reason="haystack-ai not installed (the bench extra)")
def test_haystack_finds_a_document_by_its_title(
    model: EmbeddingModel, small_corpus: tuple[list[Passage], np.ndarray]
) -> None:
    chunks, vectors = small_corpus
    search = build_haystack(model, chunks, vectors, 50)
    for title, doc in title_queries(chunks):
        found = search(title)
        assert found[0] == doc and len(found) == len(set(found)) <= 10


@pytest.mark.skipif(not installed("lancedb"), reason="lancedb not installed (the bench extra)")
def test_lancedb_finds_a_document_by_its_title(
    tmp_path: Path, model: EmbeddingModel, small_corpus: tuple[list[Passage], np.ndarray]
) -> None:
    chunks, vectors = small_corpus
    search = build_lancedb(model, chunks, vectors, 50, tmp_path / "db")
    for title, doc in title_queries(chunks):
        found = search(title)
        assert found[0] == doc and len(found) == len(set(found)) <= 10


@needs_scifact
@pytest.mark.skipif(not installed("lancedb"), reason="lancedb not installed (the bench extra)")
def test_main_ends_with_one_json_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.json"
    main(
        [
            *("--dataset", str(SCIFACT), "--systems", f"{RAGMESH},{LANCEDB}", "--limit", "3", "--docs", "20"),
            *("--seconds", "0.4", "--passes", "2", "--cache-dir", str(tmp_path), "--out", str(out), "--json"),
        ]
    )
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["bench"] == "peer"
    assert set(last["ndcg10"]) == {LANCEDB}
    assert RAGMESH in last["skipped"]  # --docs: the mesh holds the whole corpus
    assert last["p50_ratio_vs_fastest_peer"] is None
    assert last["ragmesh_degradations"] == {}
    report = json.loads(out.read_text())
    assert report["claims"] == 3 and report["corpus"]["documents"] == 20
