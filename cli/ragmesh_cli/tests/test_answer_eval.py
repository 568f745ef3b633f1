"""The answer evaluation's scores (ragmesh eval --answers): citation precision, supported share
and the refused share on unanswerable questions, next to the existing keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragmesh.gateway.v1 import gateway_pb2
from ragmesh.narrator.v1 import narrator_pb2
from ragmesh_cli.answer_eval import (
    AnswerOutcome,
    mode_report,
    read_unanswerable,
    score_mode,
    score_refusals,
)
from ragmesh_cli.ask import TimedAnswer
from ragmesh_cli.documents import InputError
from ragmesh_cli.evaluation import BeirDataset

QUOTED = narrator_pb2.SUPPORT_CHECK_QUOTED
JUDGED = narrator_pb2.SUPPORT_CHECK_CROSS_ENCODER
LEXICAL = narrator_pb2.SUPPORT_CHECK_LEXICAL


def answer(citations: list[str], checks: list[int], answered: bool = True) -> AnswerOutcome:
    response = gateway_pb2.AskResponse(answered=answered)
    for number, doc in enumerate(citations, 1):
        response.sources.append(gateway_pb2.ExploredSource(chunk_id=f"{doc}#{number}", doc_id=doc))
        response.citations.append(
            gateway_pb2.AnswerCitation(number=number, doc_id=doc, chunk_id=f"{doc}#{number}")
        )
    for check in checks:
        response.sentences.append(
            narrator_pb2.Sentence(text="A sentence [1].", sources=[1], support_check=check)
        )
    return AnswerOutcome("q", TimedAnswer(response, None, 1.0))


def dataset(qrels: dict[str, dict[str, int]]) -> BeirDataset:
    return BeirDataset("d", Path("."), "test", Path("c"), {q: q for q in qrels}, qrels)


def scored(outcomes: list[AnswerOutcome], qrels: dict[str, dict[str, int]]) -> dict[str, object]:
    for i, outcome in enumerate(outcomes):
        outcome.query_id = f"q{i}"
    return mode_report(
        score_mode(outcomes, dataset({f"q{i}": q for i, q in enumerate(qrels.values())}), None)
    )


def test_citation_precision_is_the_share_of_all_citations_on_a_gold_document() -> None:
    report = scored(
        [answer(["gold", "other"], [QUOTED]), answer(["other", "other2", "gold2"], [QUOTED])],
        {"a": {"gold": 1}, "b": {"gold2": 1}},
    )
    # 2 of 5 citations point to gold documents; both answers cite one (the existing key).
    assert report["citation_precision"] == 0.4
    assert report["gold_cited_share"] == 1.0


def test_supported_share_counts_quoted_and_judged_sentences_not_lexical_ones() -> None:
    report = scored([answer(["gold"], [QUOTED, JUDGED, LEXICAL, LEXICAL])], {"a": {"gold": 1}})
    assert report["supported_share"] == 0.5
    assert report["answer_sentences"] == 4


def test_refusals_on_unanswerable_questions_are_their_own_share() -> None:
    scores = score_mode([], dataset({}), None)
    refused = answer([], [], answered=False)
    wrongly_answered = answer(["x"], [QUOTED])
    score_refusals([refused, refused, refused, wrongly_answered], scores)
    report = mode_report(scores)
    assert report["unanswerable_refused_share"] == 0.75
    assert report["unanswerable_questions"] == 4
    # Without an answerability set the key is there, empty.
    assert mode_report(score_mode([], dataset({}), None))["unanswerable_refused_share"] is None


def test_the_answerability_file_gives_its_unanswerable_questions_of_one_split(tmp_path: Path) -> None:
    rows = [
        {"id": "u1", "split": "test", "question": "How do I bake bread?", "answerable": False},
        {"id": "u2", "split": "tune", "question": "Who won in 1998?", "answerable": False},
        {"id": "a1", "split": "test", "question": "What is gRPC?", "answerable": True},
    ]
    path = tmp_path / "set.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert read_unanswerable(path, "test") == {"u1": "How do I bake bread?"}
    assert set(read_unanswerable(path, "")) == {"u1", "u2"}
    with pytest.raises(InputError):
        read_unanswerable(path, "nope")
    path.write_text('{"id": "x"}\n')
    with pytest.raises(InputError, match=r"set\.jsonl:1"):
        read_unanswerable(path, "")
