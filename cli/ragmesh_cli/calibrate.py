"""``ragmesh calibrate --collection C``: measure on the collection's own documents whether
reranking helps it, and record the choice with the collection (SetCollectionCalibration), so
that its searches and asks that leave ``rerank`` unset follow it.

No labelled queries are needed. A sample of the collection's documents each gives one
pseudo-query whose answer is known: the document's title (a heading a writer chose to say what
the page answers), or, for a document without a usable title, the first sentence of its best
passage. Each pseudo-query is searched once through the gateway with reranking asked for and
the legs' own rankings included, so the fused and reranked rankings are paired on the same call;
nDCG@10 of each, with the document as the only relevant answer, and a paired bootstrap of
reranked - fused decide: reranking (the server's default) is turned off only when it loses on
the collection's pseudo-queries with 95% confidence (the interval's upper end below 0).

Why titles, and why only a significant loss turns reranking off: on CISI, whose real queries the
reranker does not help, verbatim sentences and keyword sets of the documents made it look
strongly better (+0.06, a scratch probe) while titles showed the loss (-0.05, interval below 0). But a title
finds its own page near the ceiling (fused nDCG@10 0.91-0.996), where reranking can only lose:
on SciFact, whose real queries it helps (+0.029), titles show -0.003 [-0.013, +0.004]. The
pseudo-queries can show that the reranker hurts a collection, not that it helps one
(docs/BENCHMARKS.md, "Per-collection calibration", has the check per data set).

The legs' weights are not calibrated (recorded as 0: the gateway's own defaults): on title
queries the lexical leg wins by construction, which says nothing of a user's questions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from ragmesh.gateway.v1 import gateway_pb2
from ragmesh_cli import metrics
from ragmesh_cli.addresses import resolve_address
from ragmesh_cli.channels import gateway_client
from ragmesh_cli.documents import InputError
from ragmesh_cli.evaluation import collect, score_systems, system_runs
from ragmesh_cli.state import state_dir_of
from ragmesh_cli.tables import calibration_text
from ragmesh_client import AsyncClient, CollectionCalibration, RagmeshError

METHOD = "pseudo-queries/v1"
DEFAULT_QUERIES = 200
# Fewer answerable pseudo-queries than this measure nothing but noise.
MIN_QUERIES = 30
TOP_K = 10
RPC_TIMEOUT_S = 60.0
LIST_PAGE = 1000
# A usable title or sentence, in words: shorter says too little, longer is a passage.
MIN_WORDS, MAX_WORDS = 3, 40
MAX_QUERY_CHARS = 400
UNCALIBRATED_WEIGHTS = {"dense": 0.0, "bm25": 0.0, "exact": 0.0}


@dataclass(frozen=True)
class PseudoQuery:
    doc_id: str
    query: str
    # "title" or "sentence".
    source: str


def _words(text: str) -> list[str]:
    return text.split()


def usable_title(title: str) -> str | None:
    """The title as a query, or None when it is too short, too long or a file name."""
    words = _words(title)
    if not MIN_WORDS <= len(words) <= MAX_WORDS:
        return None
    if "/" in title or sum(ch.isalpha() for ch in title) < len(title.replace(" ", "")) // 2:
        return None
    return " ".join(words)[:MAX_QUERY_CHARS]


def first_sentence(text: str) -> str | None:
    """The first sentence of ``text`` of a usable length (a linear scan, no regular expression):
    a sentence ends at '.', '?' or '!' followed by white space, or at a blank line."""
    start = 0
    n = len(text)
    for i, ch in enumerate(text):
        ends = ch in ".?!" and (i + 1 == n or text[i + 1].isspace())
        ends = ends or (ch == "\n" and i + 1 < n and text[i + 1] == "\n")
        if ends or i + 1 == n:
            candidate = " ".join(_words(text[start : i + 1].lstrip("#*->| ")))
            if MIN_WORDS <= len(candidate.split()) <= MAX_WORDS:
                return candidate[:MAX_QUERY_CHARS]
            start = i + 1
    return None


def pseudo_query(doc_id: str, title: str, passage: str) -> PseudoQuery | None:
    query = usable_title(title)
    if query is not None:
        return PseudoQuery(doc_id, query, "title")
    query = first_sentence(passage)
    return None if query is None else PseudoQuery(doc_id, query, "sentence")


# ---------------------------------------------------------------------------- sampling


async def sample_documents(
    client: AsyncClient, collection: str, size: int, seed: int
) -> tuple[list[str], int]:
    """A uniform sample of ``size`` indexed documents (reservoir over one pass of the listing,
    so memory stays at the sample whatever the collection's size) and how many are indexed."""
    rng = random.Random(seed)
    sample: list[str] = []
    seen = 0
    pages = client.list_documents(collection, page_size=LIST_PAGE, timeout=RPC_TIMEOUT_S)
    async for summary in pages:
        if summary.state != "indexed":
            continue
        seen += 1
        if len(sample) < size:
            sample.append(summary.doc_id)
        else:
            slot = rng.randrange(seen)
            if slot < size:
                sample[slot] = summary.doc_id
    return sorted(sample), seen


async def build_queries(
    client: AsyncClient, collection: str, doc_ids: Sequence[str], concurrency: int, timeout_s: float
) -> list[PseudoQuery]:
    """One pseudo-query per document that yields one: its title and best passage come from a
    search restricted to the document (no reranking: it only reads the document)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(doc_id: str) -> PseudoQuery | None:
        request = gateway_pb2.SearchRequest(
            collection=collection, query=doc_id, top_k=1, doc_ids=[doc_id], rerank=False
        )
        async with gate:
            try:
                found = await client.search(collection, doc_id, request=request, timeout=timeout_s)
            except RagmeshError as exc:
                tqdm.write(f"{doc_id}: not read ({exc.code.name}: {exc.message})", file=sys.stderr)
                return None
        if not found.results:
            return None
        top = found.results[0]
        return pseudo_query(doc_id, top.title, top.text)

    queries: list[PseudoQuery] = []
    with tqdm(total=len(doc_ids), desc="reading documents", unit="doc", file=sys.stderr) as bar:
        for next_done in asyncio.as_completed([one(d) for d in doc_ids]):
            made = await next_done
            if made is not None:
                queries.append(made)
            bar.update(1)
    return unambiguous(queries)


def unambiguous(queries: Sequence[PseudoQuery]) -> list[PseudoQuery]:
    """The pseudo-queries no other sampled document shares (pages titled alike, such as
    "Getting started with ...", have no one known answer), in doc id order."""
    counts: dict[str, int] = {}
    for query in queries:
        key = query.query.casefold()
        counts[key] = counts.get(key, 0) + 1
    return sorted((q for q in queries if counts[q.query.casefold()] == 1), key=lambda q: q.doc_id)


# ---------------------------------------------------------------------------- measuring


def measurement_request(collection: str, query: PseudoQuery) -> gateway_pb2.SearchRequest:
    """Reranking asked for explicitly: the reply carries the fused list apart, so the fused and
    reranked rankings of one query come from one call (and the choice recorded before does not
    decide what is measured)."""
    return gateway_pb2.SearchRequest(
        collection=collection,
        query=query.query,
        top_k=TOP_K,
        collapse_documents=True,
        include_leg_results=True,
        rerank=True,
    )


@dataclass(frozen=True)
class Measurement:
    queries: int
    documents: int
    # system -> mean nDCG@10 over the pseudo-queries.
    measured: dict[str, float]
    gain: metrics.PairedBootstrap
    sources: dict[str, int]
    refused: int

    @property
    def rerank(self) -> bool:
        """Off only on evidence that reranking hurts: the whole 95% interval below 0."""
        return self.gain.ci_high >= 0.0

    def calibration(self) -> CollectionCalibration:
        return CollectionCalibration(
            rerank=self.rerank,
            weights=dict(UNCALIBRATED_WEIGHTS),
            queries=self.queries,
            documents=self.documents,
            measured=self.measured,
            rerank_gain=self.gain.mean_diff,
            rerank_gain_low=self.gain.ci_low,
            rerank_gain_high=self.gain.ci_high,
            method=METHOD,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": METHOD,
            "queries": self.queries,
            "documents": self.documents,
            "query_sources": self.sources,
            "refused": self.refused,
            "measured": self.measured,
            "reranked_vs_fused": {"metric": "ndcg@10", **self.gain.to_dict()},
            "rerank": self.rerank,
        }


def summarize(
    per_query: Mapping[str, Mapping[str, Mapping[str, float]]],
    queries: Sequence[PseudoQuery],
    documents: int,
    refused: int,
) -> Measurement:
    if "reranked" not in per_query:
        raise RuntimeError(
            "the gateway returned no reranked list (is the reranker disabled on this deployment?)"
        )
    ndcg = {name: scores["ndcg@10"] for name, scores in per_query.items()}
    sources: dict[str, int] = {}
    for query in queries:
        sources[query.source] = sources.get(query.source, 0) + 1
    return Measurement(
        queries=len(queries),
        documents=documents,
        measured={name: round(metrics.mean(values.values()), 6) for name, values in ndcg.items()},
        gain=metrics.paired_bootstrap(ndcg["fused"], ndcg["reranked"]),
        sources=sources,
        refused=refused,
    )


async def measure(
    client: AsyncClient,
    collection: str,
    queries: Sequence[PseudoQuery],
    documents: int,
    *,
    concurrency: int,
    timeout_s: float,
) -> Measurement:
    requests = {q.doc_id: measurement_request(collection, q) for q in queries}
    qrels = {q.doc_id: {q.doc_id: 1} for q in queries}
    outcomes = await collect(client, requests, timeout_s=timeout_s, concurrency=concurrency)
    refused = sum(1 for o in outcomes if o.error)
    degraded = sum(1 for o in outcomes if any(label.startswith("reranker") for label in o.degradations))
    if degraded:
        raise RuntimeError(
            f"the reranker degraded on {degraded} of {len(outcomes)} pseudo-queries: a measurement "
            "of it would be wrong; see `ragmesh status` and try again"
        )
    per_query = score_systems(system_runs(outcomes), qrels)
    return summarize(per_query, queries, documents, refused)


# ---------------------------------------------------------------------------- command


def format_measurement(collection: str, found: Measurement) -> str:
    gain = found.gain
    systems = ", ".join(f"{name} {value:.4f}" for name, value in found.measured.items())
    sources = ", ".join(f"{count} {name}s" for name, count in sorted(found.sources.items()))
    return "\n".join(
        [
            f"{collection}: {found.queries} pseudo-queries ({sources}) from {found.documents} documents",
            f"  nDCG@10: {systems}",
            f"  reranked - fused {gain.mean_diff:+.4f} [{gain.ci_low:+.4f}, {gain.ci_high:+.4f}] "
            f"({gain.confidence:.0%} paired bootstrap)",
            f"  choice: rerank {'on' if found.rerank else 'off'}",
        ]
    )


async def run_calibrate(args: argparse.Namespace, gateway_address: str, ingestion_address: str) -> int:
    if args.queries < MIN_QUERIES:
        raise InputError(f"--queries must be >= {MIN_QUERIES}")
    if args.concurrency < 1:
        raise InputError("--concurrency must be >= 1")
    async with gateway_client(gateway_address, ingestion_address) as client:
        if args.clear:
            await client.set_collection_calibration(args.collection, None, timeout=RPC_TIMEOUT_S)
            print(f"{args.collection}: calibration cleared (searches use the server defaults)")
            return 0
        doc_ids, documents = await sample_documents(client, args.collection, args.queries, args.seed)
        queries = await build_queries(client, args.collection, doc_ids, args.concurrency, args.timeout)
        if len(queries) < MIN_QUERIES:
            raise InputError(
                f"{args.collection}: {len(queries)} usable pseudo-queries from {documents} indexed "
                f"documents, at least {MIN_QUERIES} are needed to calibrate"
            )
        found = await measure(
            client,
            args.collection,
            queries,
            documents,
            concurrency=args.concurrency,
            timeout_s=args.timeout,
        )
        recorded = None
        if not args.dry_run:
            recorded = await client.set_collection_calibration(
                args.collection, found.calibration(), timeout=RPC_TIMEOUT_S
            )
    if args.json:
        print(json.dumps({"collection": args.collection, **found.to_dict(), "recorded": not args.dry_run}))
    else:
        print(format_measurement(args.collection, found))
        print(calibration_text(recorded) if recorded is not None else "  (dry run: nothing recorded)")
    return 0


def run(args: argparse.Namespace) -> int:
    state_dir = state_dir_of(args)
    return asyncio.run(
        run_calibrate(args, resolve_address("gateway", state_dir), resolve_address("ingestion", state_dir))
    )


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser(
        "calibrate",
        parents=[common],
        help="measure on a collection's own documents whether reranking helps it, and record the choice",
    )
    parser.add_argument("--collection", required=True)
    parser.add_argument(
        "--queries", type=int, default=DEFAULT_QUERIES, help=f"documents sampled (default {DEFAULT_QUERIES})"
    )
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    parser.add_argument("--concurrency", type=int, default=2, help="searches in flight (default 2)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per search (default 120)")
    parser.add_argument("--dry-run", action="store_true", help="measure and print; record nothing")
    parser.add_argument("--clear", action="store_true", help="remove the collection's calibration")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(func=run)
