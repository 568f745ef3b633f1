from __future__ import annotations

import pytest

from services.planner.text import word_key
from services.planner.variations import focus_form, keyword_form, make_variations, statement_form


def test_original_first_then_statement_keyword_and_focus_forms() -> None:
    assert make_variations("What is the role of the immune system?", 4) == [
        "What is the role of the immune system?",
        "the role of the immune system",
        "role immune system",
        "immune system",
    ]


def test_capped_by_the_limit_and_one_means_only_the_original() -> None:
    query = "What is the role of the immune system?"
    assert len(make_variations(query, 2)) == 2
    assert make_variations(query, 1) == [query]


def test_original_is_stripped_but_otherwise_verbatim() -> None:
    assert make_variations("  Does  IL-6 matter?  ", 1) == ["Does  IL-6 matter?"]


def test_deterministic() -> None:
    query = "Why does my build fail with ERR_CONN_RESET after upgrading to v2.3.1?"
    assert make_variations(query, 8) == make_variations(query, 8)


@pytest.mark.parametrize(
    "query",
    [
        "What is the role of the immune system?",
        "0-dimensional biomaterials show inductive properties.",
        "p53",
        "What is it?",
        "IL-6 il 6 Il-6?",
        "Tell me about Kubernetes",
    ],
)
def test_no_duplicates_and_no_empty_variations(query: str) -> None:
    variations = make_variations(query, 8)
    keys = [word_key(v) for v in variations]
    assert len(keys) == len(set(keys))
    assert all(v.strip() for v in variations)
    assert variations[0] == query


def test_rewrites_without_content_words_are_dropped() -> None:
    assert make_variations("What is it?", 8) == ["What is it?"]


def test_claims_that_are_already_keywords_stay_single() -> None:
    assert make_variations("0-dimensional biomaterials show inductive properties.", 8) == [
        "0-dimensional biomaterials show inductive properties."
    ]


def test_statement_form_only_for_questions_and_requests() -> None:
    assert statement_form("Does aspirin reduce fever?") == "aspirin reduce fever"
    assert statement_form("How many people have diabetes?") == "people have diabetes"
    assert statement_form("Can you tell me about Kubernetes networking?") == "Kubernetes networking"
    assert (
        statement_form("What's the difference between TCP and UDP?") == "the difference between TCP and UDP"
    )
    assert statement_form("Aspirin reduces fever.") == ""


def test_keyword_form_keeps_negations_identifiers_and_quoted_phrases() -> None:
    assert keyword_form("Does aspirin not reduce fever in children?") == "aspirin not reduce fever children"
    assert (
        keyword_form("Why does my build fail with ERR_CONN_RESET after upgrading to v2.3.1?")
        == "build fail ERR_CONN_RESET upgrading v2.3.1"
    )
    assert keyword_form('Where is "to be or not to be" quoted?') == "to be or not to be quoted"


def test_keyword_form_strips_request_framing_only_at_the_start() -> None:
    assert keyword_form("Give me an overview of Kubernetes networking") == "Kubernetes networking"
    assert keyword_form("List comprehension in Python") == "List comprehension Python"


def test_focus_form_drops_phrases_that_only_frame_the_topic() -> None:
    assert focus_form("What is the role of the immune system?") == "immune system"
    # "side effects" is a topic, not framing: only all-framing phrases go.
    assert focus_form("What are the side effects of metformin?") == "side effects metformin"
