from __future__ import annotations

import pytest

from services.sparse.collection import Collection
from services.sparse.exact import find_ripgrep, normalise_keywords, rank, ripgrep_counts
from services.sparse.records import Hit
from services.sparse.servicer import exact_phrase

from .conftest import chunk, put

RESET = chunk("logs/net", "The client failed with ERR_CONN_RESET twice; err_conn_reset again.", "Network")
ADDRESS = chunk("logs/crash", "Segfault at address 0x7F3A in module core.", "Crash")
PHRASE = chunk("notes/q", "He said the quick\nbrown   fox jumps over it.", "Notes")
PLAIN = chunk("notes/plain", "Nothing to see: a connection was reset by the peer.", "Plain")


async def search(
    collection: Collection, mode: str, keywords: list[str], top_k: int = 10, doc_ids=()
) -> list[Hit]:
    kws = normalise_keywords(keywords)
    if mode == "phrase":
        return exact_phrase(collection, kws, top_k, list(doc_ids))
    rg = find_ripgrep()
    assert rg is not None
    counts = await ripgrep_counts(rg, collection.files.root, kws, 10.0)
    return rank(counts, collection.live_documents(counts.keys(), list(doc_ids)), kws, top_k)


@pytest.fixture
def seeded(collection: Collection) -> Collection:
    for c in (RESET, ADDRESS, PHRASE, PLAIN):
        put(collection, c.doc_id, c)
    return collection


@pytest.mark.parametrize("mode", ["ripgrep", "phrase"])
async def test_finds_identifiers_and_phrases_case_insensitively(seeded: Collection, mode: str) -> None:
    [hit] = await search(seeded, mode, ["err_conn_reset"])
    assert (hit.chunk_id, hit.doc_id, hit.matched_keywords) == (
        RESET.chunk_id,
        "logs/net",
        ("err_conn_reset",),
    )
    assert hit.score == pytest.approx(1 + 2 / 3)  # one keyword, two occurrences
    assert [h.chunk_id for h in await search(seeded, mode, ["0x7f3a"])] == [ADDRESS.chunk_id]
    # The phrase spans a line break and a run of spaces in the source.
    assert [h.chunk_id for h in await search(seeded, mode, ["Quick Brown Fox"])] == [PHRASE.chunk_id]
    assert await search(seeded, mode, ["brown quick"]) == []


@pytest.mark.parametrize("mode", ["ripgrep", "phrase"])
async def test_ranks_by_distinct_then_total_then_id(seeded: Collection, mode: str) -> None:
    hits = await search(seeded, mode, ["ERR_CONN_RESET", "client", "reset", "peer", "missing-word"])
    assert [h.chunk_id for h in hits] == [RESET.chunk_id, PLAIN.chunk_id]
    assert hits[0].matched_keywords == ("ERR_CONN_RESET", "client", "reset")
    assert hits[1].matched_keywords == ("reset", "peer")
    assert [h.chunk_id for h in await search(seeded, mode, ["in", "at"], top_k=1)] == [ADDRESS.chunk_id]


@pytest.mark.parametrize("mode", ["ripgrep", "phrase"])
async def test_doc_filter(seeded: Collection, mode: str) -> None:
    assert await search(seeded, mode, ["reset"], doc_ids=["notes/plain"]) == [
        Hit(PLAIN.chunk_id, "notes/plain", 1.5, ("reset",))
    ]


@pytest.mark.parametrize("mode", ["ripgrep", "phrase"])
async def test_deleted_chunks_never_come_back(seeded: Collection, mode: str) -> None:
    seeded.delete([], ["logs/net"])
    # A crash between commit and file removal leaves the file behind: it must be ignored.
    seeded.files.write([RESET])
    assert await search(seeded, mode, ["ERR_CONN_RESET"]) == []


async def test_substring_is_where_the_modes_differ(seeded: Collection) -> None:
    assert [h.chunk_id for h in await search(seeded, "ripgrep", ["7f3a"])] == [ADDRESS.chunk_id]
    assert await search(seeded, "phrase", ["7f3a"]) == []  # token semantics: no partial tokens
    # A keyword inside another one's match is still counted on its own.
    hits = await search(seeded, "ripgrep", ["err_conn_reset", "conn"])
    assert [(h.chunk_id, h.matched_keywords) for h in hits] == [
        (RESET.chunk_id, ("err_conn_reset", "conn")),
        (PLAIN.chunk_id, ("conn",)),  # inside "connection"
    ]


def test_keywords_are_normalised_and_deduplicated() -> None:
    kws = normalise_keywords(["  Foo\n Bar ", "foo bar", "C++"])
    assert [(k.original, k.needle) for k in kws] == [("  Foo\n Bar ", "foo bar"), ("C++", "c++")]
