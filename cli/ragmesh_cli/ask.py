"""``ragmesh ask``: a cited answer through GatewayService.AskStream, written to the terminal as
it is produced, then the verified answer with its sources (or one JSON object with --json).

``stream_ask`` is shared with ``ragmesh eval --answers``, which times the same stream.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from google.protobuf.json_format import MessageToDict

from ragmesh.gateway.v1 import gateway_pb2
from ragmesh.planner.v1 import planner_pb2
from ragmesh_cli.channels import gateway_client
from ragmesh_cli.search import STRATEGIES, degradation_label, read_history, searched_line, snippet
from ragmesh_client import Answer, AskDelta, AskEvent, AskProgress, AsyncClient

DEFAULT_TIMEOUT_S = 120.0
MODES = {"llm": gateway_pb2.ANSWER_MODE_LLM, "extractive": gateway_pb2.ANSWER_MODE_EXTRACTIVE}
HYDE_MODES = {
    "off": planner_pb2.HYDE_MODE_OFF,
    "fusion": planner_pb2.HYDE_MODE_FUSION,
    "supplement": planner_pb2.HYDE_MODE_SUPPLEMENT,
}


@dataclass
class TimedAnswer:
    response: gateway_pb2.AskResponse
    # Seconds from the call to the first text delta (None: the answer came without deltas).
    first_token_s: float | None
    total_s: float


async def stream_ask(
    client: AsyncClient,
    request: gateway_pb2.AskRequest,
    timeout_s: float,
    on_event: Callable[[AskEvent], None] | None = None,
) -> TimedAnswer:
    """One streamed answer (ragmesh_client.ask_stream): the verified answer's message and how
    long the first text and the whole took. Failures raise ragmesh_client.RagmeshError."""
    started = time.perf_counter()
    first: float | None = None
    answer: gateway_pb2.AskResponse | None = None
    events = client.ask_stream(request.collection, request.query, request=request, timeout=timeout_s)
    async for event in events:
        if on_event is not None:
            on_event(event)
        if isinstance(event, AskDelta) and first is None and event.text.strip():
            first = time.perf_counter() - started
        elif isinstance(event, Answer):
            answer = event.raw
    if answer is None:
        raise RuntimeError("the stream ended without an answer")
    return TimedAnswer(answer, first, time.perf_counter() - started)


def build_request(args: argparse.Namespace) -> gateway_pb2.AskRequest:
    if args.passages < 0:
        raise ValueError("--passages must be >= 0")
    request = gateway_pb2.AskRequest(
        collection=args.collection,
        query=args.question,
        passages=args.passages,
        doc_ids=args.doc or [],
        include_facts=args.facts,
    )
    if args.mode:
        request.mode = MODES[args.mode]
    if args.hyde:
        request.hyde_mode = HYDE_MODES[args.hyde]
    if args.strategy:
        request.strategy = STRATEGIES[args.strategy]
    if args.rerank is not None:
        request.rerank = args.rerank
    if args.history:
        request.history.extend(read_history(Path(args.history)))
    return request


def format_answer(response: gateway_pb2.AskResponse, question: str = "") -> str:
    """The verified answer and everything a reader needs to check it."""
    lines = [response.answer]
    if searched := searched_line(question, response.searched_query):
        lines.append(f"\n{searched}")
    if response.citations:
        lines.append("\nsources:")
        for citation in response.citations:
            title = f"{citation.title} — " if citation.title else ""
            where = f"{citation.doc_id} ({citation.chunk_id})"
            lines.append(f"  [{citation.number}] {where}: {title}{snippet(citation.snippet, 100)}")
    if response.contradictions:
        lines.append("\nsources disagree:")
        for item in response.contradictions:
            lines.append(f"  {', '.join(f'[{n}]' for n in item.sources)}: {item.description}")
    if response.facts:
        lines.append("\nfacts (score, best first):")
        for fact in response.facts:
            lines.append(f"  {fact.score:+6.2f} {fact.doc_id}: {snippet(fact.text, 100)}")
    explored = len(response.sources)
    cited = sum(1 for s in response.sources if s.cited)
    mode = gateway_pb2.AnswerMode.Name(response.mode).removeprefix("ANSWER_MODE_").lower()
    lines.append(f"\n{cited} of {explored} passages read are cited; mode {mode}")
    for degradation in response.degradations:
        lines.append(f"degraded {degradation_label(degradation)}: {degradation.message}")
    if response.timings:
        lines.append("timings (ms): " + "  ".join(f"{t.stage} {t.ms:.0f}" for t in response.timings))
    return "\n".join(lines)


def _printer(out: TextIO) -> Callable[[AskEvent], None]:
    """Progress to stderr, the text as it is written to ``out``."""

    def show(event: AskEvent) -> None:
        if isinstance(event, AskProgress):
            print(f"[{event.stage}: {event.count} in {event.ms:.0f} ms]", file=sys.stderr, flush=True)
        elif isinstance(event, AskDelta):
            out.write(event.text)
            out.flush()

    return show


async def run_ask(args: argparse.Namespace, address: str) -> int:
    request = build_request(args)
    timeout = DEFAULT_TIMEOUT_S if args.deadline_ms is None else args.deadline_ms / 1000.0
    async with gateway_client(address) as client:
        if args.json:
            timed = await stream_ask(client, request, timeout)
            document: dict[str, Any] = MessageToDict(timed.response, preserving_proto_field_name=True)
            document["first_token_ms"] = (
                None if timed.first_token_s is None else round(timed.first_token_s * 1000, 1)
            )
            document["total_ms"] = round(timed.total_s * 1000, 1)
            print(json.dumps(document, indent=2))
            return 0
        timed = await stream_ask(client, request, timeout, _printer(sys.stdout))
    if timed.first_token_s is not None:
        # What streamed was the model's draft; verification may have changed it.
        print("\n\nverified answer:")
    print(format_answer(timed.response, request.query))
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("question")
    parser.add_argument("--collection", default="default")
    parser.add_argument(
        "--mode", choices=sorted(MODES), default=None, help="llm or extractive (default: the server's)"
    )
    parser.add_argument(
        "--passages", type=int, default=0, help="passages read for evidence (default: the server's)"
    )
    parser.add_argument(
        "--hyde", choices=sorted(HYDE_MODES), default=None, help="HyDE mode (default: the planner's)"
    )
    parser.add_argument("--strategy", choices=sorted(STRATEGIES), default=None, help="override the planner")
    parser.add_argument(
        "--rerank", action=argparse.BooleanOptionalAction, default=None, help="rerank (default: the server's)"
    )
    parser.add_argument(
        "--doc", nargs="+", default=None, metavar="DOC_ID", help="answer only from these documents"
    )
    parser.add_argument(
        "--history", default=None, metavar="FILE", help="earlier turns: a JSON list of {role, content}"
    )
    parser.add_argument("--facts", action="store_true", help="also show the extracted facts")
    parser.add_argument(
        "--deadline-ms", type=int, default=None, help=f"deadline (default {DEFAULT_TIMEOUT_S:.0f}s)"
    )
    parser.add_argument(
        "--json", action="store_true", help="the verified answer as one JSON object, with timings"
    )
