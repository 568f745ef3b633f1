"""Offline tuning of the extractive answer, its evidence gate and the support threshold.

    # once per set (a running mesh holding the collection; minutes):
    .venv/bin/python -m bench.answer_tune collect --gateway HOST:PORT --set scifact:train:200
    .venv/bin/python -m bench.answer_tune collect --gateway HOST:PORT --set scifact:test
    .venv/bin/python -m bench.answer_tune collect --gateway HOST:PORT --set qa:bench/qa/x.jsonl:tune \
        --collection scifact
    # then, in seconds, as often as wanted:
    .venv/bin/python -m bench.answer_tune tune --answerable scifact-train --unanswerable qa-x-tune

``collect`` (without ``--gateway``: BM25 and the cross-encoder in this process, a stand-in for
the mesh's search) searches each question once through the gateway (the passages an Ask reads, with
their rerank scores) and scores every candidate sentence of them against the question with the
shipped cross-encoder in this process (the same pairs the gateway sends the reranker), caching
it all under .cache/answer_tune/. ``tune`` replays services.gateway.answer.sentences.select, the code
the gateway runs, over the cache for a grid of rules and prints, per rule: answered share and
gold-cited share, citation precision and rationale recall on answerable sets, the refused share
on unanswerable ones. ``ask`` asks a question file through the gateway's Ask (answered, gold
cited, refused, p50). ``collect`` also records each question's best dense cosine, the input of
the topicality floor (``--similarity``). ``tune --write-calibration PATH`` writes one point as the
models' calibration file the gateway reads (RAGMESH_GATEWAY_MODEL_CALIBRATION_FILE).
``calibrate`` prints the score distributions of rationale sentences
(positives) against the other sentences of the gold documents and of other documents.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.answer_calibration import write_calibration
from meshkit.text.answering import coverage
from ragmesh.gateway.v1 import gateway_pb2
from ragmesh_cli.answer_eval import RATIONALE_COVERAGE, read_rationales
from ragmesh_cli.channels import gateway_client
from ragmesh_cli.datasets import BeirDataset, load_dataset
from ragmesh_cli.rerankerbuild.build import VALIDATION_SHARE
from ragmesh_cli.rerankerbuild.mining import split_claims
from services.gateway.answer.sentences import Candidate, Scored, SelectionRules, candidates, select
from services.reranker.model import CrossEncoderModel

CACHE = Path(".cache/answer_tune")
MODEL_DIR = Path("models/reranker/ragmesh-minilm-l6-ce-v1")
SCIFACT = Path("../shared/bench/scifact")
# "scifact:heldout": the train claims the shipped cross-encoder held out (see _held_out_claims).
HELD_OUT = "heldout"
TOP_K = 10
# Sentences scored per question at collection time: more than any rule reads, so the tuning
# can vary the bounds without collecting again.
COLLECT_PASSAGES = 8
COLLECT_SENTENCES = 30


def _held_out_claims(dataset: BeirDataset) -> list[str]:
    """The train claims the shipped cross-encoder was validated on and never trained on (its
    build's seeded split): the only SciFact claims on which its scores are what test claims
    get. Tuning the gate on claims it trained on tunes it to an overconfident model."""
    manifest = json.loads((MODEL_DIR / "manifest.json").read_text())
    seed = int(manifest["training"]["config"]["seed"])
    _fit, held_out = split_claims(dataset.queries, dataset.qrels, VALIDATION_SHARE, seed)
    return [qid for qid, _text, _docs in held_out]


def _questions(spec: str, limit: int | None) -> tuple[str, list[dict[str, Any]]]:
    """(set name, questions) for "scifact:<split>[:limit]" or "qa:<path>:<split>"."""
    kind, _, rest = spec.partition(":")
    if kind == "scifact":
        split, _, count = rest.partition(":")
        held_out = split == HELD_OUT
        dataset = load_dataset(SCIFACT, "train" if held_out else split, int(count) if count else limit)
        if held_out:
            dataset.queries = {qid: dataset.queries[qid] for qid in _held_out_claims(dataset)}
        rationales = read_rationales(SCIFACT, "train" if held_out else split) or {}
        return f"scifact-{split}", [
            {
                "id": qid,
                "question": text,
                "answerable": True,
                "gold": sorted(d for d, g in dataset.qrels[qid].items() if g > 0),
                "rationales": [[r.doc_id, r.sentence] for r in rationales.get(qid, [])],
            }
            for qid, text in dataset.queries.items()
        ]
    path_text, _, split = rest.rpartition(":")
    path = Path(path_text)
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if not split or r.get("split") == split]
    return f"qa-{path.stem}-{split or 'all'}", [
        {
            "id": r["id"],
            "question": r["question"],
            "answerable": bool(r["answerable"]),
            "gold": list(r.get("gold_doc_ids", [])),
            "rationales": [],
        }
        for r in rows[:limit]
    ]


async def _search(address: str, collection: str, questions: list[dict[str, Any]], concurrency: int) -> None:
    gate = asyncio.Semaphore(concurrency)
    async with gateway_client(address) as client:

        async def one(item: dict[str, Any]) -> None:
            async with gate:
                reply = await client.search(collection, item["question"], top_k=TOP_K, timeout=120)
            item["results"] = [
                {
                    "chunk_id": r.chunk_id,
                    "doc_id": r.doc_id,
                    "title": r.title,
                    "text": r.text,
                    "rerank": r.rerank_score,
                }
                for r in reply.results
            ]
            item["unknown"] = list(reply.unknown_terms)
            item["novel"] = list(reply.novel_terms)
            # The gate's topicality input, as near as a reply shows it: the best dense cosine
            # among the results (the gateway reads it over the dense leg's whole list).
            dense = [
                r.score for hit in reply.raw.results for r in hit.leg_ranks if r.leg == gateway_pb2.LEG_DENSE
            ]
            item["similarity"] = max(dense, default=None)

        await asyncio.gather(*(one(q) for q in questions))


def _score(questions: list[dict[str, Any]], threads: int) -> None:
    model = CrossEncoderModel.load(MODEL_DIR, threads=threads)
    for item in questions:
        passages = [(r["title"], r["text"]) for r in item["results"]]
        found = candidates(
            item["question"],
            passages,
            max_passages=COLLECT_PASSAGES,
            max_sentences=COLLECT_SENTENCES,
            max_pairs=10**6,
        )
        scores: list[float] = (
            model.score_pairs_with_flags([item["question"]] * len(found), [c.text for c in found])[0].tolist()
            if found
            else []
        )
        item["sentences"] = [
            [c.passage, c.position, c.text, float(s)] for c, s in zip(found, scores, strict=True)
        ]


def _local_search(questions: list[dict[str, Any]], threads: int, depth: int) -> None:
    """The mesh-free stand-in for the gateway's search (``collect-local``): BM25 over the corpus
    chunked as ingestion chunks it, the top ``depth`` chunks reranked by the cross-encoder in
    this process; no dense leg, no fusion, no blend. For tuning while no mesh holds the corpus."""
    from ragmesh_cli.rerankerbuild.mining import bm25_collection, chunk_corpus, read_beir_corpus

    corpus = chunk_corpus(read_beir_corpus(SCIFACT / "corpus.jsonl.gz"), "scifact")
    workdir = CACHE / "bm25"
    workdir.mkdir(parents=True, exist_ok=True)
    collection = bm25_collection(corpus, workdir)
    index_of = {p.chunk_id: i for i, p in enumerate(corpus.passages)}
    model = CrossEncoderModel.load(MODEL_DIR, threads=threads)
    try:
        for item in questions:
            hits = [index_of[h.chunk_id] for h in collection.search_bm25(item["question"], depth, [])]
            texts = [corpus.passages[i].text for i in hits]
            scores = (
                model.score_pairs_with_flags([item["question"]] * len(texts), texts)[0].tolist()
                if texts
                else []
            )
            ranked = sorted(zip(hits, scores, strict=True), key=lambda pair: -pair[1])[:TOP_K]
            item["results"] = [
                {
                    "chunk_id": corpus.passages[i].chunk_id,
                    "doc_id": corpus.passages[i].doc_id,
                    "title": corpus.titles[corpus.passages[i].doc_id],
                    "text": corpus.passages[i].text,
                    "rerank": score,
                }
                for i, score in ranked
            ]
    finally:
        collection.close()


def collect(args: argparse.Namespace) -> None:
    name, questions = _questions(args.set, args.limit)
    started = time.perf_counter()
    if args.gateway:
        asyncio.run(_search(args.gateway, args.collection, questions, args.concurrency))
    else:
        _local_search(questions, args.threads, args.depth)
    searched = time.perf_counter()
    _score(questions, args.threads)
    CACHE.mkdir(parents=True, exist_ok=True)
    out = CACHE / f"{name}{args.suffix}.json"
    out.write_text(json.dumps(questions))
    print(
        f"{out}: {len(questions)} questions, search {searched - started:.0f}s, "
        f"scoring {time.perf_counter() - searched:.0f}s"
    )


def _load(name: str) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads((CACHE / f"{name}.json").read_text())
    return data


def replay(
    item: dict[str, Any], rules: SelectionRules, floor: float, passages: int, max_pairs: int
) -> tuple[list[dict[str, Any]], Any]:
    """The gateway's choice for one cached question: the passages read (as Asker._evidence: when
    the search was reranked, those scored at least the floor; then the first ``passages``), the
    bounded candidates, select()."""
    results = item["results"]
    if any(r["rerank"] is not None for r in results):
        results = [r for r in results if r["rerank"] is not None and r["rerank"] >= floor]
    read = results[:passages]
    index = {id(r): i for i, r in enumerate(item["results"])}
    position = {index[id(r)]: k for k, r in enumerate(read)}
    cached = {(p, s): (text, score) for p, s, text, score in item["sentences"]}
    wanted = candidates(
        item["question"],
        [(r["title"], r["text"]) for r in read],
        max_passages=passages,
        max_sentences=COLLECT_SENTENCES,
        max_pairs=max_pairs,
    )
    original = {k: p for p, k in position.items()}
    scored = []
    for c in wanted:
        key = (original[c.passage], c.position)
        if key in cached:
            scored.append(Scored(Candidate(c.passage, c.position, c.text), cached[key][1]))
    passage_scores = [r["rerank"] if r["rerank"] is not None else floor for r in read]
    texts = [r["text"] for r in read]
    return read, select(
        item["question"],
        scored,
        texts,
        passage_scores,
        rules,
        item.get("unknown", []),
        item.get("similarity"),
        item.get("novel", []),
    )


def evaluate(
    sets: Sequence[list[dict[str, Any]]], rules: SelectionRules, floor: float, passages: int, max_pairs: int
) -> dict[str, float]:
    answered = gold_cited = citations = gold_citations = hits = total_rationales = refused = unanswerable = 0
    answerable = total_facts = rationale_facts = with_rationales = 0
    for questions in sets:
        for item in questions:
            read, chosen = replay(item, rules, floor, passages, max_pairs)
            if not item["answerable"]:
                unanswerable += 1
                refused += not chosen.answered
                continue
            answerable += 1
            gold = set(item["gold"])
            cited_docs = {read[s.passage]["doc_id"] for s in chosen.answer}
            answered += chosen.answered
            gold_cited += bool(cited_docs & gold)
            citations += len(cited_docs)
            gold_citations += len(cited_docs & gold)
            facts = [(read[s.passage]["doc_id"], s.text) for s in chosen.facts]
            rationales = item["rationales"]
            total_rationales += len(rationales)
            hits += sum(any(_covers(r, fact) for fact in facts) for r in rationales)
            if rationales:
                with_rationales += 1
                total_facts += len(facts)
                rationale_facts += sum(any(_covers(r, fact) for r in rationales) for fact in facts)
    return {
        "answered": answered / answerable if answerable else float("nan"),
        "gold_cited": gold_cited / answerable if answerable else float("nan"),
        "precision": gold_citations / citations if citations else float("nan"),
        "rationale_recall": hits / total_rationales if total_rationales else float("nan"),
        # Share of the facts (of questions with rationales) that are a rationale sentence.
        "fact_precision": rationale_facts / total_facts if total_facts else float("nan"),
        "facts_per_question": total_facts / with_rationales if with_rationales else float("nan"),
        "refused": refused / unanswerable if unanswerable else float("nan"),
    }


def _covers(rationale: Sequence[str], fact: tuple[str, str]) -> bool:
    """A fact of the rationale's document holding enough of its words (as ragmesh eval counts)."""
    return fact[0] == rationale[0] and coverage(rationale[1], fact[1]) >= RATIONALE_COVERAGE


# The replay grid: each option takes several values and names the SelectionRules field it
# sets ("floor": the passage floor, ask_min_rerank_score); tune replays every point.
GRID: tuple[tuple[str, str, type, float], ...] = (
    ("--gate", "gate_min_score", float, 0.0),
    ("--coverage", "gate_coverage_weight", float, 0.0),
    ("--unknown", "gate_unknown_weight", float, 0.0),
    ("--unknown-penalty", "gate_unknown_penalty", float, 0.0),
    ("--novel", "gate_novel_weight", float, 0.0),
    ("--similarity", "gate_min_similarity", float, -1.0),
    ("--floor", "floor", float, -2.0),
    ("--weight", "sentence_weight", float, 0.5),
    ("--margin", "cite_margin", float, 1.0),
    ("--max-cited", "max_cited_passages", int, 2),
    ("--per-passage", "sentences_per_passage", int, 2),
    ("--sentence-margin", "sentence_margin", float, 1.0),
)


def tune(args: argparse.Namespace) -> None:
    answerable = [_load(n) for n in args.answerable]
    unanswerable = [_load(n) for n in args.unanswerable]
    axes = [getattr(args, option[2:].replace("-", "_")) for option, *_ in GRID]
    if getattr(args, "write_calibration", None):
        fields = [field for _option, field, *_ in GRID]
        write_calibration(
            args.write_calibration,
            fields,
            axes,
            fact_min=args.fact_min,
            fact_passage_weight=args.fact_passage_weight,
        )
    for point in itertools.product(*axes):
        values = {field: value for (_option, field, *_), value in zip(GRID, point, strict=True)}
        floor = values.pop("floor")
        rules = SelectionRules(
            **values,
            fact_min_score=args.fact_min,
            max_facts=args.max_facts,
            fact_passage_weight=args.fact_passage_weight,
        )
        a = evaluate(answerable, rules, floor, args.passages, args.max_pairs)
        u = evaluate(unanswerable, rules, floor, args.passages, args.max_pairs)
        # Each set on its own too: a small set's refusals are lost in a pooled share.
        each = [
            f"{name}: answered {m['answered']:.3f} gold {m['gold_cited']:.3f} prec {m['precision']:.3f}"
            + _fact_figures(m)
            for name, m in _per_set(args.answerable, answerable, rules, floor, args)
        ] + [
            f"{name}: refused {m['refused']:.3f}"
            for name, m in _per_set(args.unanswerable, unanswerable, rules, floor, args)
        ]
        print(
            " ".join(f"{option[2:]} {value:g}" for (option, *_), value in zip(GRID, point, strict=True))
            + f" | answered {a['answered']:.3f} gold {a['gold_cited']:.3f} prec {a['precision']:.3f}"
            f" rat {a['rationale_recall']:.3f} | refused {u['refused']:.3f}"
            + "".join(f"\n    {line}" for line in each)
        )


def _fact_figures(m: dict[str, float]) -> str:
    if m["rationale_recall"] != m["rationale_recall"]:  # NaN: the set has no rationales
        return ""
    return (
        f" rat {m['rationale_recall']:.3f} fact prec {m['fact_precision']:.3f}"
        f" facts/q {m['facts_per_question']:.1f}"
    )


def _per_set(
    names: Sequence[str],
    sets: Sequence[list[dict[str, Any]]],
    rules: SelectionRules,
    floor: float,
    args: argparse.Namespace,
) -> list[tuple[str, dict[str, float]]]:
    """Each named cached set evaluated alone (only when there are several)."""
    if len(sets) < 2:
        return []
    return [
        (name, evaluate([questions], rules, floor, args.passages, args.max_pairs))
        for name, questions in zip(names, sets, strict=True)
    ]


def calibrate(args: argparse.Namespace) -> None:
    """Scores of rationale sentences against other sentences of gold and of other documents."""
    positives, same_doc, other_doc = [], [], []
    for name in args.answerable:
        for item in _load(name):
            rationale = {(d, s) for d, s in item["rationales"]}
            for p, _s, text, score in item["sentences"]:
                doc = item["results"][p]["doc_id"]
                if any(d == doc and coverage(s, text) >= 0.9 for d, s in rationale):
                    positives.append(score)
                elif doc in item["gold"]:
                    same_doc.append(score)
                else:
                    other_doc.append(score)
    for label, values in (
        ("rationale", positives),
        ("gold, not rationale", same_doc),
        ("other docs", other_doc),
    ):
        if values:
            qs = statistics.quantiles(values, n=20)
            print(
                f"{label:22s} n={len(values):6d} "
                + " ".join(f"p{5 * (i + 1)} {qs[i]:6.2f}" for i in (0, 4, 9, 14, 18))
            )
    for t in args.gate:
        pos = sum(v >= t for v in positives) / max(1, len(positives))
        neg = sum(v < t for v in same_doc + other_doc) / max(1, len(same_doc + other_doc))
        print(f"threshold {t:5.1f}: rationale accepted {pos:.3f}, non-rationale rejected {neg:.3f}")


async def _ask_all(address: str, collection: str, questions: list[dict[str, Any]], concurrency: int) -> None:
    gate = asyncio.Semaphore(concurrency)
    async with gateway_client(address) as client:

        async def one(item: dict[str, Any]) -> None:
            async with gate:
                started = time.perf_counter()
                reply = await client.ask(collection, item["question"], mode="extractive", timeout=120)
            item["ms"] = (time.perf_counter() - started) * 1000
            item["answered"] = reply.answered
            item["cited"] = sorted({c.doc_id for c in reply.citations})
            item["answer"] = reply.text

        await asyncio.gather(*(one(q) for q in questions))


def ask(args: argparse.Namespace) -> None:
    """Each question of a question file asked (extractive) through the gateway: answered and
    gold-cited shares on the answerable ones, the refused share on the others."""
    _name, questions = _questions(args.set, None)
    asyncio.run(_ask_all(args.gateway, args.collection, questions, args.concurrency))
    answerable = [q for q in questions if q["answerable"]]
    other = [q for q in questions if not q["answerable"]]
    if answerable:
        answered = sum(q["answered"] for q in answerable) / len(answerable)
        gold = sum(bool(set(q["cited"]) & set(q["gold"])) for q in answerable) / len(answerable)
        print(f"answerable {len(answerable)}: answered {answered:.3f}, gold cited {gold:.3f}")
    if other:
        refused = sum(not q["answered"] for q in other) / len(other)
        print(f"unanswerable {len(other)}: refused {refused:.3f}")
    times = sorted(q["ms"] for q in questions)
    print(f"Ask p50 {times[len(times) // 2]:.0f} ms")
    if args.verbose:
        for q in questions:
            print(
                q["answerable"],
                q["answered"],
                q["gold"],
                q["cited"],
                q["question"][:60],
                "|",
                q["answer"][:100],
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--gateway", default="", help="a mesh's gateway; none: BM25 + cross-encoder in process")
    c.add_argument("--depth", type=int, default=20, help="without --gateway: BM25 chunks reranked")
    c.add_argument("--set", required=True)
    c.add_argument("--collection", default="scifact")
    c.add_argument("--limit", type=int, default=None)
    c.add_argument("--concurrency", type=int, default=2)
    c.add_argument("--threads", type=int, default=1)
    c.add_argument("--suffix", default="", help="appended to the cache name (e.g. -on-grpc)")
    a = sub.add_parser("ask")
    a.add_argument("--gateway", required=True)
    a.add_argument("--set", required=True)
    a.add_argument("--collection", default="grpc-docs")
    a.add_argument("--concurrency", type=int, default=2)
    a.add_argument("--verbose", action="store_true")
    for name in ("tune", "calibrate"):
        t = sub.add_parser(name)
        t.add_argument("--answerable", nargs="*", default=[])
        t.add_argument("--unanswerable", nargs="*", default=[])
        for option, field, kind, default in GRID:
            t.add_argument(option, nargs="+", type=kind, default=[kind(default)], help=f"{field} values")
        t.add_argument("--fact-min", type=float, default=0.0)
        t.add_argument("--max-facts", type=int, default=8)
        t.add_argument("--fact-passage-weight", type=float, default=0.0)
        t.add_argument("--passages", type=int, default=6)
        t.add_argument("--max-pairs", type=int, default=48)
    sub.choices["tune"].add_argument(
        "--write-calibration", default=None, metavar="PATH", help="write the one point as a calibration file"
    )
    args = parser.parse_args()
    {"collect": collect, "tune": tune, "calibrate": calibrate, "ask": ask}[args.command](args)


if __name__ == "__main__":
    main()
