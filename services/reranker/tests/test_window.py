"""Overlap windows: which span of a long passage the cross-encoder reads."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from services.reranker.model import CrossEncoderModel
from services.reranker.tests.conftest import MAX_TOKENS, TOKENIZER_JSON, ModelDirFactory
from services.reranker.window import best_start, content_ids, word_start

TOKENIZER = Tokenizer.from_file(str(TOKENIZER_JSON))


def brute_best(ids: list[int], wanted: set[int], room: int, after: int) -> int:
    if len(ids) - room <= after or not wanted:
        return after
    counts = [sum(t in wanted for t in ids[s : s + room]) for s in range(after, len(ids) - room + 1)]
    top = max(counts)
    if top == 0:
        return after
    first = last = counts.index(top)
    while last + 1 < len(counts) and counts[last + 1] == top:
        last += 1
    return after + (first + last) // 2


@settings(max_examples=300, deadline=None)
@given(
    ids=st.lists(st.integers(0, 6), max_size=80),
    wanted=st.sets(st.integers(0, 6), max_size=3),
    room=st.integers(1, 40),
    after=st.integers(0, 10),
)
def test_the_window_holds_the_most_query_tokens_centred_on_the_first_best(
    ids: list[int], wanted: set[int], room: int, after: int
) -> None:
    assert best_start(ids, wanted, room, after) == brute_best(ids, wanted, room, after)


def test_the_window_search_is_linear_in_the_passage() -> None:
    # 200,000 tokens and a 100,000-token room: a search that recounted each window would do
    # 10^10 steps; one sliding count does 2 * 10^5, well under the bound below.
    ids = [7] * 200_000
    started = time.perf_counter()
    assert best_start(ids, {7}, 100_000, 0) == 50_000
    assert best_start([*([1] * 100_000), *([7] * 10)], {7}, 10, 0) == 100_000
    assert time.perf_counter() - started < 5.0


def test_stopwords_pieces_and_punctuation_do_not_locate_a_window() -> None:
    question = "What is the effect of supplementation on fractures?"
    ids = TOKENIZER.encode(question, add_special_tokens=False).ids
    kept = {TOKENIZER.id_to_token(i) for i in content_ids(TOKENIZER, ids)}
    assert kept == {"effect", "supplement", "fractures"}


def test_a_window_never_opens_inside_a_word() -> None:
    ids = TOKENIZER.encode("alpha supplementation beta", add_special_tokens=False).ids
    piece = next(i for i, t in enumerate(ids) if TOKENIZER.id_to_token(t).startswith("##"))
    assert word_start(TOKENIZER, ids, piece, floor=0) == piece - 1
    assert word_start(TOKENIZER, ids, piece, floor=piece) == piece


@pytest.fixture
def model_dir(make_model_dir: ModelDirFactory) -> Path:
    return make_model_dir()


@pytest.fixture
def windowed(model_dir: Path) -> CrossEncoderModel:
    return CrossEncoderModel.load(model_dir, provider="cpu", window="overlap", window_head_tokens=4)


def decoded_passage(model: CrossEncoderModel, query: str, passage: str) -> str:
    encodings, truncated = model.encode_pairs([query], [passage])
    assert truncated.tolist() == [True]
    assert len(encodings[0].ids) <= MAX_TOKENS
    tokens = [t for t, kind in zip(encodings[0].tokens, encodings[0].type_ids, strict=True) if kind == 1]
    return " ".join(tokens[:-1])  # the last is [SEP]


def test_a_long_passage_keeps_its_opening_and_the_span_that_matches(
    windowed: CrossEncoderModel, model_dir: Path
) -> None:
    passage = "title words here now " + "word " * 100 + "the cell divides fast " + "word " * 100
    kept = decoded_passage(windowed, "how does a cell divide", passage)
    assert kept.startswith("title words here now")
    assert "cell divides" in kept
    # The counting graph sees the match that head truncation loses.
    head = CrossEncoderModel.load(model_dir, provider="cpu")
    assert windowed.score_pairs(["a cell"], [passage]).tolist() == [2.0]
    assert head.score_pairs(["a cell"], [passage]).tolist() == [1.0]


def test_without_a_match_the_head_is_kept(windowed: CrossEncoderModel) -> None:
    passage = "opening words " + "word " * 100 + "closing words"
    kept = decoded_passage(windowed, "unrelated question", passage)
    assert kept.startswith("opening words word")
    assert "closing" not in kept
