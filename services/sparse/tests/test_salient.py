"""The terms a long BM25 query searches (salient.py): at most the limit, the rarest, in query
order, deterministic, one lookup per term, in linear time on hostile text; and through a
collection, a page-long query still finds the chunk its rare words name."""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.sparse.collection import Collection
from services.sparse.salient import salient_terms
from services.sparse.schema import query_terms

from .conftest import chunk, put

# The gateway's default query limit, in characters.
QUERY_LIMIT = 16_000
BOUND_S = 5.0

PIECES = [
    " ",
    "\n",
    "\t",
    "the ",
    "retrieval ",
    "Retrieval's ",
    "x-ray ",
    "C++ ",
    "IL-6 ",
    "title:dogs^2 ",
    "(AND) ",
    '"unclosed ',
    "*?~ ",
    "[a TO z] ",
    "-",
    "...",
    "\u00e9t\u00e9 ",
    "\u65e5\u672c\u8a9e ",
    "\u0645\u0631\u062d\u0628\u0627 ",
    "\U0001f600 ",
    "\u0301",
    "\u200b",
    "a" * 50,
    "1234 ",
]


def hostile_query() -> st.SearchStrategy[str]:
    """Runs of punctuation, query syntax, unicode and words, some repeated hundreds of times,
    mixed with arbitrary text."""
    run = st.tuples(
        st.one_of(st.sampled_from(PIECES), st.text(min_size=1, max_size=12)),
        st.one_of(st.integers(1, 4), st.integers(100, 800)),
    )
    text = st.lists(run, min_size=1, max_size=12).map(lambda runs: "".join(p * n for p, n in runs))
    return text.map(lambda q: q[:QUERY_LIMIT])


def stable_doc_freq(term: str) -> int:
    """A document frequency that depends on the term only (0 for some: unknown words)."""
    return zlib.crc32(term.encode()) % 7


def counting(doc_freq: Callable[[str], int]) -> tuple[Callable[[str], int], list[str]]:
    asked: list[str] = []

    def counted(term: str) -> int:
        asked.append(term)
        return doc_freq(term)

    return counted, asked


def rank(term: str, position: int) -> tuple[bool, int, int, int]:
    held_by = stable_doc_freq(term)
    return (held_by == 0, held_by, -len(term), position)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_query(), st.integers(1, 80))
def test_salient_terms_are_the_rarest_few_in_query_order(query: str, limit: int) -> None:
    terms = query_terms(query)
    doc_freq, asked = counting(stable_doc_freq)
    chosen = salient_terms(terms, limit, doc_freq)
    assert len(chosen) == min(limit, len(terms))
    assert len(set(chosen)) == len(chosen)
    # A subsequence of the query's terms: their order is kept.
    position = {term: i for i, term in enumerate(terms)}
    assert [position[t] for t in chosen] == sorted(position[t] for t in chosen)
    if len(terms) <= limit:
        assert chosen == terms and asked == []
        return
    # One lookup per distinct term, none twice.
    assert sorted(asked) == sorted(terms)
    # Every term kept ranks at least as well as every term dropped.
    kept = set(chosen)
    worst_kept = max(rank(t, position[t]) for t in chosen)
    best_dropped = min(rank(t, position[t]) for t in terms if t not in kept)
    assert worst_kept < best_dropped
    # Deterministic.
    assert salient_terms(terms, limit, stable_doc_freq) == chosen


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=6), max_size=60), st.integers(1, 10))
def test_repeats_count_once_and_ties_go_to_the_longer_then_the_first(terms: list[str], limit: int) -> None:
    chosen = salient_terms(terms, limit, lambda term: 1)
    distinct = list(dict.fromkeys(terms))
    expected = sorted(range(len(distinct)), key=lambda i: (-len(distinct[i]), i))[:limit]
    assert chosen == [distinct[i] for i in sorted(expected)]


def test_unknown_terms_come_last_and_the_limit_must_be_positive() -> None:
    freq = {"common": 900, "rare": 2, "unknown": 0, "scarce": 5}
    assert salient_terms(["common", "unknown", "rare", "scarce"], 2, freq.__getitem__) == ["rare", "scarce"]
    assert salient_terms(["unknown", "common"], 1, freq.__getitem__) == ["common"]
    with pytest.raises(ValueError):
        salient_terms(["a"], 0, freq.__getitem__)


@pytest.mark.parametrize(
    "query",
    [
        "retrieval " * (QUERY_LIMIT // 10),
        "a" * 1_000_000,
        "." * 1_000_000,
        "\u00e9" * 1_000_000,
        " ".join(f"w{i}x" for i in range(150_000)),
        'title:(dogs^2 OR "cats") AND [a TO z] ' * 25_000,
        "\U0001f600 \u65e5\u672c " * 200_000,
    ],
)
def test_term_selection_takes_linear_time_even_past_the_query_limit(query: str) -> None:
    started = time.perf_counter()
    chosen = salient_terms(query_terms(query), 64, stable_doc_freq)
    assert time.perf_counter() - started < BOUND_S
    assert len(chosen) <= 64


RARE = chunk("papers/rare", "Quasicrystals show aperiodic order in diffraction patterns.", "Quasicrystals")
COMMON = [
    chunk(f"papers/common-{i}", f"A study of retrieval systems and how documents are ranked, number {i}.")
    for i in range(5)
]


def test_a_page_long_query_searches_its_rarest_terms(collection: Collection) -> None:
    for record in (RARE, *COMMON):
        put(collection, record.doc_id, record)
    filler = " ".join(f"filler{i}" for i in range(600))
    query = f'retrieval systems documents ranked {filler} quasicrystals aperiodic (AND) title:x^2 "*'
    assert len(query_terms(query)) > 600
    started = time.perf_counter()
    hits = collection.search_bm25(query, 3, [], max_terms=8)
    assert time.perf_counter() - started < BOUND_S
    assert hits[0].chunk_id == RARE.chunk_id
    # Unbounded, the same query searches every term and finds the same chunk first.
    assert collection.search_bm25(query, 3, [])[0].chunk_id == RARE.chunk_id
    unknown = collection.unknown_words(query, 16)
    assert len(unknown) == 16 and unknown[0] == "filler0"
