"""``ragmesh search``: one GatewayService.Search call, printed as a ranked table (or JSON).

The request-building helpers (weights, strategy) are shared with ``ragmesh eval``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict

from ragmesh.gateway.v1 import gateway_pb2
from ragmesh.narrator.v1 import narrator_pb2
from ragmesh.planner.v1 import planner_pb2
from ragmesh_cli.channels import gateway_client
from ragmesh_cli.tables import format_table

DEFAULT_TIMEOUT_S = 30.0
SNIPPET_CHARS = 80

STRATEGIES = {
    "precise": planner_pb2.STRATEGY_PRECISE,
    "exhaustive": planner_pb2.STRATEGY_EXHAUSTIVE,
}
# Output name of each leg, in the order ``ragmesh`` shows them.
LEG_NAMES = {
    gateway_pb2.LEG_DENSE: "dense",
    gateway_pb2.LEG_BM25: "bm25",
    gateway_pb2.LEG_EXACT: "exact",
}
_LEG_LETTERS = {gateway_pb2.LEG_DENSE: "D", gateway_pb2.LEG_BM25: "B", gateway_pb2.LEG_EXACT: "E"}
ROLES = {"user": narrator_pb2.ROLE_USER, "assistant": narrator_pb2.ROLE_ASSISTANT}


def read_history(path: Path) -> list[narrator_pb2.ChatTurn]:
    """A JSON list of {"role": "user"|"assistant", "content": "..."}, oldest first."""
    try:
        turns = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"--history {path}: {exc}") from exc
    if not isinstance(turns, list):
        raise ValueError(f"--history {path}: expected a JSON list of turns")
    history = []
    for i, turn in enumerate(turns):
        if (
            not isinstance(turn, dict)
            or turn.get("role") not in ROLES
            or not isinstance(turn.get("content"), str)
        ):
            raise ValueError(f"--history {path}: turn {i} needs role user|assistant and a content string")
        history.append(narrator_pb2.ChatTurn(role=ROLES[turn["role"]], content=turn["content"]))
    return history


def searched_line(question: str, searched: str) -> str:
    """ "searched: ..." when the query searched is not the question as asked (a follow-up's
    standalone rewrite), else ""."""
    if not searched or " ".join(searched.split()) == " ".join(question.split()):
        return ""
    return f"searched: {searched}"


def parse_weights(spec: str) -> gateway_pb2.LegWeights:
    """``dense=1,bm25=1,exact=0.3`` -> LegWeights; legs left out keep the server default."""
    weights = gateway_pb2.LegWeights()
    for item in spec.split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or name not in LEG_NAMES.values():
            raise ValueError(
                f"bad weight {item.strip()!r}: expected LEG=WEIGHT with LEG one of dense,bm25,exact"
            )
        try:
            weight = float(value)
        except ValueError:
            raise ValueError(f"bad weight {item.strip()!r}: {value.strip()!r} is not a number") from None
        if not weight >= 0.0:  # also rejects NaN
            raise ValueError(f"bad weight {item.strip()!r}: weights must be >= 0")
        setattr(weights, name, weight)
    return weights


def add_request_arguments(parser: argparse.ArgumentParser, *, top_k: int, collection_default: str) -> None:
    """Options that shape a SearchRequest, common to ``search`` and ``eval``."""
    parser.add_argument(
        "--collection", default=None, help=f"collection to search (default: {collection_default})"
    )
    parser.add_argument("--top-k", type=int, default=top_k, help=f"results wanted (default {top_k})")
    parser.add_argument("--rrf-k", type=int, default=None, help="RRF constant (default: server's, 60)")
    parser.add_argument(
        "--weights", default=None, help="per-leg RRF weights, e.g. dense=1,bm25=1,exact=0.3 (0 disables)"
    )
    parser.add_argument("--strategy", choices=sorted(STRATEGIES), default=None, help="override the planner")
    parser.add_argument("--pool-size", type=int, default=0, help="candidates per leg (default: the plan's)")
    parser.add_argument("--max-variations", type=int, default=0, help="most dense-query variations")
    parser.add_argument(
        "--rerank",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="rerank the fused candidates with the cross-encoder (default: the server's setting)",
    )
    parser.add_argument(
        "--rerank-candidates",
        type=int,
        default=0,
        help="candidates reranked (default: 35 precise, 60 exhaustive)",
    )
    parser.add_argument(
        "--deadline-ms",
        type=int,
        default=None,
        help=f"per-search deadline (default {DEFAULT_TIMEOUT_S:.0f}s)",
    )


def build_request(
    args: argparse.Namespace,
    query: str,
    collection: str,
    *,
    collapse: bool,
    include_leg_results: bool = False,
    doc_ids: Sequence[str] = (),
) -> gateway_pb2.SearchRequest:
    for name in ("top_k", "pool_size", "max_variations", "rerank_candidates"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0")
    request = gateway_pb2.SearchRequest(
        collection=collection,
        query=query,
        top_k=args.top_k,
        doc_ids=list(doc_ids),
        collapse_documents=collapse,
        include_leg_results=include_leg_results,
        pool_size=args.pool_size,
        max_variations=args.max_variations,
        rerank_candidates=args.rerank_candidates,
    )
    if args.rerank is not None:
        request.rerank = args.rerank
    if args.rrf_k is not None:
        if args.rrf_k < 0:
            raise ValueError("--rrf-k must be >= 0")
        request.rrf_k = args.rrf_k
    if args.weights:
        request.weights.CopyFrom(parse_weights(args.weights))
    if args.strategy:
        request.strategy = STRATEGIES[args.strategy]
    return request


def timeout_of(args: argparse.Namespace) -> float:
    if args.deadline_ms is None:
        return DEFAULT_TIMEOUT_S
    if args.deadline_ms <= 0:
        raise ValueError("--deadline-ms must be > 0")
    return float(args.deadline_ms) / 1000.0


def request_settings(request: gateway_pb2.SearchRequest, timeout_s: float) -> dict[str, Any]:
    """What a request asked for, for reports (unset optional fields shown as None: server default)."""
    weights = {
        name: (getattr(request.weights, name) if request.weights.HasField(name) else None)
        for name in ("dense", "bm25", "exact")
    }
    strategy = next((name for name, value in STRATEGIES.items() if value == request.strategy), None)
    return {
        "collection": request.collection,
        "top_k": request.top_k,
        "rrf_k": request.rrf_k if request.HasField("rrf_k") else None,
        "weights": weights,
        "strategy": strategy,
        "pool_size": request.pool_size or None,
        "max_variations": request.max_variations or None,
        "collapse_documents": request.collapse_documents,
        "rerank": request.rerank if request.HasField("rerank") else None,
        "rerank_candidates": request.rerank_candidates or None,
        "deadline_ms": round(timeout_s * 1000.0),
    }


# ---------------------------------------------------------------------------- output


def response_to_dict(response: gateway_pb2.SearchResponse) -> dict[str, Any]:
    return MessageToDict(response, preserving_proto_field_name=True)


def leg_ranks_label(result: gateway_pb2.SearchResult) -> str:
    """``D3 B1 E-``: the result's rank in each leg, '-' where that leg did not return it."""
    ranks = {lr.leg: lr.rank for lr in result.leg_ranks}
    return " ".join(f"{_LEG_LETTERS[leg]}{ranks.get(leg, '-')}" for leg in _LEG_LETTERS)


def snippet(text: str, limit: int = SNIPPET_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _enum_label(enum: Any, value: int, prefix: str) -> str:
    name: str = enum.Name(value) if value in enum.values() else str(value)
    return name.removeprefix(prefix).lower()


def degradation_label(degradation: gateway_pb2.Degradation) -> str:
    stage = _enum_label(gateway_pb2.Stage, degradation.stage, "STAGE_")
    reason = _enum_label(gateway_pb2.DegradationReason, degradation.reason, "DEGRADATION_REASON_")
    return f"{stage}:{reason}"


def format_response(response: gateway_pb2.SearchResponse, question: str = "") -> str:
    lines: list[str] = []
    if searched := searched_line(question, response.searched_query):
        lines.append(searched)
    if response.results:
        rows = [
            (
                rank,
                result.doc_id,
                f"{result.fused_score:.4f}",
                f"{result.rerank_score:.2f}" if result.HasField("rerank_score") else "-",
                leg_ranks_label(result),
                snippet(result.title + " — " + result.text if result.title else result.text),
            )
            for rank, result in enumerate(response.results, start=1)
        ]
        lines.append(format_table(["RANK", "DOC ID", "FUSED", "RERANK", "LEGS", "TEXT"], rows))
    else:
        lines.append("no results")
    if response.HasField("plan"):
        plan = response.plan
        strategy = _enum_label(planner_pb2.Strategy, plan.strategy, "STRATEGY_")
        keywords = ", ".join(plan.hard_keywords) or "none"
        lines.append(
            f"\nplan: {strategy}, pool {plan.pool_size}, {len(plan.variations)} variation(s), "
            f"keywords: {keywords}"
        )
    if response.degradations:
        lines.append("\ndegradations:")
        for degradation in response.degradations:
            legs = ",".join(LEG_NAMES.get(leg, str(leg)) for leg in degradation.legs) or "-"
            lines.append(f"  {degradation_label(degradation)} (legs {legs}): {degradation.message}")
    if response.timings:
        timings = "  ".join(f"{t.stage} {t.ms:.1f}" for t in response.timings)
        lines.append(f"\ntimings (ms): {timings}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- command


async def search(
    address: str, request: gateway_pb2.SearchRequest, timeout_s: float
) -> gateway_pb2.SearchResponse:
    """One search through ragmesh_client (its deadline, retries, key and TLS); the contract
    message, which the table and the JSON output show whole."""
    async with gateway_client(address) as client:
        found = await client.search(request.collection, request.query, request=request, timeout=timeout_s)
    response: gateway_pb2.SearchResponse = found.raw
    return response


async def run_search(args: argparse.Namespace, address: str) -> int:
    """The whole command; errors propagate (main prints code and message, exit 1)."""
    request = build_request(
        args, args.query, args.collection or "default", collapse=args.collapse, doc_ids=args.doc or ()
    )
    if args.history:
        request.history.extend(read_history(Path(args.history)))
    response = await search(address, request, timeout_of(args))
    print(
        json.dumps(response_to_dict(response), indent=2)
        if args.json
        else format_response(response, request.query)
    )
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("query")
    add_request_arguments(parser, top_k=10, collection_default="default")
    parser.add_argument("--collapse", action="store_true", help="one result per document (its best chunk)")
    parser.add_argument(
        "--doc", nargs="+", default=None, metavar="DOC_ID", help="search only these documents"
    )
    parser.add_argument(
        "--history",
        default=None,
        metavar="FILE",
        help="earlier turns, to search a follow-up in context: a JSON list of {role, content}",
    )
    parser.add_argument("--json", action="store_true", help="the whole response as one JSON object")
