"""Compare the exact leg's two modes on SciFact (5,183 abstracts, one chunk each): latency and
whether they return the same top 10. Then phrase mode on the hard keywords the deterministic
planner finds in the SciFact test claims, side by side with its tiebreak bounded
(``sparse_exact_tiebreak_chunks``, the default) and not: latency, and whether the first ``pool``
hits (as many as the gateway asks for) are the same (last line, JSON).

    .venv/bin/python -m bench.exact_bench [--corpus PATH] [--queries N]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import random
import re
import statistics
import tempfile
import time
from pathlib import Path

from meshkit.domain.ids import chunk_id_for
from meshkit.settings import PlannerSettings, SparseSettings
from ragmesh_cli.datasets import load_dataset
from services.planner.plan import PlanInput
from services.planner.servicer import deterministic_planner
from services.sparse.collection import Collection
from services.sparse.exact import Keyword, find_ripgrep, normalise_keywords, rank, ripgrep_counts
from services.sparse.records import ChunkRecord, DocumentUpdate
from services.sparse.servicer import exact_phrase

DEFAULT_CORPUS = Path(__file__).resolve().parents[2] / "shared/bench/scifact/corpus.jsonl.gz"
# Gene / protein / assay names such as IL-6, CD4, p53, H3K27me3: letters and digits mixed.
_IDENTIFIER_RE = re.compile(r"\b(?=[A-Za-z0-9-]*[A-Za-z])(?=[A-Za-z0-9-]*\d)[A-Za-z0-9][A-Za-z0-9-]{2,}\b")
TOP_K = 10


def load(corpus: Path) -> list[ChunkRecord]:
    with gzip.open(corpus, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return [
        ChunkRecord(chunk_id_for("bench", r["_id"], r["text"]), r["_id"], r["title"], r["text"]) for r in rows
    ]


def keyword_sets(records: list[ChunkRecord], n: int, rng: random.Random) -> dict[str, list[list[str]]]:
    identifiers: list[str] = []
    phrases: list[str] = []
    for record in rng.sample(records, min(len(records), 4 * n)):
        identifiers += _IDENTIFIER_RE.findall(record.text)[:1]
        words = record.text.split()
        if len(words) > 4:
            start = rng.randrange(len(words) - 3)
            phrases.append(" ".join(w.strip(".,;:()") for w in words[start : start + 3]))
    return {
        "identifier": [[k] for k in identifiers[:n]],
        "phrase": [[k] for k in phrases[:n]],
        "mixed3": [[rng.choice(identifiers), rng.choice(phrases), rng.choice(identifiers)] for _ in range(n)],
    }


async def ripgrep_search(collection: Collection, keywords: list[Keyword]) -> list[str]:
    rg = find_ripgrep()
    assert rg is not None
    counts = await ripgrep_counts(rg, collection.files.root, keywords, 30.0)
    doc_of = await asyncio.to_thread(collection.live_documents, counts.keys(), [])
    return [h.chunk_id for h in rank(counts, doc_of, keywords, TOP_K)]


def ms(samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[int(0.95 * (len(ordered) - 1))]
    return f"median {1000 * statistics.median(ordered):.1f} ms, p95 {1000 * p95:.1f} ms"


def planned_keywords(claims: list[str]) -> list[tuple[list[Keyword], int]]:
    """The hard keywords and pool size the gateway's deterministic plan gives each claim that has any."""
    planner = deterministic_planner(PlannerSettings())
    planned = []
    for claim in claims:
        plan = planner.plan_sync(PlanInput(claim, None, 1, None))
        keywords = normalise_keywords(plan.hard_keywords)
        if keywords:
            planned.append((keywords, plan.pool_size))
    return planned


def tiebreak_rows(collection: Collection, planned: list[tuple[list[Keyword], int]]) -> dict[str, object]:
    """Phrase mode with the tiebreak bounded (the default) and unbounded, alternating per claim."""
    bounded = SparseSettings().sparse_exact_tiebreak_chunks
    times: dict[str, list[float]] = {"bounded": [], "unbounded": []}
    same = 0
    for keywords, pool in planned:
        found = {}
        for name, max_tied in (("bounded", bounded), ("unbounded", None)):
            started = time.perf_counter()
            hits = exact_phrase(collection, keywords, pool, [], max_tied=max_tied)
            found[name] = [h.chunk_id for h in hits]
            times[name].append(time.perf_counter() - started)
        same += found["bounded"] == found["unbounded"]
    for name, samples in times.items():
        print(f"tiebreak {name:9} n={len(samples)}  {ms(samples)}, max {1000 * max(samples):.1f} ms")
    return {
        "bench": "exact_tiebreak",
        "claims": len(planned),
        "tiebreak_chunks": bounded,
        **{f"{name}_ms": summary_ms(samples) for name, samples in times.items()},
        "identical_pool": same,
    }


def summary_ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50": round(1000 * statistics.median(ordered), 2),
        "p90": round(1000 * ordered[int(0.9 * (len(ordered) - 1))], 2),
        "max": round(1000 * ordered[-1], 2),
        "mean": round(1000 * statistics.mean(ordered), 2),
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--queries", type=int, default=100)
    args = parser.parse_args()
    records = load(args.corpus)
    with tempfile.TemporaryDirectory() as tmp:
        collection = Collection(Path(tmp), "bench", 64 * 1024 * 1024, 1.5)
        started = time.perf_counter()
        for i in range(0, len(records), 500):
            batch = records[i : i + 500]
            collection.replace_documents([DocumentUpdate(r.doc_id, [r], []) for r in batch])
        print(f"indexed {len(records)} chunks in {time.perf_counter() - started:.1f}s")
        for kind, sets in keyword_sets(records, args.queries, random.Random(7)).items():
            rg_times, phrase_times, same, jaccard = [], [], 0, []
            for raw in sets:
                keywords = normalise_keywords(raw)
                t0 = time.perf_counter()
                by_rg = await ripgrep_search(collection, keywords)
                t1 = time.perf_counter()
                by_phrase = [h.chunk_id for h in exact_phrase(collection, keywords, TOP_K, [])]
                t2 = time.perf_counter()
                rg_times.append(t1 - t0)
                phrase_times.append(t2 - t1)
                same += by_rg == by_phrase
                union = set(by_rg) | set(by_phrase)
                jaccard.append(len(set(by_rg) & set(by_phrase)) / len(union) if union else 1.0)
            print(
                f"{kind:10} n={len(sets):3}  ripgrep {ms(rg_times)} | phrase {ms(phrase_times)} | "
                f"identical top-{TOP_K} {same}/{len(sets)}, mean Jaccard {statistics.mean(jaccard):.2f}"
            )
        claims = list(load_dataset(args.corpus.parent, "test").queries.values())
        print(json.dumps(tiebreak_rows(collection, planned_keywords(claims))))


if __name__ == "__main__":
    asyncio.run(main())
