"""``ragmesh loadtest SERVICE``: drive one stage of the mesh (or the gateway) through its own
contract with realistic requests, and report throughput, latency percentiles and errors by status.

    ragmesh loadtest reranker --dataset ../shared/bench/scifact --concurrency 8 --duration 30
    ragmesh loadtest gateway --dataset ../shared/bench/scifact --rate 20 --duration 60 --json
    ragmesh loadtest health --address 127.0.0.1:50057 --concurrency 32   # the driver's ceiling

Requests are built once, before the run, from a BEIR dataset (the split's judged queries; passages
are each query's relevant documents padded with other corpus documents) and sent pre-serialised;
responses are not parsed, so the driver's own cost stays small and visible (client CPU%).

Two modes. Closed loop (``--concurrency N``): N workers, each sends its next request when the last
one answers. Open loop (``--rate R``): requests are scheduled every 1/R s whatever the answers do,
and latency runs from the *scheduled* start, so a stalled server shows up in the percentiles
instead of silently slowing the driver down (coordinated omission). ``--max-outstanding`` caps the
calls in flight; a request that has to wait for a slot starts late, and the late starts and the
requests still unsent at the end are reported.

A call counts when it starts (is scheduled) inside the measured window, after ``--warmup``; its
outcome is awaited. Latency percentiles are over successful calls; failures are counted by gRPC
status code name.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf.message import Message
from grpc import aio
from grpc_health.v1 import health_pb2

from meshkit.addresses import grpc_target
from meshkit.answering import split_sentences
from meshkit.client import channel_options
from meshkit.ids import chunk_id_for
from ragmesh.common.v1 import common_pb2
from ragmesh.embedder.v1 import embedder_pb2
from ragmesh.extractor.v1 import extractor_pb2
from ragmesh.gateway.v1 import gateway_pb2
from ragmesh.index.v1 import index_pb2
from ragmesh.narrator.v1 import narrator_pb2
from ragmesh.planner.v1 import planner_pb2
from ragmesh.reranker.v1 import reranker_pb2
from ragmesh.sparse.v1 import sparse_pb2
from ragmesh_cli.channels import open_channel
from ragmesh_cli.documents import InputError, WalkStats, read_corpus
from ragmesh_cli.evaluation import find_corpus, load_dataset
from ragmesh_cli.stack import read_state

# A start later than its schedule by more than the event loop's ordinary timer jitter (well under
# 1 ms on an idle loop) means the driver or the outstanding cap held it back.
LATE_START_S = 0.002
CONNECT_TIMEOUT_S = 10.0
# Documents kept (besides the queries' relevant ones) to pad passage lists; enough variety
# without holding a large corpus in memory.
FILLER_DOCS = 2000
# About one ingested chunk (240 tokens); whole abstracts would overstate the per-passage cost.
PASSAGE_CHARS = 1200
SNIPPET_CHARS = 300
EMBED_BATCH = 32
PERCENTILES = (50.0, 95.0, 99.0)
ANSWER_MODES = ("llm", "extractive")


# ---------------------------------------------------------------------------- statistics


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of already sorted values (no interpolation: every figure reported
    is a latency some call actually had); None when there are none."""
    if not sorted_values:
        return None
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} is outside 0..100")
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


def latency_summary_ms(latencies_s: Sequence[float]) -> dict[str, float | None]:
    ordered = sorted(latencies_s)
    out: dict[str, float | None] = {}
    for q in PERCENTILES:
        value = percentile(ordered, q)
        out[f"p{q:g}"] = None if value is None else round(value * 1000.0, 3)
    out["max"] = round(ordered[-1] * 1000.0, 3) if ordered else None
    out["mean"] = round(sum(ordered) / len(ordered) * 1000.0, 3) if ordered else None
    return out


def scheduled_count(rate: float, seconds: float) -> int:
    """Requests an open loop schedules in [0, seconds): i / rate < seconds."""
    return max(0, math.ceil(seconds * rate - 1e-9))


# ---------------------------------------------------------------------------- driving


@dataclass(frozen=True)
class DriveOptions:
    concurrency: int | None = None
    rate: float | None = None
    max_outstanding: int = 1000
    duration_s: float = 10.0
    warmup_s: float = 0.0
    timeout_s: float = 30.0
    channels: int = 1
    progress_s: float = 0.0

    def validate(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("give exactly one of --concurrency and --rate")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("--concurrency must be >= 1")
        if self.rate is not None and not self.rate > 0:
            raise ValueError("--rate must be > 0")
        checks = (
            (self.max_outstanding >= 1, "--max-outstanding must be >= 1"),
            (self.duration_s > 0, "--duration must be > 0"),
            (self.warmup_s >= 0, "--warmup must be >= 0"),
            (self.timeout_s > 0, "--timeout must be > 0"),
            (self.channels >= 1, "--channels must be >= 1"),
            (self.progress_s >= 0, "--progress must be >= 0"),
        )
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


@dataclass
class Recorder:
    """Outcomes of the calls started in the measured window, plus rolling figures for progress."""

    measure_start: float
    measure_end: float
    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    started: int = 0
    start_lags: list[float] = field(default_factory=list)
    late_starts: int = 0
    in_flight: int = 0
    # Since the last progress line, whatever the window.
    interval_latencies: list[float] = field(default_factory=list)
    interval_errors: int = 0
    # Process CPU and wall clock when the measured window opened.
    cpu_mark: float = field(default_factory=_cpu_seconds)
    wall_mark: float = field(default_factory=time.perf_counter)

    def measured(self, scheduled: float) -> bool:
        return self.measure_start <= scheduled < self.measure_end

    def on_start(self, scheduled: float, sent: float) -> None:
        self.in_flight += 1
        if self.measured(scheduled):
            self.started += 1
            lag = sent - scheduled
            self.start_lags.append(lag)
            if lag > LATE_START_S:
                self.late_starts += 1

    def on_done(self, scheduled: float, done: float, code: str | None) -> None:
        self.in_flight -= 1
        if code is None:
            self.interval_latencies.append(done - scheduled)
        else:
            self.interval_errors += 1
        if not self.measured(scheduled):
            return
        if code is None:
            self.latencies.append(done - scheduled)
        else:
            self.errors[code] += 1


async def _call_once(
    call: aio.UnaryUnaryMultiCallable, request: bytes, scheduled: float, timeout_s: float, rec: Recorder
) -> None:
    sent = time.perf_counter()
    rec.on_start(scheduled, sent)
    code: str | None = None
    try:
        await call(request, timeout=timeout_s)
    except aio.AioRpcError as exc:
        code = exc.code().name
    except Exception as exc:  # a load driver reports odd client failures instead of dying on them
        code = f"CLIENT_{type(exc).__name__}"
    rec.on_done(scheduled, time.perf_counter(), code)


async def _closed_loop(
    calls: Sequence[aio.UnaryUnaryMultiCallable],
    requests: Sequence[bytes],
    opts: DriveOptions,
    rec: Recorder,
) -> None:
    workers = opts.concurrency or 1

    async def worker(w: int) -> None:
        call, i = calls[w % len(calls)], w
        while (now := time.perf_counter()) < rec.measure_end:
            await _call_once(call, requests[i % len(requests)], now, opts.timeout_s, rec)
            i += workers

    await asyncio.gather(*(worker(w) for w in range(workers)))


async def _open_loop(
    calls: Sequence[aio.UnaryUnaryMultiCallable],
    requests: Sequence[bytes],
    opts: DriveOptions,
    rec: Recorder,
    t0: float,
) -> int:
    """Send request i at t0 + i/rate; return how many measured requests were never sent."""
    rate = opts.rate or 1.0
    slots = asyncio.Semaphore(opts.max_outstanding)
    tasks: set[asyncio.Task[None]] = set()

    def finished(task: asyncio.Task[None]) -> None:
        slots.release()
        tasks.discard(task)

    i = 0
    while (scheduled := t0 + i / rate) < rec.measure_end:
        now = time.perf_counter()
        if now >= rec.measure_end:
            # A saturated driver leaves what is still overdue at the end unsent, rather than
            # bursting on past the window.
            break
        if scheduled > now:
            await asyncio.sleep(scheduled - now)
        if slots.locked():
            try:
                await asyncio.wait_for(slots.acquire(), max(0.0, rec.measure_end - time.perf_counter()))
            except TimeoutError:
                break
        else:
            await slots.acquire()
        task = asyncio.create_task(
            _call_once(calls[i % len(calls)], requests[i % len(requests)], scheduled, opts.timeout_s, rec)
        )
        tasks.add(task)
        task.add_done_callback(finished)
        i += 1
    if tasks:
        await asyncio.gather(*tasks)
    return max(
        0, scheduled_count(rate, rec.measure_end - t0) - scheduled_count(rate, opts.warmup_s) - rec.started
    )


async def _progress(rec: Recorder, t0: float, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        now = time.perf_counter()
        ordered = sorted(rec.interval_latencies)
        p50, p99 = percentile(ordered, 50.0), percentile(ordered, 99.0)
        phase = "warmup" if now < rec.measure_start else "measuring"
        print(
            f"[{now - t0:6.1f}s] {phase:9s} ok/s {len(ordered) / every_s:8.1f}  "
            f"p50 {_ms(p50)}  p99 {_ms(p99)}  errors {rec.interval_errors}  in flight {rec.in_flight}",
            file=sys.stderr,
            flush=True,
        )
        rec.interval_latencies, rec.interval_errors = [], 0


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000.0:.1f}ms"


def open_channels(address: str, count: int) -> list[aio.Channel]:
    # A local subchannel pool gives each channel its own HTTP/2 connection; with the global pool,
    # channels to one target with the same arguments would share one.
    options = [*channel_options(), ("grpc.use_local_subchannel_pool", 1)]
    return [open_channel(address, options) for _ in range(count)]


async def drive(
    address: str,
    method: str,
    requests: Sequence[bytes],
    opts: DriveOptions,
    *,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
) -> dict[str, Any]:
    """Run one load test; the report as a JSON-ready dict (see ``format_report``)."""
    opts.validate()
    if not requests:
        raise ValueError("no requests to send")
    channels = open_channels(address, opts.channels)
    try:
        try:
            await asyncio.wait_for(
                asyncio.gather(*(ch.channel_ready() for ch in channels)), connect_timeout_s
            )
        except TimeoutError:
            raise RuntimeError(f"{address}: not reachable within {connect_timeout_s:g}s") from None
        # No serialisers: requests go out as prepared bytes and answers stay unparsed.
        calls = [
            ch.unary_unary(method, request_serializer=None, response_deserializer=None) for ch in channels
        ]
        t0 = time.perf_counter()
        rec = Recorder(measure_start=t0 + opts.warmup_s, measure_end=t0 + opts.warmup_s + opts.duration_s)
        helpers = [asyncio.create_task(_mark_window(rec))]
        if opts.progress_s:
            helpers.append(asyncio.create_task(_progress(rec, t0, opts.progress_s)))
        try:
            if opts.rate is not None:
                unsent: int | None = await _open_loop(calls, requests, opts, rec, t0)
            else:
                await _closed_loop(calls, requests, opts, rec)
                unsent = None
        finally:
            for helper in helpers:
                helper.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
        report = _report(address, method, opts, rec, unsent)
    finally:
        await asyncio.gather(*(ch.close(None) for ch in channels))
    return report


async def _mark_window(rec: Recorder) -> None:
    await asyncio.sleep(max(0.0, rec.measure_start - time.perf_counter()))
    rec.cpu_mark, rec.wall_mark = _cpu_seconds(), time.perf_counter()


def _report(
    address: str, method: str, opts: DriveOptions, rec: Recorder, unsent: int | None
) -> dict[str, Any]:
    # CPU over wall from the window's start to the last answer: 100 is one core busy throughout.
    wall = time.perf_counter() - rec.wall_mark
    cpu_percent = (_cpu_seconds() - rec.cpu_mark) / wall * 100.0 if wall > 0 else None
    ok = len(rec.latencies)
    error_count = sum(rec.errors.values())
    requests = ok + error_count
    lags = sorted(rec.start_lags)
    report: dict[str, Any] = {
        "address": address,
        "method": method,
        "mode": "open" if opts.rate is not None else "closed",
        "concurrency": opts.concurrency,
        "target_rate": opts.rate,
        "max_outstanding": opts.max_outstanding if opts.rate is not None else None,
        "channels": opts.channels,
        "duration_s": opts.duration_s,
        "warmup_s": opts.warmup_s,
        "timeout_s": opts.timeout_s,
        "requests": requests,
        "ok": ok,
        "errors": dict(sorted(rec.errors.items())),
        "error_rate": round(error_count / requests, 6) if requests else 0.0,
        "throughput_rps": round(ok / opts.duration_s, 3),
        "achieved_rate_rps": round(rec.started / opts.duration_s, 3),
        "latency_ms": latency_summary_ms(rec.latencies),
        "client_cpu_percent": None if cpu_percent is None else round(cpu_percent, 1),
    }
    if opts.rate is not None:
        lag_p99, lag_max = percentile(lags, 99.0), lags[-1] if lags else None
        report["late_starts"] = rec.late_starts
        report["unsent"] = unsent
        report["start_lag_ms"] = {
            "p99": None if lag_p99 is None else round(lag_p99 * 1000.0, 3),
            "max": None if lag_max is None else round(lag_max * 1000.0, 3),
        }
    return report


# ---------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class Doc:
    doc_id: str
    title: str
    text: str


@dataclass
class LoadData:
    """Queries of a dataset split, each with the documents judged relevant to it, and a pool of
    other documents to pad passage lists with."""

    queries: list[str]
    relevant: list[list[str]]
    docs: dict[str, Doc]
    filler: list[str]
    vectors: list[list[float]] = field(default_factory=list)

    def passages(self, i: int, n: int) -> list[Doc]:
        """Query i's relevant documents first, then others drawn at random (the same ones for the
        same i on every run): a candidate list like the one a retrieval stage hands on."""
        chosen = [d for d in self.relevant[i] if d in self.docs][:n]
        taken = set(chosen)
        pool = [d for d in self.filler if d not in taken]
        chosen += random.Random(i).sample(pool, min(n - len(chosen), len(pool)))
        return [self.docs[d] for d in chosen]


def load_data(root: Path, split: str, limit: int, seed: int) -> LoadData:
    dataset = load_dataset(root, split)
    if not dataset.queries:
        raise InputError(f"{root}: no runnable queries in split {split!r}")
    items = list(dataset.queries.items())
    random.Random(seed).shuffle(items)
    items = items[: limit or None]
    relevant = [[d for d, grade in dataset.qrels[q].items() if grade > 0] for q, _ in items]
    wanted = {d for ids in relevant for d in ids}
    docs: dict[str, Doc] = {}
    filler: list[str] = []
    for document in read_corpus(find_corpus(root), WalkStats()):
        keep_as_filler = len(filler) < FILLER_DOCS
        if document.doc_id in wanted or keep_as_filler:
            text = document.content.decode("utf-8")[:PASSAGE_CHARS]
            docs[document.doc_id] = Doc(document.doc_id, document.title, text)
        if keep_as_filler:
            filler.append(document.doc_id)
    if not docs:
        raise InputError(f"{root}: the corpus has no documents")
    return LoadData([text for _, text in items], relevant, docs, filler)


@dataclass(frozen=True)
class RequestOptions:
    collection: str = "default"
    top_k: int = 10
    passages: int = 0
    batch: int = 1
    embed_kind: str = "query"
    answer_mode: str | None = None
    strategy: str | None = None
    rerank: bool | None = None
    health_service: str = ""


Builder = Callable[[LoadData, RequestOptions], list[Message]]


@dataclass(frozen=True)
class Target:
    # Stack component whose address is used, and its gRPC method.
    component: str
    method: str
    build: Builder
    help: str
    # Passages per request when --passages is not given (0: the target takes none).
    default_passages: int = 0
    needs_dataset: bool = True


_STRATEGIES = {"precise": planner_pb2.STRATEGY_PRECISE, "exhaustive": planner_pb2.STRATEGY_EXHAUSTIVE}
_WORD = re.compile(r"[\w][\w.+-]*[\w]|\w")


def hard_keywords(query: str, most: int = 2) -> list[str]:
    """Keywords an exact search would get: identifier-like words (digits, inner capitals,
    punctuation) first, else the longest words, as a planner's hard keywords would be."""
    words = list(dict.fromkeys(_WORD.findall(query)))

    def hardness(word: str) -> tuple[bool, int]:
        odd = any(c.isdigit() for c in word) or any(c in ".+-" for c in word) or not word[1:].islower()
        return odd and len(word) > 1, len(word)

    return sorted(words, key=hardness, reverse=True)[:most]


def _strategy(opts: RequestOptions) -> planner_pb2.Strategy:
    return _STRATEGIES[opts.strategy] if opts.strategy else planner_pb2.STRATEGY_UNSPECIFIED


def _build_health(data: LoadData, opts: RequestOptions) -> list[Message]:
    return [health_pb2.HealthCheckRequest(service=opts.health_service)]


def _build_gateway(data: LoadData, opts: RequestOptions) -> list[Message]:
    out: list[Message] = []
    for query in data.queries:
        request = gateway_pb2.SearchRequest(
            collection=opts.collection, query=query, top_k=opts.top_k, strategy=_strategy(opts)
        )
        if opts.rerank is not None:
            request.rerank = opts.rerank
        out.append(request)
    return out


def _build_gateway_ask(data: LoadData, opts: RequestOptions) -> list[Message]:
    mode = {"llm": gateway_pb2.ANSWER_MODE_LLM, "extractive": gateway_pb2.ANSWER_MODE_EXTRACTIVE}
    out: list[Message] = []
    for query in data.queries:
        request = gateway_pb2.AskRequest(
            collection=opts.collection,
            query=query,
            passages=opts.passages,
            mode=mode.get(opts.answer_mode or "", gateway_pb2.ANSWER_MODE_UNSPECIFIED),
            strategy=_strategy(opts),
        )
        if opts.rerank is not None:
            request.rerank = opts.rerank
        out.append(request)
    return out


def _build_embedder(data: LoadData, opts: RequestOptions) -> list[Message]:
    if opts.embed_kind == "passage":
        texts = [doc.text for doc in data.docs.values()]
        kind = embedder_pb2.TEXT_KIND_PASSAGE
    else:
        texts, kind = data.queries, embedder_pb2.TEXT_KIND_QUERY
    batches = [texts[i : i + opts.batch] for i in range(0, len(texts), opts.batch)]
    return [embedder_pb2.EmbedRequest(texts=batch, kind=kind) for batch in batches]


def _build_index(data: LoadData, opts: RequestOptions) -> list[Message]:
    if not data.vectors:
        raise RuntimeError("index requests need query vectors (from the embedder, or --random-vectors)")
    return [
        index_pb2.SearchRequest(
            collection=opts.collection, vector=common_pb2.Vector(values=v), top_k=opts.top_k
        )
        for v in data.vectors
    ]


def _build_sparse(data: LoadData, opts: RequestOptions) -> list[Message]:
    return [
        sparse_pb2.SearchBm25Request(collection=opts.collection, query=q, top_k=opts.top_k)
        for q in data.queries
    ]


def _build_sparse_exact(data: LoadData, opts: RequestOptions) -> list[Message]:
    return [
        sparse_pb2.SearchExactRequest(collection=opts.collection, keywords=hard_keywords(q), top_k=opts.top_k)
        for q in data.queries
    ]


def _build_planner(data: LoadData, opts: RequestOptions) -> list[Message]:
    return [planner_pb2.PlanRequest(query=q, strategy=_strategy(opts)) for q in data.queries]


def _build_planner_hyde(data: LoadData, opts: RequestOptions) -> list[Message]:
    return [planner_pb2.HydeRequest(query=q) for q in data.queries]


def _passage_id(opts: RequestOptions, doc: Doc) -> str:
    return chunk_id_for(opts.collection, doc.doc_id, doc.text)


def _build_reranker(data: LoadData, opts: RequestOptions) -> list[Message]:
    return [
        reranker_pb2.RerankRequest(
            query=q,
            passages=[
                reranker_pb2.Passage(id=_passage_id(opts, d), text=f"{d.title}\n{d.text}".strip())
                for d in data.passages(i, opts.passages)
            ],
            top_n=opts.top_k,
            # The model's capacity, not the score cache's: a second run repeats the pairs.
            uncached=True,
        )
        for i, q in enumerate(data.queries)
    ]


_EXTRACTION_MODES = {
    "llm": extractor_pb2.EXTRACTION_MODE_LLM,
    "extractive": extractor_pb2.EXTRACTION_MODE_EXTRACTIVE,
}
_NARRATION_MODES = {
    "llm": narrator_pb2.NARRATION_MODE_LLM,
    "extractive": narrator_pb2.NARRATION_MODE_EXTRACTIVE,
}


def _build_extractor(data: LoadData, opts: RequestOptions) -> list[Message]:
    out: list[Message] = []
    for i, query in enumerate(data.queries):
        passages = [
            # Falling scores, as reranked passages arrive (best first).
            extractor_pb2.Passage(
                id=_passage_id(opts, d), doc_id=d.doc_id, title=d.title, text=d.text, score=4.0 - 0.5 * rank
            )
            for rank, d in enumerate(data.passages(i, opts.passages))
        ]
        mode = _EXTRACTION_MODES.get(opts.answer_mode or "", extractor_pb2.EXTRACTION_MODE_UNSPECIFIED)
        out.append(extractor_pb2.ExtractRequest(query=query, passages=passages, mode=mode))
    return out


def _build_narrator(data: LoadData, opts: RequestOptions) -> list[Message]:
    out: list[Message] = []
    for i, query in enumerate(data.queries):
        docs = data.passages(i, opts.passages)
        sources = [
            narrator_pb2.Source(
                id=_passage_id(opts, d), doc_id=d.doc_id, title=d.title, snippet=d.text[:SNIPPET_CHARS]
            )
            for d in docs
        ]
        # One fact per source, its first sentence, as the extractor's extractive mode would give.
        facts = [
            narrator_pb2.Fact(text=(split_sentences(d.text) or [d.text])[0], source=n, score=4.0 - 0.5 * n)
            for n, d in enumerate(docs, start=1)
        ]
        mode = _NARRATION_MODES.get(opts.answer_mode or "", narrator_pb2.NARRATION_MODE_UNSPECIFIED)
        out.append(narrator_pb2.NarrateRequest(query=query, sources=sources, facts=facts, mode=mode))
    return out


TARGETS: dict[str, Target] = {
    "health": Target(
        "",
        "/grpc.health.v1.Health/Check",
        _build_health,
        "grpc.health.v1 Check on --address (any service; the driver's ceiling)",
        needs_dataset=False,
    ),
    "gateway": Target("gateway", "/ragmesh.gateway.v1.GatewayService/Search", _build_gateway, "Search"),
    "gateway-ask": Target(
        "gateway", "/ragmesh.gateway.v1.GatewayService/Ask", _build_gateway_ask, "Ask (answers)"
    ),
    "embedder": Target(
        "embedder", "/ragmesh.embedder.v1.EmbedderService/Embed", _build_embedder, "Embed queries or passages"
    ),
    "index": Target(
        "index", "/ragmesh.index.v1.IndexService/Search", _build_index, "vector Search on one shard"
    ),
    "sparse": Target("sparse", "/ragmesh.sparse.v1.SparseService/SearchBm25", _build_sparse, "BM25 search"),
    "sparse-exact": Target(
        "sparse", "/ragmesh.sparse.v1.SparseService/SearchExact", _build_sparse_exact, "exact keyword search"
    ),
    "planner": Target("planner", "/ragmesh.planner.v1.PlannerService/Plan", _build_planner, "Plan"),
    "planner-hyde": Target(
        "planner", "/ragmesh.planner.v1.PlannerService/Hyde", _build_planner_hyde, "Hyde passage"
    ),
    "reranker": Target(
        "reranker",
        "/ragmesh.reranker.v1.RerankerService/Rerank",
        _build_reranker,
        "Rerank a query's passages",
        default_passages=35,
    ),
    "extractor": Target(
        "extractor",
        "/ragmesh.extractor.v1.ExtractorService/Extract",
        _build_extractor,
        "Extract facts from passages",
        default_passages=10,
    ),
    "narrator": Target(
        "narrator",
        "/ragmesh.narrator.v1.NarratorService/Narrate",
        _build_narrator,
        "Narrate an answer from sources and facts",
        default_passages=5,
    ),
}


# ---------------------------------------------------------------------------- addresses and vectors


def address_env(component: str) -> str:
    return "RAGMESH_INDEX_ADDRESSES" if component == "index" else f"RAGMESH_{component.upper()}_ADDRESS"


def resolve_component_address(component: str, state_dir: Path) -> str:
    """How every command finds a service: the env override, else the running stack's record,
    else the settings' default, as a gRPC target over every replica. The index is its first
    shard (with its replicas)."""
    override = os.environ.get(address_env(component), "")
    override = _first_shard(override) if component == "index" else override
    if override.strip():
        return grpc_target(override)
    name = "index-0" if component == "index" else component
    replicas = [
        f"127.0.0.1:{comp['ports']['main']}"
        for comp in (read_state(state_dir) or {}).get("components", [])
        if comp["name"] == name or (component != "index" and comp.get("kind") == component)
    ]
    if replicas:
        return grpc_target(",".join(replicas))
    from meshkit.settings import MeshSettings

    field_name = "index_addresses" if component == "index" else f"{component}_address"
    default = MeshSettings.model_fields.get(field_name)
    if default is None:
        raise RuntimeError(f"no {component} address: start the stack or set {address_env(component)}")
    value = str(default.default)
    return grpc_target(_first_shard(value) if component == "index" else value)


def _first_shard(index_addresses: str) -> str:
    """Shard 0 of an index_addresses setting, its replicas (a|b) as a comma list."""
    first = index_addresses.split(",")[0]
    return ",".join(r.strip() for r in first.split("|") if r.strip())


def random_unit_vectors(count: int, dimension: int, seed: int) -> list[list[float]]:
    matrix = np.random.default_rng(seed).standard_normal((count, dimension)).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    return [row.tolist() for row in matrix]


async def embed_queries(address: str, queries: Sequence[str], timeout_s: float) -> list[list[float]]:
    async with open_channel(address) as channel:
        embed = channel.unary_unary(
            TARGETS["embedder"].method,
            request_serializer=embedder_pb2.EmbedRequest.SerializeToString,
            response_deserializer=embedder_pb2.EmbedResponse.FromString,
        )
        vectors: list[list[float]] = []
        for start in range(0, len(queries), EMBED_BATCH):
            batch = list(queries[start : start + EMBED_BATCH])
            request = embedder_pb2.EmbedRequest(texts=batch, kind=embedder_pb2.TEXT_KIND_QUERY)
            reply = await embed(request, timeout=timeout_s)
            vectors += [list(v.values) for v in reply.vectors]
        return vectors


async def index_dimension(address: str, collection: str, timeout_s: float) -> int:
    async with open_channel(address) as channel:
        stats = channel.unary_unary(
            "/ragmesh.index.v1.IndexService/GetStats",
            request_serializer=index_pb2.GetStatsRequest.SerializeToString,
            response_deserializer=index_pb2.GetStatsResponse.FromString,
        )
        reply = await stats(index_pb2.GetStatsRequest(collection=collection), timeout=timeout_s)
        if not reply.dimension:
            raise RuntimeError(f"collection {collection!r} has no vectors yet: give --dimension")
        return int(reply.dimension)


# ---------------------------------------------------------------------------- output


def format_report(service: str, report: dict[str, Any]) -> str:
    lat = report["latency_ms"]
    if report["mode"] == "open":
        shape = f"open loop at {report['target_rate']:g} req/s (max {report['max_outstanding']} outstanding)"
    else:
        shape = f"closed loop, concurrency {report['concurrency']}"
    errors = ", ".join(f"{code} {n}" for code, n in report["errors"].items()) or "none"
    rows = [
        ("target", f"{service}  {report['method']} at {report['address']}"),
        ("mode", f"{shape}, {report['channels']} channel(s)"),
        ("window", f"{report['duration_s']:g}s measured after {report['warmup_s']:g}s warmup"),
        ("requests", f"{report['requests']} (ok {report['ok']}, errors {report['requests'] - report['ok']})"),
        ("throughput", f"{report['throughput_rps']:.1f} ok/s"),
        ("sent", _sent_line(report)),
        (
            "latency ms",
            "  ".join(f"{k} {_num(lat[k])}" for k in ("p50", "p95", "p99", "max")),
        ),
        ("errors", errors),
        ("client CPU", f"{_num(report['client_cpu_percent'])}% of one core"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    cpu = report["client_cpu_percent"]
    if cpu is not None and cpu >= 90.0:
        lines.append("warning: the driver used a whole core; it may be the bottleneck (see make bench)")
    return "\n".join(lines)


def _sent_line(report: dict[str, Any]) -> str:
    achieved = f"{report['achieved_rate_rps']:.1f} req/s"
    if report["mode"] != "open":
        return achieved
    lag = report["start_lag_ms"]
    return (
        f"{achieved} of {report['target_rate']:g} targeted; late starts {report['late_starts']}, "
        f"unsent {report['unsent']}, start lag p99 {_num(lag['p99'])}ms max {_num(lag['max'])}ms"
    )


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


# ---------------------------------------------------------------------------- command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    targets = "; ".join(f"{name}: {t.help}" for name, t in TARGETS.items())
    parser.add_argument("service", choices=sorted(TARGETS), metavar="SERVICE", help=targets)
    parser.add_argument("--address", default=None, help="host:port (default: the running stack's)")
    parser.add_argument("--dataset", type=Path, default=None, metavar="DIR", help="BEIR-style dataset folder")
    parser.add_argument("--split", default="test", help="queries of qrels/<split>.tsv (default test)")
    parser.add_argument("--queries", type=int, default=0, help="distinct queries used (0: all)")
    parser.add_argument("--seed", type=int, default=13, help="query order and random vectors")
    parser.add_argument("--collection", default=None, help="collection (default: the dataset folder's name)")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=int, default=None, help="closed loop: N workers (default 8)")
    load.add_argument("--rate", type=float, default=None, help="open loop: requests per second")
    parser.add_argument("--max-outstanding", type=int, default=1000, help="open loop: most calls in flight")
    parser.add_argument("--duration", type=float, default=30.0, help="measured seconds (default 30)")
    parser.add_argument(
        "--warmup", type=float, default=5.0, help="seconds run first, not counted (default 5)"
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="per-request deadline, seconds")
    parser.add_argument("--channels", type=int, default=1, help="gRPC channels (HTTP/2 connections) used")
    parser.add_argument(
        "--progress", type=float, default=5.0, help="seconds between progress lines (0: none)"
    )
    parser.add_argument("--top-k", type=int, default=10, help="results asked of search stages (default 10)")
    parser.add_argument(
        "--passages",
        type=int,
        default=None,
        help="passages per request (default: reranker 35, extractor 10, narrator 5, ask the server's)",
    )
    parser.add_argument("--batch", type=int, default=1, help="embedder: texts per request")
    parser.add_argument("--embed-kind", choices=("query", "passage"), default="query", help="embedder texts")
    parser.add_argument("--answer-mode", choices=ANSWER_MODES, default=None, help="ask/extractor/narrator")
    parser.add_argument("--strategy", choices=sorted(_STRATEGIES), default=None, help="gateway/planner")
    parser.add_argument("--rerank", action=argparse.BooleanOptionalAction, default=None, help="gateway")
    parser.add_argument("--random-vectors", action="store_true", help="index: random unit query vectors")
    parser.add_argument(
        "--dimension", type=int, default=None, help="index: vector size (default: the index's)"
    )
    parser.add_argument("--embedder-address", default=None, help="index: embedder for the query vectors")
    parser.add_argument("--health-service", default="", help="health: service name checked (default: server)")
    parser.add_argument("--json", action="store_true", help="the report as one JSON object")


def drive_options(args: argparse.Namespace) -> DriveOptions:
    concurrency = args.concurrency if args.concurrency is not None or args.rate is not None else 8
    return DriveOptions(
        concurrency=concurrency,
        rate=args.rate,
        max_outstanding=args.max_outstanding,
        duration_s=args.duration,
        warmup_s=args.warmup,
        timeout_s=args.timeout,
        channels=args.channels,
        progress_s=args.progress,
    )


def request_options(args: argparse.Namespace, target: Target) -> RequestOptions:
    passages = target.default_passages if args.passages is None else args.passages
    for value, name in ((args.top_k, "--top-k"), (args.batch, "--batch"), (passages, "--passages")):
        if value < 0 or (name == "--batch" and value < 1):
            raise ValueError(f"{name} must be >= {1 if name == '--batch' else 0}")
    if args.queries < 0:
        raise ValueError("--queries must be >= 0")
    collection = args.collection or (args.dataset.absolute().name if args.dataset else "default")
    return RequestOptions(
        collection=collection,
        top_k=args.top_k,
        passages=passages,
        batch=args.batch,
        embed_kind=args.embed_kind,
        answer_mode=args.answer_mode,
        strategy=args.strategy,
        rerank=args.rerank,
        health_service=args.health_service,
    )


async def prepare_requests(
    args: argparse.Namespace, service: str, state_dir: Path, opts: RequestOptions
) -> list[bytes]:
    """Every request of the run, serialised once."""
    target = TARGETS[service]
    if not target.needs_dataset:
        data = LoadData([], [], {}, [])
    elif args.dataset is None:
        raise InputError(f"loadtest {service} needs --dataset (e.g. ../shared/bench/scifact)")
    else:
        data = load_data(args.dataset, args.split, args.queries, args.seed)
    if service == "index":
        if args.random_vectors:
            address = args.address or resolve_component_address("index", state_dir)
            dimension = args.dimension or await index_dimension(address, opts.collection, args.timeout)
            data.vectors = random_unit_vectors(len(data.queries), dimension, args.seed)
        else:
            embedder = args.embedder_address or resolve_component_address("embedder", state_dir)
            data.vectors = await embed_queries(embedder, data.queries, args.timeout)
    return [message.SerializeToString() for message in target.build(data, opts)]


async def run_loadtest(args: argparse.Namespace, state_dir: Path) -> int:
    target = TARGETS[args.service]
    opts = drive_options(args)
    opts.validate()
    if args.address is None and not target.component:
        raise InputError(f"loadtest {args.service} needs --address")
    address = args.address or resolve_component_address(target.component, state_dir)
    requests = await prepare_requests(args, args.service, state_dir, request_options(args, target))
    if not args.json:
        print(
            f"loadtest {args.service}: {len(requests)} distinct requests against {address}",
            file=sys.stderr,
            flush=True,
        )
    report = await drive(address, target.method, requests, opts)
    report = {"service": args.service, **report, "distinct_requests": len(requests)}
    print(json.dumps(report, indent=2) if args.json else format_report(args.service, report))
    return 0 if report["ok"] else 1
