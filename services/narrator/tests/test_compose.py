from __future__ import annotations

from services.narrator.compose import (
    INSTRUCTIONS,
    MIN_TURN_CHARS,
    build_messages,
    prompt_facts,
    recent_history,
    source_lines,
)
from services.narrator.model import Fact, Role, Turn
from services.narrator.tests.fakes import FACTS, QUERY, SOURCES
from services.narrator.verify import NOT_FOUND_MARKER


def test_facts_are_grouped_under_their_numbered_sources() -> None:
    facts = [*FACTS, Fact("As noted in [12], it was repainted.", 1, 0.1)]
    assert source_lines(SOURCES, facts) == [
        "[1] Eiffel Tower: The Eiffel Tower is 330 metres tall; The Eiffel Tower was completed in 1889; "
        "As noted in, it was repainted",
        "[2] Paris guide: The Eiffel Tower stands in Paris on the Champ de Mars",
        "[3] Old almanac: The Eiffel Tower is 300 metres tall",
    ]


def test_the_prompt_holds_instructions_facts_history_and_question() -> None:
    history = [Turn(Role.USER, "Tell me about Paris."), Turn(Role.ASSISTANT, "Paris is in France [4].")]
    messages = build_messages(QUERY, SOURCES, FACTS, history, fact_chars=4000, history_chars=2000)
    assert messages[0] == {"role": "system", "content": INSTRUCTIONS}
    assert NOT_FOUND_MARKER in INSTRUCTIONS and "[1, 3]" in INSTRUCTIONS
    # A worked example first, in the format the answer must take.
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[2]["content"].endswith("[1].")
    user = messages[3]["content"]
    assert user.startswith("Sources:\n[1] Eiffel Tower: The Eiffel Tower is 330 metres tall;")
    # Old citation numbers name other sources: they are taken out of the history.
    assert "User: Tell me about Paris.\nAssistant: Paris is in France." in user
    assert user.endswith(f"Question: {QUERY}")


def test_no_history_section_without_history() -> None:
    messages = build_messages(QUERY, SOURCES, FACTS, [], fact_chars=4000, history_chars=2000)
    assert "Conversation" not in messages[-1]["content"]


def test_prompt_facts_keeps_the_best_that_fit_in_request_order() -> None:
    # 36 + 39 chars for the two best; the third (54) does not fit, the fourth (36) does.
    chosen = prompt_facts(FACTS, 36 + 39 + 36)
    assert chosen == [FACTS[0], FACTS[1], FACTS[3]]


def test_prompt_facts_cuts_the_best_when_nothing_fits() -> None:
    chosen = prompt_facts(FACTS, 10)
    assert len(chosen) == 1 and chosen[0].source == 1 and len(chosen[0].text) <= 11


def test_history_keeps_the_most_recent_turns_that_fit() -> None:
    history = [Turn(Role.USER, "a" * 50), Turn(Role.ASSISTANT, "b" * 50), Turn(Role.USER, "c" * 50)]
    assert recent_history(history, 120) == history[1:]
    assert recent_history(history, 40) == []
    assert recent_history(history, 0) == []


def test_history_cuts_the_first_turn_that_does_not_fit_when_enough_room_is_left() -> None:
    long_turn = Turn(Role.ASSISTANT, "x" * 1000)
    kept = recent_history([long_turn, Turn(Role.USER, "and its height?")], MIN_TURN_CHARS + 15)
    assert [t.role for t in kept] == [Role.ASSISTANT, Role.USER]
    assert len(kept[0].content) == MIN_TURN_CHARS and kept[0].content.endswith("\u2026")
