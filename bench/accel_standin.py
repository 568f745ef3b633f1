"""A stand-in accelerator replica: the embedder and reranker contracts served by a model of a GPU
that spends no CPU, to measure how those tiers scale with replicas on a machine without one.

    .venv/bin/python -m bench.accel_standin --role reranker --port 50100 --fixed-ms 40 --per-item-ms 0.5
    .venv/bin/python -m bench.accel_standin --role embedder --port 50101 --slowdown 5   # a slow replica

It is started like every service (meshkit.rpc.server.run_service): gRPC health (SERVING once the
device is up), reflection, the server interceptor (request ids, access log, status metrics), a
/metrics port (--metrics-port), graceful shutdown on SIGTERM. RAGMESH_* settings apply (log
level, limits); --port and --metrics-port win over RAGMESH_PORT / RAGMESH_METRICS_PORT.

**The device.** One batch at a time, as one GPU runs one model launch at a time: a batch of n items
(texts to embed, passages to rerank) takes ``(fixed_ms + per_item_ms * n) * slowdown``, spent
asleep in the device thread, so it costs no CPU. Calls that arrive while a batch runs queue and
go into the next batch together, up to --max-batch items (meshkit.inference.batching.MicroBatcher,
the batcher of the real embedder and reranker), so one replica's throughput is bounded like a
GPU's: at most ``max_batch / (fixed + per_item * max_batch)`` items per second, reached only when
enough calls queue. What the process does spend CPU on is what a real replica also does: gRPC,
protobuf, the hashing below.

**Embedder contract.** Vectors by feature hashing: each word of three letters or more adds +-1 to
dimension crc32(word) % --dimension, L2-normalised. Deterministic per text and the same on every
replica, and lexical enough for a search to find documents that share its words. Every replica
reports one identity (model ``accel-standin-hash-<dimension>``, sha256 of that name), so a
collection built through one replica is searched through any (the gateway and ingestion refuse
vectors of another embedder than the one a collection records, meshkit.domain.collections). The
collection must be built with the stand-in: searching a collection of the real embedder's is
refused (FAILED_PRECONDITION), as it should be.

**Reranker contract.** Score (log-odds) = 8 * (share of the query's words in the passage) - 4, then
the real reranker's selection rules (services.reranker.selection: threshold, fallback, top_n).
There is no score cache: every pair costs device time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import itertools
import os
import re
import subprocess
import sys
import time
import urllib.request
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from grpc import aio
from prometheus_client.parser import text_string_to_metric_families

from meshkit.core.errors import invalid_argument, resource_exhausted
from meshkit.inference.batching import MicroBatcher
from meshkit.rpc.client import check_health
from meshkit.rpc.identity import EXTRACTOR, GATEWAY, INGESTION_WORKER, OPS, Callers, allow
from meshkit.rpc.server import ServiceSpec, run_service
from meshkit.settings import MeshSettings
from ragmesh.common.v1 import common_pb2
from ragmesh.embedder.v1 import embedder_pb2, embedder_pb2_grpc
from ragmesh.reranker.v1 import reranker_pb2, reranker_pb2_grpc
from ragmesh_cli.procutil import free_ports, spawn, terminate
from services.reranker.selection import select

ROLES = ("embedder", "reranker", "both")
REPO_ROOT = Path(__file__).resolve().parents[1]
EMBEDDER_SERVICE = embedder_pb2.DESCRIPTOR.services_by_name["EmbedderService"].full_name
RERANKER_SERVICE = reranker_pb2.DESCRIPTOR.services_by_name["RerankerService"].full_name
PROVIDER = "accel-standin"
WORD = re.compile(r"[^\W_]{3,}")
MAX_TEXTS = 1024
MAX_TEXT_CHARS = 100_000
MAX_PASSAGES = 200
DEFAULT_MIN_SCORE = -5.0
DEFAULT_FALLBACK = 20


@dataclass(frozen=True)
class DeviceModel:
    """Service time of one batch: (fixed_ms + per_item_ms * items) * slowdown."""

    fixed_ms: float = 40.0
    per_item_ms: float = 0.5
    max_batch: int = 64
    window_ms: float = 2.0
    slowdown: float = 1.0
    max_queued: int = 100_000

    def batch_seconds(self, items: int) -> float:
        return (self.fixed_ms + self.per_item_ms * items) * self.slowdown / 1000.0

    def peak_items_per_s(self) -> float:
        """The most items a second one replica can do: full batches back to back."""
        return self.max_batch / self.batch_seconds(self.max_batch)


class Device:
    """One accelerator: batches of items, one at a time, each asleep for its service time."""

    def __init__(self, model: DeviceModel) -> None:
        self.model = model
        self.busy_s = 0.0
        self._batcher: MicroBatcher[str, str] = MicroBatcher(
            "standin_device",
            self._run,
            max_batch=model.max_batch,
            window_s=model.window_ms / 1000.0,
            max_queued=model.max_queued,
            unit="items",
        )

    def _run(self, items: list[str], _key: str) -> tuple[np.ndarray]:
        # The batcher's own thread: the device is busy, the CPU is not.
        seconds = self.model.batch_seconds(len(items))
        end = time.perf_counter() + seconds
        time.sleep(seconds)
        while (left := end - time.perf_counter()) > 0:
            time.sleep(left)
        self.busy_s += seconds
        return (np.zeros(len(items), dtype=np.uint8),)

    async def start(self) -> None:
        await self._batcher.start()

    async def stop(self) -> None:
        await self._batcher.stop()

    async def run(self, items: Sequence[str], key: str) -> None:
        """Returns once the batches holding ``items`` have run (calls under one key share batches)."""
        await self._batcher.submit(items, key)

    @property
    def batches(self) -> int:
        return self._batcher.model_runs


def model_name(dimension: int) -> str:
    return f"accel-standin-hash-{dimension}"


def model_sha256(dimension: int) -> str:
    return hashlib.sha256(model_name(dimension).encode()).hexdigest()


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def hashed_vector(text: str, dimension: int) -> np.ndarray:
    """The stand-in embedding of ``text``: hashed words, L2-normalised (a hashed unit vector of the
    whole text when it has no word)."""
    vector = np.zeros(dimension, dtype=np.float32)
    found = words(text)
    if found:
        hashes = np.fromiter((zlib.crc32(w.encode()) for w in found), dtype=np.uint64, count=len(found))
        signs = np.where(hashes & (1 << 31), 1.0, -1.0).astype(np.float32)
        np.add.at(vector, (hashes % dimension).astype(np.int64), signs)
    norm = float(np.linalg.norm(vector))
    if norm == 0.0:
        vector[zlib.crc32(text.encode()) % dimension] = 1.0
        return vector
    return vector / norm


def overlap_score(query_words: set[str], text: str) -> float:
    """Log-odds from the share of the query's words the passage holds: -4 (none) to 4 (all)."""
    if not query_words:
        return -4.0
    return 8.0 * len(query_words & set(words(text))) / len(query_words) - 4.0


def check_texts(texts: Sequence[str]) -> None:
    if not texts:
        raise invalid_argument("texts must hold at least one text")
    if len(texts) > MAX_TEXTS:
        raise resource_exhausted(f"{len(texts)} texts in one call; the limit is {MAX_TEXTS}")
    for i, text in enumerate(texts):
        if not text.strip():
            raise invalid_argument(f"texts[{i}] is empty")
        if len(text) > MAX_TEXT_CHARS:
            raise resource_exhausted(f"texts[{i}] has {len(text)} characters; the limit is {MAX_TEXT_CHARS}")


def check_rerank(request: reranker_pb2.RerankRequest) -> None:
    if not request.query.strip():
        raise invalid_argument("query is empty")
    if not request.passages:
        raise invalid_argument("passages must hold at least one passage")
    if len(request.passages) > MAX_PASSAGES:
        raise resource_exhausted(f"{len(request.passages)} passages; the limit is {MAX_PASSAGES}")
    ids = [p.id for p in request.passages]
    if any(not i for i in ids) or len(set(ids)) != len(ids):
        raise invalid_argument("passage ids must be non-empty and unique")
    for i, passage in enumerate(request.passages):
        if not passage.text.strip():
            raise invalid_argument(f"passages[{i}].text is empty")


class StandinEmbedder(embedder_pb2_grpc.EmbedderServiceServicer):
    def __init__(self, device: Device, dimension: int) -> None:
        self.device = device
        self.dimension = dimension
        self.model = model_name(dimension)
        self.sha256 = model_sha256(dimension)

    async def Embed(
        self, request: embedder_pb2.EmbedRequest, context: aio.ServicerContext
    ) -> embedder_pb2.EmbedResponse:
        texts = list(request.texts)
        check_texts(texts)
        if request.kind not in embedder_pb2.TextKind.values():
            raise invalid_argument(f"unknown kind {request.kind}")
        await self.device.run(texts, "embed")
        return embedder_pb2.EmbedResponse(
            vectors=[common_pb2.Vector(values=hashed_vector(t, self.dimension).tolist()) for t in texts],
            model=self.model,
            model_sha256=self.sha256,
        )

    async def GetModelInfo(
        self, request: embedder_pb2.GetModelInfoRequest, context: aio.ServicerContext
    ) -> embedder_pb2.GetModelInfoResponse:
        return embedder_pb2.GetModelInfoResponse(
            model=self.model,
            dimension=self.dimension,
            max_tokens=256,
            provider=PROVIDER,
            max_batch=MAX_TEXTS,
            model_sha256=self.sha256,
        )


class StandinReranker(reranker_pb2_grpc.RerankerServiceServicer):
    def __init__(self, device: Device) -> None:
        self.device = device
        self.model = "accel-standin-overlap"

    async def Rerank(
        self, request: reranker_pb2.RerankRequest, context: aio.ServicerContext
    ) -> reranker_pb2.RerankResponse:
        check_rerank(request)
        await self.device.run([p.id for p in request.passages], "rerank")
        query = set(words(request.query))
        scores = [overlap_score(query, p.text) for p in request.passages]
        chosen = select(
            scores,
            request.min_score if request.HasField("min_score") else DEFAULT_MIN_SCORE,
            request.fallback_count if request.HasField("fallback_count") else DEFAULT_FALLBACK,
            request.top_n,
        )
        return reranker_pb2.RerankResponse(
            results=[
                reranker_pb2.RerankedPassage(id=request.passages[i].id, score=scores[i], input_index=i)
                for i in chosen.order
            ],
            fallback=chosen.fallback,
            scored=len(scores),
            model=self.model,
        )

    async def GetModelInfo(
        self, request: reranker_pb2.GetModelInfoRequest, context: aio.ServicerContext
    ) -> reranker_pb2.GetModelInfoResponse:
        return reranker_pb2.GetModelInfoResponse(
            model=self.model,
            head=reranker_pb2.HEAD_SINGLE_LOGIT,
            max_tokens=512,
            max_batch=self.device.model.max_batch,
            provider=PROVIDER,
            model_sha256=hashlib.sha256(self.model.encode()).hexdigest(),
            default_min_score=DEFAULT_MIN_SCORE,
            default_fallback_count=DEFAULT_FALLBACK,
            max_passages=MAX_PASSAGES,
        )


# The callers of the contracts it stands in for (RAGMESH_SERVICE_AUTH=mtls).
_EMBEDDING = allow(GATEWAY, EXTRACTOR, INGESTION_WORKER, OPS)
EMBEDDER_CALLERS: Callers = {"Embed": _EMBEDDING, "GetModelInfo": _EMBEDDING}
RERANKER_CALLERS: Callers = {"Rerank": allow(GATEWAY, OPS), "GetModelInfo": allow(GATEWAY, OPS)}


def build_spec(role: str, model: DeviceModel, dimension: int = 384) -> tuple[ServiceSpec, Device]:
    """The service spec of a stand-in replica serving ``role`` ('both': one device for the two)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}")
    if dimension < 1:
        raise ValueError("dimension must be at least 1")
    device = Device(model)
    services: list[str] = []
    callers: dict[str, frozenset[str]] = {}
    if role in ("embedder", "both"):
        services.append(EMBEDDER_SERVICE)
        callers.update(EMBEDDER_CALLERS)
    if role in ("reranker", "both"):
        services.append(RERANKER_SERVICE)
        callers.update(RERANKER_CALLERS)
    if role == "both":
        callers["GetModelInfo"] = _EMBEDDING | RERANKER_CALLERS["GetModelInfo"]

    def register(server: aio.Server) -> None:
        if EMBEDDER_SERVICE in services:
            embedder_pb2_grpc.add_EmbedderServiceServicer_to_server(
                StandinEmbedder(device, dimension), server
            )
        if RERANKER_SERVICE in services:
            reranker_pb2_grpc.add_RerankerServiceServicer_to_server(StandinReranker(device), server)

    spec = ServiceSpec(
        name=role if role != "both" else "accel-standin",
        grpc_services=services,
        register=register,
        on_start=[device.start],
        on_stop=[device.stop],
        callers=callers,
        # Calls wait in the device queue (bounded by max_queued), not in handlers.
        max_concurrent_rpcs=4096,
        multiprocess_safe=True,
    )
    return spec, device


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--role", choices=ROLES, default="both")
    parser.add_argument("--port", type=int, default=None, help="gRPC port (default RAGMESH_PORT, 0: free)")
    parser.add_argument("--metrics-port", type=int, default=None, help="/metrics port (0: none)")
    parser.add_argument("--fixed-ms", type=float, default=DeviceModel.fixed_ms, help="cost of a batch")
    parser.add_argument("--per-item-ms", type=float, default=DeviceModel.per_item_ms, help="cost per item")
    parser.add_argument("--max-batch", type=int, default=DeviceModel.max_batch, help="items per batch")
    parser.add_argument("--window-ms", type=float, default=DeviceModel.window_ms, help="batching window")
    parser.add_argument("--slowdown", type=float, default=1.0, help="multiplies every batch's time")
    parser.add_argument("--max-queued", type=int, default=DeviceModel.max_queued, help="items waiting")
    parser.add_argument("--dimension", type=int, default=384, help="embedding dimension")
    args = parser.parse_args(argv)
    if args.fixed_ms < 0 or args.per_item_ms < 0 or args.slowdown <= 0 or args.max_batch < 1:
        parser.error("--fixed-ms and --per-item-ms must be >= 0, --slowdown > 0, --max-batch >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    overrides = {"port": args.port, "metrics_port": args.metrics_port}
    settings = MeshSettings(**{k: v for k, v in overrides.items() if v is not None})
    model = DeviceModel(
        fixed_ms=args.fixed_ms,
        per_item_ms=args.per_item_ms,
        max_batch=args.max_batch,
        window_ms=args.window_ms,
        slowdown=args.slowdown,
        max_queued=args.max_queued,
    )
    spec, _device = build_spec(args.role, model, args.dimension)
    run_service(spec, settings)


if __name__ == "__main__":
    main()


# ---------------------------------------------------------------------------- running replicas


@dataclass
class Running:
    """One stand-in replica process started by ``Standins``."""

    role: str
    name: str
    port: int
    metrics_port: int
    model: DeviceModel
    proc: subprocess.Popen[bytes]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def counters(self, method: str) -> dict[str, float]:
        """The device's batches and items so far (ragmesh_standin_device_batch_size_count and
        _sum) and the calls of ``method`` it answered (ragmesh_rpc_requests_total)."""
        device = ("ragmesh_standin_device_batch_size_count", "ragmesh_standin_device_batch_size_sum")
        out: dict[str, float] = {}
        for name, labels, value in scrape(self.metrics_url):
            if name in device or (name == "ragmesh_rpc_requests_total" and labels.get("method") == method):
                out[name] = out.get(name, 0.0) + value
        return out

    def activity(self, before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, Any]:
        """Calls answered, items per batch and the device's busy share between two ``counters``."""

        def delta(name: str) -> float:
            return after.get(name, 0.0) - before.get(name, 0.0)

        batches = delta("ragmesh_standin_device_batch_size_count")
        items = delta("ragmesh_standin_device_batch_size_sum")
        model = self.model
        busy_s = (batches * model.fixed_ms + items * model.per_item_ms) * model.slowdown / 1000
        return {
            "calls": int(delta("ragmesh_rpc_requests_total")),
            "items_per_batch": round(items / batches, 1) if batches else 0.0,
            "utilisation": round(busy_s / seconds, 3) if seconds > 0 else 0.0,
        }


def scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample a /metrics page shows."""
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


class Standins:
    """Stand-in replicas as processes of their own (logs under ``logs_dir``), for benchmarks."""

    def __init__(self, logs_dir: Path, env: Mapping[str, str] | None = None) -> None:
        self.logs_dir = logs_dir
        self.env = dict(os.environ if env is None else env)
        self.running: list[Running] = []
        self._names = itertools.count()

    def start(self, role: str, model: DeviceModel, count: int = 1, dimension: int = 384) -> list[Running]:
        """``count`` replicas of ``role``, each SERVING when this returns."""
        started: list[Running] = []
        ports = free_ports(2 * count)
        for i in range(count):
            name = f"standin-{role}-{next(self._names)}"
            argv = [
                sys.executable, "-m", "bench.accel_standin", "--role", role,
                "--port", str(ports[2 * i]), "--metrics-port", str(ports[2 * i + 1]),
                "--fixed-ms", str(model.fixed_ms), "--per-item-ms", str(model.per_item_ms),
                "--max-batch", str(model.max_batch), "--window-ms", str(model.window_ms),
                "--slowdown", str(model.slowdown), "--max-queued", str(model.max_queued),
                "--dimension", str(dimension),
            ]  # fmt: skip
            log_path = self.logs_dir / f"{name}.log"
            proc = spawn(argv, self.env, log_path, REPO_ROOT, header=f"starting {name}")
            started.append(Running(role, name, ports[2 * i], ports[2 * i + 1], model, proc))
        self.running += started
        asyncio.run(self._wait_serving(started))
        return started

    async def _wait_serving(self, replicas: Sequence[Running], timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        for replica in replicas:
            while await check_health(replica.address) != "SERVING":
                if replica.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{replica.name} did not start: see {self.logs_dir / replica.name}.log"
                    )
                await asyncio.sleep(0.1)

    def stop(self, replicas: Sequence[Running]) -> None:
        terminate([(r.proc.pid, None) for r in replicas], grace_s=5.0)
        for replica in replicas:
            with contextlib.suppress(subprocess.TimeoutExpired):
                replica.proc.wait(timeout=1)
        self.running = [r for r in self.running if r not in replicas]

    def stop_all(self) -> None:
        self.stop(list(self.running))
