from __future__ import annotations

import pytest

from services.narrator.model import RejectReason
from services.narrator.tests.fakes import FACTS
from services.narrator.verify import (
    Verification,
    answer_sentences,
    is_not_found_marker,
    support_texts,
    verify,
    with_citation,
)

SUPPORTS = support_texts(FACTS)
MIN_SUPPORT = 0.5
BIND_SUPPORT = 0.6


def check(text: str, source_count: int = 3) -> Verification:
    return verify(text, source_count, SUPPORTS, MIN_SUPPORT, BIND_SUPPORT)


def test_supported_cited_sentences_are_kept_with_normalised_markers() -> None:
    result = check("The Eiffel Tower is 330 metres tall[1,3]. It was completed in 1889 [1] .")
    assert [s.text for s in result.sentences] == [
        "The Eiffel Tower is 330 metres tall [1, 3].",
        "It was completed in 1889 [1].",
    ]
    assert [s.sources for s in result.sentences] == [(1, 3), (1,)]
    assert result.rejected == [] and not result.not_found


def test_markers_anywhere_in_the_sentence_move_to_its_end() -> None:
    result = check("The Eiffel Tower [2] stands in Paris [1] on the Champ de Mars")
    assert [s.text for s in result.sentences] == [
        "The Eiffel Tower stands in Paris on the Champ de Mars [2, 1]."
    ]


def test_unknown_numbers_are_removed_when_a_valid_one_is_left() -> None:
    result = check("The Eiffel Tower is 330 metres tall [1, 7].")
    assert [(s.text, s.sources) for s in result.sentences] == [
        ("The Eiffel Tower is 330 metres tall [1].", (1,))
    ]
    assert result.rejected == []


def test_a_sentence_citing_only_unknown_sources_is_rejected() -> None:
    result = check("The Eiffel Tower is 330 metres tall [4]. It was completed in 1889 [0].")
    assert result.sentences == []
    assert [r.reason for r in result.rejected] == [RejectReason.UNKNOWN_SOURCE] * 2
    assert result.rejected[0].text == "The Eiffel Tower is 330 metres tall [4]."


def test_an_uncited_sentence_is_bound_to_the_source_that_supports_it() -> None:
    result = check("The Eiffel Tower stands on the Champ de Mars. Yes.")
    assert [(s.text, s.sources) for s in result.sentences] == [
        ("The Eiffel Tower stands on the Champ de Mars [2].", (2,))
    ]
    # Too short to check against anything: dropped, not bound.
    assert [(r.text, r.reason) for r in result.rejected] == [("Yes.", RejectReason.UNCITED)]


def test_uncited_sentences_are_dropped() -> None:
    result = check("The Eiffel Tower is 330 metres tall [1]. Everyone loves Paris in spring.")
    assert [s.sources for s in result.sentences] == [(1,)]
    assert [(r.text, r.reason) for r in result.rejected] == [
        ("Everyone loves Paris in spring.", RejectReason.UNCITED)
    ]


def test_sentences_their_cited_facts_do_not_support_are_dropped() -> None:
    # Supported by source 1, not by source 2 (which says nothing of height).
    result = check(
        "The Eiffel Tower is 330 metres tall [1]. Bananas contain potassium and vitamins [1]. "
        "The tower is 330 metres tall [2]."
    )
    assert [s.sources for s in result.sentences] == [(1,)]
    assert [r.reason for r in result.rejected] == [RejectReason.UNSUPPORTED] * 2


def test_support_is_checked_against_all_cited_sources_together() -> None:
    # "1889" is in source 1, "Champ de Mars" in source 2: only both together support it.
    sentence = "Completed in 1889, the tower stands on the Champ de Mars"
    assert check(f"{sentence} [1, 2].").sentences
    assert verify(f"{sentence} [2].", 3, SUPPORTS, 0.9, BIND_SUPPORT).rejected


def test_the_not_found_marker_is_no_uncited_sentence() -> None:
    for reply in ("NOT_IN_DOCUMENTS", "**NOT IN DOCUMENTS.**", "<answer>not_in_documents</answer>"):
        result = check(reply)
        assert result.not_found and result.sentences == [] and result.rejected == [], reply


def test_a_marker_next_to_cited_sentences_keeps_them() -> None:
    result = check("The Eiffel Tower is 330 metres tall [1]. NOT_IN_DOCUMENTS")
    assert result.not_found and [s.sources for s in result.sentences] == [(1,)]


def test_the_envelope_and_reasoning_are_taken_off_before_verifying() -> None:
    reply = (
        "<think>The user wants the height. Source 1 says 330.</think>\n"
        "<answer>The Eiffel Tower is 330 metres tall [1].</answer>\n"
        "I removed the uncited claims."
    )
    result = check(reply)
    assert [s.text for s in result.sentences] == ["The Eiffel Tower is 330 metres tall [1]."]
    assert result.rejected == []


def test_list_items_and_stray_markers() -> None:
    text = "- The Eiffel Tower is 330 metres tall.\n[1]\n2. It was completed in 1889 [1]\n---"
    assert answer_sentences(text) == [
        "The Eiffel Tower is 330 metres tall. [1]",
        "It was completed in 1889 [1]",
    ]
    result = check(text)
    assert [s.text for s in result.sentences] == [
        "The Eiffel Tower is 330 metres tall [1].",
        "It was completed in 1889 [1].",
    ]


@pytest.mark.parametrize(
    ("text", "numbers", "expected"),
    [
        ("It is tall.", [1], "It is tall [1]."),
        ("It is tall [2]", [1, 2], "It is tall [1, 2]."),
        ("Is it tall?", [3], "Is it tall [3]?"),
        ('He said "tall."', [1], 'He said "tall [1]."'),
    ],
)
def test_with_citation(text: str, numbers: list[int], expected: str) -> None:
    assert with_citation(text, numbers) == expected


def test_marker_detection() -> None:
    assert is_not_found_marker("NOT_IN_DOCUMENTS.")
    assert not is_not_found_marker("The documents cover this [1].")


def test_a_repeated_sentence_is_kept_once() -> None:
    result = check("The Eiffel Tower is 330 metres tall [1]. The Eiffel Tower is 330 metres tall [3].")
    assert [s.sources for s in result.sentences] == [(1,)]
    assert [r.reason for r in result.rejected] == [RejectReason.REPEATED]


def test_a_repeat_that_differs_by_its_final_stop_case_or_spacing_is_still_a_repeat() -> None:
    # The example: the same claim twice, the second time without its final period.
    result = check(
        "The Eiffel Tower is 330 metres tall [1]. The Eiffel  Tower is 330 metres tall [1]\n"
        "the Eiffel Tower is 330 metres TALL!"
    )
    assert [s.text for s in result.sentences] == ["The Eiffel Tower is 330 metres tall [1]."]
    assert [r.reason for r in result.rejected] == [RejectReason.REPEATED, RejectReason.REPEATED]


def test_a_kept_sentence_reports_its_lexical_support() -> None:
    (sentence,) = check("The Eiffel Tower is 330 metres tall [1].").sentences
    assert sentence.check.value == "lexical"
    assert sentence.support == 1.0
