"""The ONNX half of ``make gpu-check``: the project's embedder and reranker model classes, run
with each requested ONNX Runtime provider in one process, side by side.

    python -m bench.gpu_onnx --providers cuda,cpu --out result.json

``bench.gpu_check`` runs this in its own venv (onnxruntime-gpu ahead of the project's CPU
build on the path); with ``--providers cpu`` it runs anywhere the project does. For each
provider: the reranker's p50/p95 and pairs/s scoring 35 candidates per request at
concurrency 1, and the embedder's p50 for one query and texts/s over passages in batches of 32.

A CUDA session that fell back to the CPU is a failure, never a slow "CUDA" figure: the loaders
refuse it (provider ``cuda``), this module checks the session's providers again, and a
profiled run counts the graph nodes each provider executed (the int8 graphs hold operators the
CUDA provider may leave to the CPU, which shows up there and not in ``get_providers``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from meshkit.inference.onnxrt import CPU_PROVIDER, CUDA_PROVIDER
from meshkit.settings import EmbedderSettings, RerankerSettings
from services.embedder.model import EmbeddingModel, TextKind
from services.reranker.model import CrossEncoderModel

# The reranker figure: one claim's candidates, scored at concurrency 1.
RERANK_CANDIDATES = 35
EMBED_BATCH = 32
# Words per synthetic passage: past the models' 256-token limit, as SciFact abstracts are.
PASSAGE_WORDS = 220
QUERY_WORDS = 14
PROVIDER_NAMES = {"cuda": CUDA_PROVIDER, "cpu": CPU_PROVIDER}
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9'-]*")


@dataclass(frozen=True)
class ProviderCheck:
    """Whether a session really runs on CUDA, from its providers and (when profiled) its nodes."""

    providers: list[str]
    cuda: bool
    reason: str
    # Graph nodes executed per provider in a profiled run (empty when not profiled).
    nodes: dict[str, int]

    @property
    def cuda_node_share(self) -> float:
        total = sum(self.nodes.values())
        return round(self.nodes.get(CUDA_PROVIDER, 0) / total, 3) if total else 0.0


def provider_check(session: ort.InferenceSession, nodes: dict[str, int] | None = None) -> ProviderCheck:
    """Reports "CUDA not used" when CUDA is not the session's first provider or, given a profile, when
    no node ran on it."""
    providers = list(session.get_providers())
    counted = dict(nodes or {})
    if not providers or providers[0] != CUDA_PROVIDER:
        return ProviderCheck(providers, False, f"CUDA not used: the session runs on {providers}", counted)
    if nodes is not None and counted.get(CUDA_PROVIDER, 0) == 0:
        return ProviderCheck(
            providers, False, f"CUDA not used: every profiled node ran on {counted}", counted
        )
    return ProviderCheck(providers, True, "", counted)


def node_placement(
    model_path: Path, providers: Sequence[str], feeds: dict[str, np.ndarray]
) -> dict[str, int]:
    """Distinct graph nodes each provider executed in one profiled run of ``feeds``."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.enable_profiling = True
    with tempfile.TemporaryDirectory(prefix="ragmesh-ort-profile-") as scratch:
        options.profile_file_prefix = str(Path(scratch) / "profile")
        session = ort.InferenceSession(str(model_path), options, providers=list(providers))
        session.run(None, feeds)
        profile = Path(session.end_profiling())
        events = json.loads(profile.read_text())
    return count_nodes(events)


def count_nodes(events: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Nodes per provider in an ONNX Runtime profile (its "Node" events name their provider)."""
    seen: dict[str, str] = {}
    for event in events:
        args = event.get("args") or {}
        if event.get("cat") == "Node" and "provider" in args:
            seen[str(args.get("node_index", event.get("name")))] = str(args["provider"])
    return dict(Counter(seen.values()))


def sample_feeds(session: ort.InferenceSession, rows: int = 2, length: int = 16) -> dict[str, np.ndarray]:
    """Token ids, mask and type ids a BERT-style graph accepts, for the placement probe."""
    ids = np.full((rows, length), 1000, dtype=np.int64)
    ids[:, 0], ids[:, -1] = 101, 102
    values = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    return {i.name: values[i.name] for i in session.get_inputs() if i.name in values}


# ---------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class Workload:
    queries: list[str]
    passages: list[str]

    def candidates(self, request: int, count: int) -> list[str]:
        start = (request * 7) % len(self.passages)
        return [self.passages[(start + j) % len(self.passages)] for j in range(count)]


def text_workload(sources: Sequence[Path], passage_words: int = PASSAGE_WORDS) -> Workload:
    """Passages of ``passage_words`` words cut from the repository's own documentation (no data
    set needed on the GPU machine); each passage's opening words make a query."""
    words = [w for path in sources for w in _WORD.findall(path.read_text(encoding="utf-8"))]
    passages = [
        " ".join(words[i : i + passage_words])
        for i in range(0, len(words) - passage_words + 1, passage_words)
    ]
    if len(passages) < RERANK_CANDIDATES:
        raise ValueError(f"{len(passages)} passages from {len(sources)} files: need {RERANK_CANDIDATES}")
    queries = [" ".join(p.split()[:QUERY_WORDS]) for p in passages]
    return Workload(queries, passages)


def default_sources(root: Path) -> list[Path]:
    return [*sorted((root / "docs").glob("*.md")), root / "README.md"]


# ---------------------------------------------------------------------------- measurements


@dataclass(frozen=True)
class Timing:
    requests: int
    p50_ms: float
    p95_ms: float
    items_per_s: float


# Measured requests that count even past the time cap (a slow CPU still gets a median).
MIN_REQUESTS = 3


def timed(run: Callable[[int], int], requests: int, max_seconds: float, warmup: int = 1) -> Timing:
    """``run(i)`` for i in 0..requests-1 (it returns the items it handled), stopping early past
    ``max_seconds`` once MIN_REQUESTS were measured; p50/p95 per request, items/s over all."""
    for i in range(warmup):
        run(i)
    latencies: list[float] = []
    items = 0
    started = time.perf_counter()
    for i in range(requests):
        begun = time.perf_counter()
        items += run(warmup + i)
        latencies.append((time.perf_counter() - begun) * 1000)
        if len(latencies) >= MIN_REQUESTS and time.perf_counter() - started > max_seconds:
            break
    wall = time.perf_counter() - started
    return Timing(
        requests=len(latencies),
        p50_ms=round(statistics.median(latencies), 2),
        p95_ms=round(float(np.percentile(latencies, 95)), 2),
        items_per_s=round(items / wall, 1),
    )


def rerank_figures(
    model: CrossEncoderModel, work: Workload, requests: int, max_seconds: float
) -> dict[str, Any]:
    def one(i: int) -> int:
        passages = work.candidates(i, RERANK_CANDIDATES)
        model.score(work.queries[i % len(work.queries)], passages)
        return len(passages)

    timing = timed(one, requests, max_seconds)
    return {
        "candidates": RERANK_CANDIDATES,
        "requests": timing.requests,
        "p50_ms_35": timing.p50_ms,
        "p95_ms_35": timing.p95_ms,
        "pairs_per_s": timing.items_per_s,
    }


def embed_figures(model: EmbeddingModel, work: Workload, requests: int, max_seconds: float) -> dict[str, Any]:
    def query(i: int) -> int:
        model.embed([work.queries[i % len(work.queries)]], TextKind.QUERY)
        return 1

    def batch(i: int) -> int:
        texts = work.candidates(i, EMBED_BATCH)
        model.embed(texts, TextKind.PASSAGE)
        return len(texts)

    one = timed(query, requests * 2, max_seconds / 2)
    many = timed(batch, requests, max_seconds / 2)
    return {
        "query_p50_ms": one.p50_ms,
        "query_p95_ms": one.p95_ms,
        "batch": EMBED_BATCH,
        "batch_p50_ms": many.p50_ms,
        "texts_per_s": many.items_per_s,
    }


def load_models(provider: str, threads: int) -> tuple[CrossEncoderModel, EmbeddingModel]:
    reranker = CrossEncoderModel.load(
        RerankerSettings().reranker_model_dir, provider=provider, threads=threads
    )
    embedder = EmbeddingModel.load(
        EmbedderSettings(embedder_provider=provider, embedder_intra_op_threads=threads)
    )
    return reranker, embedder


def measure_provider(provider: str, work: Workload, requests: int, max_seconds: float) -> dict[str, Any]:
    """One provider's figures, or why it could not give them (``error``)."""
    try:
        reranker, embedder = load_models(provider, threads=0)
    except Exception as exc:  # the loaders' refusals (CUDA fell back, libraries missing)
        return {"provider": provider, "error": f"{type(exc).__name__}: {exc}"}
    checks = {
        "reranker": placement_check(reranker.session, RerankerSettings().reranker_model_dir / "model.onnx"),
        "embedder": placement_check(embedder._session, Path(EmbedderSettings().embedder_model_path)),
    }
    out: dict[str, Any] = {
        "provider": provider,
        "session_providers": {name: asdict(check) for name, check in checks.items()},
    }
    if provider == "cuda":
        for name, check in checks.items():
            out["session_providers"][name]["cuda_node_share"] = check.cuda_node_share
        failed = [f"{name}: {check.reason}" for name, check in checks.items() if not check.cuda]
        if failed:
            # Loud, and no figures: a CPU run labelled CUDA is worse than none.
            out["error"] = "; ".join(failed)
            return out
    out["reranker"] = rerank_figures(reranker, work, requests, max_seconds)
    out["embedder"] = embed_figures(embedder, work, requests, max_seconds)
    return out


def placement_check(session: ort.InferenceSession, model_path: Path) -> ProviderCheck:
    providers = list(session.get_providers())
    nodes = node_placement(model_path, providers, sample_feeds(session))
    return provider_check(session, nodes)


def preload_cuda_libraries() -> str:
    """onnxruntime-gpu >= 1.21 loads CUDA and cuDNN from the nvidia-* wheels beside it; without
    this the CUDA provider finds them only on LD_LIBRARY_PATH."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is None:
        return "onnxruntime has no preload_dlls"
    try:
        preload(directory="")
    except Exception as exc:
        return f"preload_dlls failed: {type(exc).__name__}: {exc}"
    return "ok"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--providers", default="cuda,cpu", help="comma list of cuda, cpu")
    parser.add_argument("--requests", type=int, default=20, help="measured requests per figure")
    parser.add_argument("--max-seconds", type=float, default=30.0, help="time cap per provider's figures")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    providers = [p.strip() for p in args.providers.split(",") if p.strip()]
    unknown = sorted(set(providers) - set(PROVIDER_NAMES))
    if unknown:
        parser.error(f"unknown providers {unknown}: use cuda and/or cpu")
    report: dict[str, Any] = {
        "onnxruntime": ort.__version__,
        "available_providers": ort.get_available_providers(),
        "cpu_count": os.cpu_count(),
    }
    if "cuda" in providers:
        report["preload_dlls"] = preload_cuda_libraries()
    work = text_workload(default_sources(Path.cwd()))
    report["results"] = {p: measure_provider(p, work, args.requests, args.max_seconds) for p in providers}
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
