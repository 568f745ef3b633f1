from __future__ import annotations

import json

from meshkit.llm.factory import LLMError
from services.narrator.contradictions import (
    MAX_CONTRADICTIONS,
    ContradictionItem,
    ContradictionReport,
    find_contradictions,
    keep_valid,
)
from services.narrator.model import Contradiction
from services.narrator.tests.fakes import FACTS, QUERY, SOURCES, FakeLLM


async def ask(llm: FakeLLM, cited: list[int]) -> list[Contradiction]:
    return await find_contradictions(llm, QUERY, SOURCES, FACTS, cited, timeout=5.0)


async def test_reported_pairs_come_back_with_their_sources() -> None:
    reply = {"contradictions": [{"source_a": 3, "source_b": 1, "description": " 330 m  versus 300 m "}]}
    llm = FakeLLM(structured=[reply])
    assert await ask(llm, [1, 3]) == [Contradiction("330 m versus 300 m", (1, 3))]
    call = llm.structured_calls[0]
    assert call["schema"] is ContradictionReport and call["timeout"] == 5.0
    # Only the cited sources' facts are shown.
    prompt = call["messages"][1]["content"]
    assert "[1] Eiffel Tower" in prompt and "[3] Old almanac" in prompt and "[2]" not in prompt


async def test_bad_entries_are_ignored_and_good_ones_kept() -> None:
    reply = json.dumps(
        {
            "contradictions": [
                {"source_a": 1, "source_b": 3, "description": "Heights differ."},
                {"source_a": "x", "source_b": 3, "description": "not a number"},
                {"source_a": 1, "source_b": 1, "description": "one source"},
                {"source_a": 1, "source_b": 9, "description": "unknown source"},
                {"source_a": 1, "source_b": 2, "description": "uncited source"},
                {"source_a": 3, "source_b": 1, "description": "the same pair again"},
                {"source_a": 1, "source_b": 3},
            ]
        }
    )
    llm = FakeLLM(structured=[f"Here you go:\n```json\n{reply}\n```"])
    assert await ask(llm, [1, 3]) == [Contradiction("Heights differ.", (1, 3))]


async def test_any_failure_means_no_contradictions() -> None:
    for failure in (
        LLMError("deadline", "too slow"),
        LLMError("invalid_output", "no JSON", raw="nope"),
        RuntimeError(),
    ):
        assert await ask(FakeLLM(structured=[failure]), [1, 3]) == []
    assert await ask(FakeLLM(structured=["[not json"]), [1, 3]) == []
    assert await ask(FakeLLM(structured=[{"contradictions": "none"}]), [1, 3]) == []


def test_the_schema_is_bounded_for_guided_decoding() -> None:
    schema = ContradictionReport.model_json_schema()
    assert schema["properties"]["contradictions"]["maxItems"] == MAX_CONTRADICTIONS


def test_keep_valid_caps_the_list() -> None:
    items = [ContradictionItem(source_a=1, source_b=n, description="d") for n in range(2, 7)]
    assert len(keep_valid(items, range(1, 7))) == MAX_CONTRADICTIONS
