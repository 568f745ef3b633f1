"""bench/accel_standin.py and bench/tier_scaling.py, the fast parts: the device model (batches, no
CPU), the stand-in contracts served in process, and the bench's bookkeeping."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from grpc import aio

from bench.accel_standin import (
    Device,
    DeviceModel,
    Running,
    build_spec,
    hashed_vector,
    model_sha256,
    overlap_score,
)
from bench.tier_scaling import Window, load_docs, machine_cpu, parse_args, print_tables
from meshkit.rpc.server import start_service
from meshkit.settings import MeshSettings
from ragmesh.embedder.v1 import embedder_pb2, embedder_pb2_grpc
from ragmesh.reranker.v1 import reranker_pb2, reranker_pb2_grpc


def test_a_batch_costs_a_fixed_part_and_a_part_per_item() -> None:
    model = DeviceModel(fixed_ms=40.0, per_item_ms=0.5, max_batch=64, slowdown=2.0)
    assert model.batch_seconds(10) == pytest.approx((40 + 5) * 2 / 1000)
    assert model.peak_items_per_s() == pytest.approx(64 / ((40 + 32) * 2 / 1000))


async def test_calls_that_wait_for_the_device_share_the_next_batch_and_cost_no_cpu() -> None:
    device = Device(DeviceModel(fixed_ms=60.0, per_item_ms=1.0, max_batch=64, window_ms=0.0))
    await device.start()
    try:
        started, cpu = time.monotonic(), time.process_time()
        first = asyncio.create_task(device.run(["a", "b"], "k"))
        await asyncio.sleep(0.02)  # the first batch is running: the next calls queue behind it
        await asyncio.gather(first, *(device.run(["a", "b"], "k") for _ in range(5)))
        elapsed = time.monotonic() - started
        # One batch alone, then the five that queued behind it together: two batches, not six.
        assert device.batches == 2
        assert elapsed == pytest.approx(0.062 + 0.070, abs=0.08)
        assert time.process_time() - cpu < 0.05
        # More items than a batch holds: split, one batch after the other.
        before = device.batches
        await device.run([str(i) for i in range(100)], "k")
        assert device.batches - before == 2
    finally:
        await device.stop()


def test_hashed_vectors_are_unit_length_deterministic_and_lexical() -> None:
    a = hashed_vector("Vitamin D and bone fractures in elderly women", 384)
    assert a.shape == (384,) and a.dtype == np.float32
    assert float(np.linalg.norm(a)) == pytest.approx(1.0, abs=1e-5)
    assert np.array_equal(a, hashed_vector("Vitamin D and bone fractures in elderly women", 384))
    near = hashed_vector("bone fractures and vitamin D", 384)
    far = hashed_vector("quantum chromodynamics of gluons", 384)
    assert float(a @ near) > float(a @ far) + 0.3
    # No word of three letters: still a unit vector, still the same for the same text.
    odd = hashed_vector("1 2", 384)
    assert float(np.linalg.norm(odd)) == pytest.approx(1.0) and np.array_equal(odd, hashed_vector("1 2", 384))


def test_overlap_scores_are_log_odds_of_the_query_words_found() -> None:
    query = {"vitamin", "bone"}
    assert overlap_score(query, "Vitamin supplements and BONE density") == 4.0
    assert overlap_score(query, "bone marrow") == 0.0
    assert overlap_score(query, "nothing here") == -4.0
    assert overlap_score(set(), "anything") == -4.0


async def test_a_stand_in_serves_both_contracts_with_one_identity() -> None:
    spec, device = build_spec("both", DeviceModel(fixed_ms=5.0, per_item_ms=0.1), dimension=64)
    running = await start_service(spec, MeshSettings(host="127.0.0.1", port=0))
    try:
        async with aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            embedder = embedder_pb2_grpc.EmbedderServiceStub(channel)
            reply = await embedder.Embed(
                embedder_pb2.EmbedRequest(texts=["bone density", "tides"]), timeout=5
            )
            assert [len(v.values) for v in reply.vectors] == [64, 64]
            assert (reply.model, reply.model_sha256) == ("accel-standin-hash-64", model_sha256(64))
            info = await embedder.GetModelInfo(embedder_pb2.GetModelInfoRequest(), timeout=5)
            assert (info.dimension, info.model_sha256) == (64, model_sha256(64))

            reranker = reranker_pb2_grpc.RerankerServiceStub(channel)
            passages = [
                reranker_pb2.Passage(id="a", text="ocean tides and the moon"),
                reranker_pb2.Passage(id="b", text="bone density in vitamin trials"),
                reranker_pb2.Passage(id="c", text="vitamin intake"),
            ]
            request = reranker_pb2.RerankRequest(query="vitamin bone density", passages=passages)
            ranked = await reranker.Rerank(request, timeout=5)
            assert [r.id for r in ranked.results] == ["b", "c", "a"]
            assert (ranked.scored, ranked.fallback) == (3, False)
            strict = reranker_pb2.RerankRequest(
                query="vitamin", passages=passages, min_score=10.0, fallback_count=2
            )
            fallback = await reranker.Rerank(strict, timeout=5)
            assert fallback.fallback and [r.id for r in fallback.results] == ["a", "b"]
            with pytest.raises(aio.AioRpcError) as refused:
                await reranker.Rerank(reranker_pb2.RerankRequest(query="q"), timeout=5)
            assert refused.value.code().name == "INVALID_ARGUMENT"
        assert device.batches == 3  # the embed and the two reranks that reached the device
    finally:
        await running.stop(0)


def test_roles_serve_their_own_contract_only() -> None:
    embedder, _ = build_spec("embedder", DeviceModel())
    reranker, _ = build_spec("reranker", DeviceModel())
    assert (embedder.name, list(embedder.grpc_services)) == (
        "embedder",
        ["ragmesh.embedder.v1.EmbedderService"],
    )
    assert (reranker.name, list(reranker.grpc_services)) == (
        "reranker",
        ["ragmesh.reranker.v1.RerankerService"],
    )
    with pytest.raises(ValueError):
        build_spec("llm", DeviceModel())


def test_device_activity_between_two_scrapes() -> None:
    model = DeviceModel(fixed_ms=100.0, per_item_ms=5.0, slowdown=2.0)
    replica = Running("reranker", "r", 1, 2, model, proc=None)  # type: ignore[arg-type]
    before = {"ragmesh_standin_device_batch_size_count": 10.0, "ragmesh_standin_device_batch_size_sum": 300.0}
    after = {
        "ragmesh_standin_device_batch_size_count": 14.0,
        "ragmesh_standin_device_batch_size_sum": 500.0,
        "ragmesh_rpc_requests_total": 6.0,
    }
    # 4 batches of 200 items: (4 * 100 + 200 * 5) ms * 2 = 2.8 s of 4 s.
    assert replica.activity(before, after, 4.0) == {"calls": 6, "items_per_batch": 50.0, "utilisation": 0.7}


def test_window_reports_cpu_and_devices_between_snapshots() -> None:
    window = Window([], "Rerank", {})
    before = {"cpu": (10.0, 40.0), "pids": {"gateway": 1.0}, "devices": [], "at": 100.0}
    after = {"cpu": (13.0, 44.0), "pids": {"gateway": 2.0}, "devices": [], "at": 102.0}
    assert window.between(before, after) == {
        "machine_cpu_busy": 0.75,
        "process_cpu_cores": {"gateway": 0.5},
        "devices": [],
    }
    busy, total = machine_cpu()
    assert 0 < busy <= total


def test_documents_come_from_the_corpus_in_order(tmp_path: Path) -> None:
    lines = [{"_id": str(i), "title": f"T{i}", "text": f"text {i}"} for i in range(5)]
    (tmp_path / "corpus.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    docs = load_docs(tmp_path, 3)
    assert [d.doc_id for d in docs] == ["0", "1", "2"]
    assert docs[0].content == b"text 0"


def test_tables_print_every_phase(capsys: pytest.CaptureFixture[str]) -> None:
    device = {"calls": 10, "items_per_batch": 50.0, "utilisation": 0.9}
    search: dict[str, Any] = {
        "concurrency": 4,
        "searches_per_s": 4.0,
        "p50_ms": 800.0,
        "p99_ms": 1200.0,
        "errors": {},
        "machine_cpu_busy": 0.5,
        "process_cpu_cores": {"gateway": 0.1},
        "devices": [device],
    }
    points = [
        {"phase": "search", "replicas": 1, "balancing": "least_outstanding", "ratio_to_1": 1.0, **search},
        {
            "phase": "ingest",
            "replicas": 1,
            "chunks": 200,
            "seconds": 50.0,
            "chunks_per_s": 4.0,
            "ratio_to_1": 1.0,
        },
        {
            "phase": "ingest",
            "replicas": 8,
            "embedder": "fast",
            "chunks": 200,
            "seconds": 20.0,
            "chunks_per_s": 10.0,
        },
        {
            "phase": "outlier",
            "replicas": 4,
            "slowdown": 5.0,
            "balancing": "round_robin",
            "slow_replica_share": 0.25,
        }
        | search,
    ]
    print_tables(points)
    out = capsys.readouterr().out
    assert "| 1 | 4 | 4.0 | 1.00x | 800 | 1200 | 90% | 50% | 0.10 cores |" in out
    assert "| 8 fast (the write path's ceiling) | 200 | 20.0 | 10.0 | - |" in out
    assert "| round_robin (x5) | 4.0 | 800 | 1200 | 25% | - |" in out


def test_defaults() -> None:
    args = parse_args([])
    assert (args.counts, args.per_replica, args.slowdown) == ("1,2,4,8", 4, 5.0)
