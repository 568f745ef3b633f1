"""``ragmesh eval --answers``: quality and speed of cited answers on a BEIR-style dataset with
rationales (SciFact's ``rationales_<split>.jsonl``), per answer mode.

For each judged query and each mode, one GatewayService.AskStream call (facts included) gives:
- ``gold_cited_share``: share of answers citing at least one gold (qrels-relevant) document;
- ``rationale_recall``: share of gold rationale sentences found among the extracted facts: a
  sentence counts when a fact from its document covers at least ``RATIONALE_COVERAGE`` of its
  content words (LLM facts paraphrase, so exact matching would undercount them);
- ``valid_citation_share``: share of answer sentences (answered answers) whose every citation
  names a passage the answer was given (goal: 100%); a sentence with no citation is invalid;
- ``citation_precision``: share of all citations (answered answers) that point to a gold document;
- ``supported_share``: share of answer sentences the support check accepted: quoted from a
  cited passage, or scored by the cross-encoder against the cited passages and kept (a sentence
  checked only lexically, the reranker being down, is not counted as supported);
- ``answered_share``: answers that did not say "the documents do not say";
- ``unanswerable_refused_share`` (with ``--unanswerable FILE``): share of the file's questions
  (answerable false, of ``--unanswerable-split``) that got "the documents do not say";
- ``llm_written_share``: answers whose text the LLM wrote and verification kept (the rest fell
  back to the extractive answer, with a degradation saying why);
- time to the first text delta and total time, p50 and p95, measured at the client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from meshkit.text.answering import cited_numbers, coverage
from ragmesh.gateway.v1 import gateway_pb2
from ragmesh.narrator.v1 import narrator_pb2
from ragmesh_cli.ask import MODES, TimedAnswer, stream_ask
from ragmesh_cli.channels import gateway_client
from ragmesh_cli.datasets import BeirDataset, load_dataset
from ragmesh_cli.documents import InputError, sanitize_doc_id
from ragmesh_cli.evaluation import FATAL_CODES, ensure_ingested
from ragmesh_cli.search import degradation_label
from ragmesh_cli.stats import percentile
from ragmesh_cli.tables import format_table
from ragmesh_client import AsyncClient, RagmeshError

# A rationale sentence is "present" among the facts when one fact of its document holds this
# share of its content words.
RATIONALE_COVERAGE = 0.6
DEFAULT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Rationale:
    doc_id: str
    sentence: str


@dataclass
class AnswerOutcome:
    query_id: str
    timed: TimedAnswer | None
    error: str | None = None


@dataclass
class ModeScores:
    gold_cited: list[float] = field(default_factory=list)
    rationale_hits: int = 0
    rationale_total: int = 0
    valid_sentences: int = 0
    answer_sentences: int = 0
    supported_sentences: int = 0
    citations: int = 0
    gold_citations: int = 0
    refused: list[float] = field(default_factory=list)
    answered: list[float] = field(default_factory=list)
    llm_written: list[float] = field(default_factory=list)
    first_token_ms: list[float] = field(default_factory=list)
    total_ms: list[float] = field(default_factory=list)
    degradations: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)


def read_rationales(root: Path, split: str) -> dict[str, list[Rationale]] | None:
    """query id -> gold rationale sentences (None when the dataset has no rationales file)."""
    path = root / f"rationales_{split}.jsonl"
    if not path.is_file():
        return None
    rationales: dict[str, list[Rationale]] = {}
    with path.open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                evidence = record.get("evidence") or {}
                rationales[str(record["_id"])] = [
                    Rationale(sanitize_doc_id(str(doc_id)), text)
                    for doc_id, sets in evidence.items()
                    for entry in sets
                    for text in entry.get("sentence_texts", [])
                ]
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise InputError(f"{path}:{lineno}: not a rationale record ({exc})") from exc
    return rationales


def valid_sentences(response: gateway_pb2.AskResponse) -> tuple[int, int]:
    """(valid, total) answer sentences: valid when it cites, and every number it cites is one
    of the answer's citations pointing at a passage the answer read."""
    read = {source.chunk_id for source in response.sources}
    bound = {c.number for c in response.citations if c.chunk_id in read}
    numbers = [cited_numbers(s.text) or list(s.sources) for s in response.sentences]
    return sum(1 for n in numbers if n and set(n) <= bound), len(numbers)


SUPPORTED_CHECKS = (narrator_pb2.SUPPORT_CHECK_QUOTED, narrator_pb2.SUPPORT_CHECK_CROSS_ENCODER)


def supported_sentences(response: gateway_pb2.AskResponse) -> int:
    """Answer sentences the support check accepted (see the module docstring)."""
    return sum(1 for s in response.sentences if s.support_check in SUPPORTED_CHECKS)


def gold_citations(response: gateway_pb2.AskResponse, gold: set[str]) -> tuple[int, int]:
    """(citations pointing to a gold document, all citations) of one answer."""
    return sum(1 for c in response.citations if c.doc_id in gold), len(response.citations)


def read_unanswerable(path: Path, split: str) -> dict[str, str]:
    """id -> question of the answerability file's unanswerable questions of ``split`` (all
    splits when empty); one JSON object a line: id, question, answerable, split."""
    questions: dict[str, str] = {}
    with path.open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if record["answerable"] or (split and record.get("split") != split):
                    continue
                questions[str(record["id"])] = str(record["question"])
            except (ValueError, KeyError, TypeError) as exc:
                raise InputError(f"{path}:{lineno}: not a question record ({exc})") from exc
    if not questions:
        raise InputError(f"{path}: no unanswerable questions in split {split!r}")
    return questions


def score_refusals(outcomes: Sequence[AnswerOutcome], scores: ModeScores) -> None:
    """Adds each unanswerable question's verdict (refused: answered=false) to ``scores``."""
    for outcome in outcomes:
        if outcome.timed is None:
            scores.errors[(outcome.error or "").split(":", 1)[0]] += 1
            continue
        scores.refused.append(0.0 if outcome.timed.response.answered else 1.0)


def rationale_hits(response: gateway_pb2.AskResponse, gold: Sequence[Rationale]) -> int:
    facts_by_doc: dict[str, list[str]] = {}
    for fact in response.facts:
        facts_by_doc.setdefault(fact.doc_id, []).append(fact.text)
    return sum(
        1
        for item in gold
        if any(
            coverage(item.sentence, fact) >= RATIONALE_COVERAGE for fact in facts_by_doc.get(item.doc_id, [])
        )
    )


def score_mode(
    outcomes: Sequence[AnswerOutcome], dataset: BeirDataset, rationales: Mapping[str, list[Rationale]] | None
) -> ModeScores:
    scores = ModeScores()
    for outcome in outcomes:
        if outcome.timed is None:
            scores.errors[(outcome.error or "").split(":", 1)[0]] += 1
            continue
        response = outcome.timed.response
        gold = {doc for doc, grade in dataset.qrels[outcome.query_id].items() if grade > 0}
        scores.gold_cited.append(1.0 if any(c.doc_id in gold for c in response.citations) else 0.0)
        scores.answered.append(1.0 if response.answered else 0.0)
        scores.llm_written.append(1.0 if response.mode == gateway_pb2.ANSWER_MODE_LLM else 0.0)
        if response.answered:
            valid, total = valid_sentences(response)
            scores.valid_sentences += valid
            scores.answer_sentences += total
            scores.supported_sentences += supported_sentences(response)
            on_gold, cited = gold_citations(response, gold)
            scores.gold_citations += on_gold
            scores.citations += cited
        if rationales is not None:
            gold_sentences = rationales.get(outcome.query_id, [])
            scores.rationale_hits += rationale_hits(response, gold_sentences)
            scores.rationale_total += len(gold_sentences)
        if outcome.timed.first_token_s is not None:
            scores.first_token_ms.append(outcome.timed.first_token_s * 1000)
        scores.total_ms.append(outcome.timed.total_s * 1000)
        scores.degradations.update(degradation_label(d) for d in response.degradations)
    return scores


def _share(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(values, 50, method="linear", empty=0.0), 1),
        "p95": round(percentile(values, 95, method="linear", empty=0.0), 1),
    }


def mode_report(scores: ModeScores) -> dict[str, Any]:
    return {
        "gold_cited_share": _share(scores.gold_cited),
        "rationale_recall": round(scores.rationale_hits / scores.rationale_total, 4)
        if scores.rationale_total
        else None,
        "valid_citation_share": round(scores.valid_sentences / scores.answer_sentences, 4)
        if scores.answer_sentences
        else None,
        "citation_precision": round(scores.gold_citations / scores.citations, 4)
        if scores.citations
        else None,
        "supported_share": round(scores.supported_sentences / scores.answer_sentences, 4)
        if scores.answer_sentences
        else None,
        "answered_share": _share(scores.answered),
        "unanswerable_refused_share": _share(scores.refused),
        "unanswerable_questions": len(scores.refused),
        "llm_written_share": _share(scores.llm_written),
        "answers": len(scores.total_ms),
        "answer_sentences": scores.answer_sentences,
        "rationale_sentences": scores.rationale_total,
        "first_token_ms": _spread(scores.first_token_ms),
        "total_ms": _spread(scores.total_ms),
        "degradations": dict(scores.degradations),
        "failed": dict(scores.errors),
    }


async def collect_answers(
    client: AsyncClient,
    requests: Mapping[str, gateway_pb2.AskRequest],
    *,
    timeout_s: float,
    concurrency: int,
    label: str,
) -> list[AnswerOutcome]:
    if concurrency < 1:
        raise ValueError("--concurrency must be >= 1")
    gate = asyncio.Semaphore(concurrency)

    async def one(query_id: str, request: gateway_pb2.AskRequest) -> AnswerOutcome:
        async with gate:
            try:
                return AnswerOutcome(query_id, await stream_ask(client, request, timeout_s))
            except RagmeshError as exc:
                if exc.code in FATAL_CODES:
                    raise
                return AnswerOutcome(query_id, None, f"{exc.code.name}: {exc.message}")

    tasks = [asyncio.ensure_future(one(qid, req)) for qid, req in requests.items()]
    outcomes: list[AnswerOutcome] = []
    try:
        with tqdm(total=len(tasks), desc=f"answers ({label})", unit="q", file=sys.stderr) as bar:
            for next_done in asyncio.as_completed(tasks):
                outcomes.append(await next_done)
                bar.update(1)
    finally:
        for task in tasks:
            task.cancel()
    return outcomes


def format_answer_report(report: Mapping[str, Any]) -> str:
    def fmt(value: Any) -> str:
        return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)

    rows = [
        (
            mode,
            fmt(r["gold_cited_share"]),
            fmt(r["rationale_recall"]),
            fmt(r["valid_citation_share"]),
            fmt(r["citation_precision"]),
            fmt(r["supported_share"]),
            fmt(r["answered_share"]),
            fmt(r["unanswerable_refused_share"]),
            fmt(r["llm_written_share"]),
            f"{r['first_token_ms']['p50']:.0f}/{r['first_token_ms']['p95']:.0f}",
            f"{r['total_ms']['p50']:.0f}/{r['total_ms']['p95']:.0f}",
            sum(r["failed"].values()),
        )
        for mode, r in report["modes"].items()
    ]
    headers = [
        "MODE",
        "GOLD CITED",
        "RATIONALE R",
        "VALID CIT",
        "CIT PREC",
        "SUPPORTED",
        "ANSWERED",
        "REFUSED UNANS",
        "LLM TEXT",
        "TTFT p50/p95",
        "TOTAL p50/p95",
        "FAILED",
    ]
    settings = report["settings"]
    lines = [
        f"{report['dataset']} ({report['split']}): {report['queries']} queries, "
        f"{settings['passages'] or 'default'} passages, concurrency {settings['concurrency']}",
        format_table(headers, rows),
    ]
    for mode, r in report["modes"].items():
        if r["degradations"]:
            lines.append(
                f"{mode} degradations: " + ", ".join(f"{k} {v}" for k, v in r["degradations"].items())
            )
    return "\n".join(lines)


async def run_answer_eval(args: argparse.Namespace, gateway_address: str, ingestion_address: str) -> int:
    """Exits 1 when some answers failed outright (a degraded answer is an answer)."""
    if not args.dataset:
        raise InputError("--dataset is required")
    if args.limit is not None and args.limit < 1:
        raise ValueError("--limit must be >= 1")
    dataset = await asyncio.to_thread(load_dataset, Path(args.dataset), args.split, args.limit)
    if not dataset.queries:
        raise InputError(f"{args.dataset}: no judged queries in split {args.split!r}")
    rationales = await asyncio.to_thread(read_rationales, dataset.root, args.split)
    unanswerable = (
        await asyncio.to_thread(read_unanswerable, Path(args.unanswerable), args.unanswerable_split)
        if args.unanswerable
        else {}
    )
    collection = args.collection or dataset.name
    if args.ingest:
        await ensure_ingested(
            dataset,
            collection,
            ingestion_address,
            timeout_s=args.ingest_timeout,
            max_in_flight=args.in_flight,
        )
    timeout_s = DEFAULT_TIMEOUT_S if args.deadline_ms is None else args.deadline_ms / 1000.0
    modes: dict[str, Any] = {}
    async with gateway_client(gateway_address) as client:
        for mode in args.modes:
            requests = {
                qid: gateway_pb2.AskRequest(
                    collection=collection,
                    query=text,
                    mode=MODES[mode],
                    passages=args.passages,
                    include_facts=True,
                )
                for qid, text in dataset.queries.items()
            }
            outcomes = await collect_answers(
                client, requests, timeout_s=timeout_s, concurrency=args.concurrency, label=mode
            )
            scores = score_mode(outcomes, dataset, rationales)
            if unanswerable:
                asked = {
                    qid: gateway_pb2.AskRequest(
                        collection=collection, query=text, mode=MODES[mode], passages=args.passages
                    )
                    for qid, text in unanswerable.items()
                }
                refusals = await collect_answers(
                    client,
                    asked,
                    timeout_s=timeout_s,
                    concurrency=args.concurrency,
                    label=f"{mode}, unanswerable",
                )
                score_refusals(refusals, scores)
            modes[mode] = mode_report(scores)
    report = {
        "dataset": dataset.name,
        "split": dataset.split,
        "queries": len(dataset.queries),
        "rationale_coverage": RATIONALE_COVERAGE,
        "settings": {
            "passages": args.passages or None,
            "concurrency": args.concurrency,
            "deadline_ms": round(timeout_s * 1000),
            "limit": args.limit,
            "unanswerable": args.unanswerable or None,
            "unanswerable_split": args.unanswerable_split if args.unanswerable else None,
        },
        "modes": modes,
    }
    print(json.dumps(report, indent=2) if args.json else format_answer_report(report))
    return 1 if any(r["failed"] for r in modes.values()) else 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options only ``--answers`` reads (the dataset, split, limit and ingest options are eval's)."""
    parser.add_argument(
        "--answers", action="store_true", help="evaluate cited answers (Ask) instead of retrieval"
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=sorted(MODES),
        default=["extractive", "llm"],
        help="with --answers: answer modes to evaluate (default: extractive llm)",
    )
    parser.add_argument(
        "--passages", type=int, default=0, help="with --answers: passages read per answer (default: server's)"
    )
    parser.add_argument(
        "--unanswerable",
        default=None,
        metavar="FILE",
        help="with --answers: an answerability file (JSON lines: id, question, answerable, split) whose "
        "unanswerable questions are asked too; adds unanswerable_refused_share",
    )
    parser.add_argument(
        "--unanswerable-split",
        default="test",
        help="with --unanswerable: the split asked (default test; empty: all)",
    )
