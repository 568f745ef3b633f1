"""The degenerate-generation check (services/narrator/degenerate.py): what counts as a phrase
looping, what real text never trips (the shared corpora, when present), linear time on hostile
input of a megabyte, and the stream gate holding a loop back before it is shown."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.narrator import degenerate
from services.narrator.degenerate import (
    MAX_PERIOD,
    RepeatGate,
    find_repeat,
    looping_sentences,
    min_span,
    repeats,
    words,
)
from services.narrator.tests.corpus_sentences import Document, grpc_documents, scifact_documents, sentences

MEGABYTE = 1_000_000
BOUND_S = 10.0
# Every this many SciFact abstracts one is sampled (all grpc-docs pages are: there are 111).
SCIFACT_SAMPLE_EVERY = 5

LOOPING = [
    "The X1 is a high-end, high-end, high-end laptop [1].",
    "the the the the tower is tall [1].",
    "It is tall, it is tall, it is tall [1].",
    "High-end [1], HIGH-END [2], high-end [3] laptops are sold there.",
    "Vitamin D lowers the risk of fractures in adults, and vitamin D lowers the risk of fractures in "
    "adults, and vitamin D lowers the risk of fractures in adults [2].",
    "go go go go",
]
NOT_LOOPING = [
    "The MAP kinase kinase kinase TAK1 is activated by TLRs [1].",
    "It was very, very tall [1].",
    "Bind to 0.0.0.0:50051 and 127.0.0.1:50051 [2].",
    "The means were 1.1, 1.1, 1.1 and 1.1 in the four groups [1].",
    "| Language | Yes | Yes | Yes | Yes |",
    "| N/A | N/A | N/A | N/A |",
    "Go supports it [1], Java supports it [2] and C++ supports it [3].",
    "return note.location().latitude() == note_.location().latitude() && "
    "note.location().longitude() == note_.location().longitude();",
    "- streaming: yes; unary: yes; bidi: yes",
    "The risk of fracture, the risk of falls and the risk of death all fell [1].",
    "Deadlines, deadlines and more deadlines [1].",
    "high and high and high",
]


def timed(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - started


def stream(text: str, step: int) -> tuple[str, RepeatGate]:
    """``text`` through a gate in deltas of ``step`` chars: what a reader was shown."""
    gate = RepeatGate()
    shown = [gate.feed(text[i : i + step]) for i in range(0, len(text), step)]
    return "".join(shown) + gate.flush(), gate


# --- what counts ------------------------------------------------------------------------------


@pytest.mark.parametrize("sentence", LOOPING)
def test_a_phrase_looping_in_a_sentence_counts(sentence: str) -> None:
    assert find_repeat(sentence) is not None


@pytest.mark.parametrize("sentence", NOT_LOOPING)
def test_prose_lists_table_rows_and_code_do_not(sentence: str) -> None:
    assert find_repeat(sentence) is None


def test_the_repeat_names_its_phrase_and_copies() -> None:
    found = find_repeat("The X1 is a high-end, high-end, high-end, high-end laptop [1].")
    assert found is not None
    assert (found.phrase, found.period) == ("high end", 2)
    assert found.describe() == '"high end" repeated 3 times'
    [whole] = repeats(words("The X1 is a high-end, high-end, high-end, high-end laptop [1]."))
    assert (whole.start, whole.end, whole.copies) == (4, 12, 4.0)


def test_thresholds_by_period() -> None:
    assert [min_span(p) for p in (1, 2, 3, 4, MAX_PERIOD)] == [4, 6, 8, 11, 3 * MAX_PERIOD - 1]
    assert find_repeat("a b c a b c a b") is not None  # 3 copies less the last token
    assert find_repeat("a b c a b c a") is None
    long_phrase = " ".join(f"w{i}" for i in range(MAX_PERIOD + 1))
    # A loop over a longer stretch is the loop watch's and the repeat check's to catch.
    assert find_repeat(" ".join([long_phrase] * 3)) is None


def test_a_loop_across_sentences_drops_the_sentences_past_its_first_copy() -> None:
    answer = ["It is high-end [1].", "High-end, high-end [1].", "It sells well [2]."]
    assert [find_repeat(s) for s in answer] == [None, None, None]
    looping = looping_sentences([words(s) for s in answer])
    assert list(looping) == [1] and looping[1].phrase == "high end"
    plain = ["The tower is 330 metres tall [1].", "The tower is in Paris [2].", "It is old [1]."]
    assert looping_sentences([words(s) for s in plain]) == {}


_WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=8)
_SEPARATOR = st.sampled_from([" ", ", ", "; ", " - ", " [1] ", ", [2, 3] "])


@settings(max_examples=200, deadline=None)
@given(
    unit=st.lists(_WORD, min_size=1, max_size=MAX_PERIOD),
    extra=st.integers(0, 3),
    separator=_SEPARATOR,
    before=st.lists(_WORD, max_size=6),
    after=st.lists(_WORD, max_size=6),
)
def test_any_phrase_said_three_times_running_counts(
    unit: list[str], extra: int, separator: str, before: list[str], after: list[str]
) -> None:
    copies = (4 if len(unit) == 1 else 3) + extra
    looping = separator.join([" ".join(unit)] * copies)
    sentence = " ".join([*before, looping, *after]) + " [1]."
    assert find_repeat(sentence) is not None
    # Checked as a whole answer too, and cut into sentences anywhere.
    assert repeats(words(sentence))


@settings(max_examples=100, deadline=None)
@given(st.lists(_WORD, unique=True, max_size=60), st.integers(1, 8))
def test_words_said_once_never_count_and_pass_the_stream_gate_unchanged(
    vocabulary: list[str], step: int
) -> None:
    text = " ".join(vocabulary)
    assert find_repeat(text) is None and repeats(words(text)) == []
    shown, gate = stream(text, step)
    assert shown == text and gate.found == []


# --- real text ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Corpus:
    sentences: list[str]
    documents: list[str]


def _sample() -> Iterator[Document]:
    for i, document in enumerate(scifact_documents()):
        if i % SCIFACT_SAMPLE_EVERY == 0:
            yield document
    yield from grpc_documents()


@pytest.fixture(scope="session")
def corpus() -> Corpus:
    """A sample of the shared corpora: every fifth SciFact abstract and every grpc-docs page,
    as their sentences (prose, list items, table rows, code lines) and whole."""
    found: list[str] = []
    texts: list[str] = []
    for document in _sample():
        found += sentences(document)
        texts.append(document.text)
    if not found:
        pytest.skip("the shared corpora (SciFact, grpc-docs) are not on this machine")
    return Corpus(found, texts)


def test_no_sentence_of_the_corpora_counts(corpus: Corpus) -> None:
    fired = [s for s in corpus.sentences if find_repeat(s) is not None]
    assert fired == []


def test_no_document_of_the_corpora_loops_as_a_whole(corpus: Corpus) -> None:
    assert [text[:80] for text in corpus.documents if repeats(words(text))] == []


@settings(max_examples=50, deadline=None)
@given(data=st.data(), step=st.integers(1, 40))
def test_corpus_text_streams_through_the_gate_unchanged(
    corpus: Corpus, data: st.DataObject, step: int
) -> None:
    text = data.draw(st.sampled_from(corpus.documents))[:4000]
    shown, gate = stream(text, step)
    assert shown == text and gate.found == []


# --- the stream gate ---------------------------------------------------------------------------


@pytest.mark.parametrize("step", [1, 2, 3, 5, 8, 1000])
def test_the_gate_shows_the_first_copy_and_holds_the_rest_back(step: int) -> None:
    text = "The X1 is a high-end, high-end, high-end, high-end laptop [1]. It sells well [2]."
    shown, gate = stream(text, step)
    assert shown.startswith("The X1 is a high-end,")
    assert shown.count("high-end") == 1 and "laptop" not in shown
    assert shown.endswith(" It sells well [2].")
    assert [(r.phrase, r.period) for r in gate.found] == [("high end", 2)]


def test_the_gate_ends_a_dropped_sentence_at_a_line_break() -> None:
    shown, _ = stream("- the the the the tower\n- the park\n", 3)
    assert shown == "- the \n- the park\n"


def test_a_repeat_that_breaks_off_is_shown_after_all() -> None:
    text = "It is tall, it is tall, and it is old [1]."
    deltas = [text[i : i + 2] for i in range(0, len(text), 2)]
    gate = RepeatGate()
    shown = [gate.feed(d) for d in deltas]
    assert "".join(shown) + gate.flush() == text
    # Held while it might have gone on repeating ("it is tall, " again), then shown at once.
    assert max(len(s) for s in shown) < len(text) // 2


def test_a_marker_split_across_deltas_is_not_a_word() -> None:
    shown, gate = stream("Tall [1]. Tall [1, 1]. Tall [1, 1, 1]. Tall [1, 1, 1, 1].", 2)
    assert gate.found == [] and shown.endswith("Tall [1, 1, 1, 1].")


# --- linear time -------------------------------------------------------------------------------


def _square_free(length: int) -> list[str]:
    """A ternary word with no square in it (from Thue-Morse: the ones between its zeros), so no
    phrase ever repeats twice running, while each token recurs every few places: the watch's
    most work with nothing ever counting."""
    thue = [bin(i).count("1") % 2 for i in range(4 * length)]
    zeros = [i for i, bit in enumerate(thue) if bit == 0]
    return ["abc"[zeros[k + 1] - zeros[k] - 1] for k in range(min(length, len(zeros) - 1))]


HOSTILE = [
    "high-end, " * (MEGABYTE // 10),
    "0 " * (MEGABYTE // 2),
    " ".join(_square_free(MEGABYTE // 2)),
    "a" * MEGABYTE,
    "-" * MEGABYTE,
    "." + ")" * MEGABYTE,
    "[1" * (MEGABYTE // 2),
    "| " * (MEGABYTE // 2),
    "high " + "-" * MEGABYTE + " high high high",
    "It is tall [1]. " * (MEGABYTE // 16),
]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_checking_a_hostile_megabyte_takes_linear_time(text: str) -> None:
    _, took = timed(find_repeat, text)
    assert took < BOUND_S
    _, took = timed(lambda: repeats(words(text)))
    assert took < BOUND_S


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_streaming_a_hostile_megabyte_through_the_gate_takes_linear_time(text: str) -> None:
    (shown, _), took = timed(stream, text, 64)
    assert took < BOUND_S
    assert len(shown) <= len(text)


# What straddles deltas: a word still being written, a stop whose closers go on, a marker still
# open, text held back.
STRADDLING = [
    "a" * MEGABYTE,
    "." + ")" * MEGABYTE,
    "[1" * (MEGABYTE // 2),
    "high " + "-" * MEGABYTE + " high",
]


@pytest.mark.parametrize("text", STRADDLING, ids=range(len(STRADDLING)))
def test_tiny_deltas_of_a_hostile_megabyte_take_linear_time(text: str) -> None:
    (shown, _), took = timed(stream, text, 7)
    assert took < BOUND_S
    assert shown == text


@settings(max_examples=3, deadline=None)
@given(
    unit=st.lists(_WORD, min_size=1, max_size=2 * MAX_PERIOD),
    separator=_SEPARATOR,
    step=st.integers(16, 4096),
)
def test_a_megabyte_of_any_repeated_phrase_is_checked_in_linear_time(
    unit: list[str], separator: str, step: int
) -> None:
    phrase = " ".join(unit) + separator
    text = phrase * (MEGABYTE // len(phrase))
    _, took = timed(lambda: (find_repeat(text), repeats(words(text))))
    assert took < BOUND_S
    _, took = timed(stream, text, step)
    assert took < BOUND_S


def test_the_watch_does_no_more_than_max_period_steps_a_token() -> None:
    # A run of numbers can never count: skipped outright, not compared MAX_PERIOD times.
    watch = degenerate.RepeatWatch()
    assert all(watch.push("7") is None for _ in range(10_000))
    assert watch.held_from is None
