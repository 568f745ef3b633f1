from __future__ import annotations

import collections

import grpc
import pytest

from meshkit.core.errors import ServiceError
from meshkit.domain.ids import (
    MAX_COLLECTION_CHARS,
    MAX_DOC_ID_CHARS,
    bucket_of,
    chunk_id_for,
    doc_id_problem,
    doc_key,
    document_shard,
    sparse_shard_name,
    validate_chunk_id,
    validate_collection,
    validate_doc_id,
)


def assert_invalid(exc: pytest.ExceptionInfo[ServiceError]) -> None:
    assert exc.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert exc.value.message


@pytest.mark.parametrize(
    "doc_id",
    ["docs/guide.md", "PMID:123", "a", "x" * MAX_DOC_ID_CHARS, "user@host/v=2+b_c-d.txt", "a/.../b"],
)
def test_normal_doc_ids_are_accepted(doc_id: str) -> None:
    assert validate_doc_id(doc_id) == doc_id
    assert doc_id_problem(doc_id) is None


@pytest.mark.parametrize(
    "doc_id",
    [
        "",
        "../x",
        "a/../b",
        "..",
        ".",
        "./a",
        "a/.",
        "/abs",
        "/etc/passwd",
        "a//b",
        "a/",
        "x" * (MAX_DOC_ID_CHARS + 1),
        "has space",
        "back\\slash",
        "tab\tin",
        "nul\x00byte",
        "query?x",
        "frag#x",
        "per%2Fcent",
        "caf\u00e9",
        "\u2215lookalike-slash",
        "star*",
        "guide.md\n",
        "line\nbreak",
    ],
)
def test_path_like_and_odd_doc_ids_are_rejected(doc_id: str) -> None:
    assert doc_id_problem(doc_id)
    with pytest.raises(ServiceError) as exc:
        validate_doc_id(doc_id)
    assert_invalid(exc)


def test_doc_id_message_is_bounded_for_huge_ids() -> None:
    problem = doc_id_problem("../" + "y" * 100_000)
    assert problem is not None and len(problem) < 300


@pytest.mark.parametrize("name", ["docs", "a", "pubmed-2024_v2", "0abc", "x" * MAX_COLLECTION_CHARS])
def test_normal_collections_are_accepted(name: str) -> None:
    assert validate_collection(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "Docs",
        "-lead",
        "_lead",
        "a.b",
        "a/b",
        "../x",
        "has space",
        "x" * (MAX_COLLECTION_CHARS + 1),
        "docs\n",
        "caf\u00e9",
    ],
)
def test_bad_collections_are_rejected(name: str) -> None:
    with pytest.raises(ServiceError) as exc:
        validate_collection(name)
    assert_invalid(exc)


def test_collection_message_is_bounded_for_huge_names() -> None:
    with pytest.raises(ServiceError) as exc:
        validate_collection("a" * 1_000_000)
    assert len(exc.value.message) < 300


def test_chunk_id_for_is_deterministic_and_valid() -> None:
    first = chunk_id_for("docs", "guide.md", "some text")
    assert first == chunk_id_for("docs", "guide.md", "some text")
    assert validate_chunk_id(first) == first
    assert len(first) == 32


def test_chunk_id_for_is_scoped_by_collection_doc_and_text() -> None:
    base = chunk_id_for("docs", "guide.md", "text")
    variants = {
        chunk_id_for("other", "guide.md", "text"),
        chunk_id_for("docs", "other.md", "text"),
        chunk_id_for("docs", "guide.md", "text "),
        # Concatenation must not collide: the parts are delimited.
        chunk_id_for("doc", "sguide.md", "text"),
        chunk_id_for("docs", "guide.m", "dtext"),
    }
    assert base not in variants
    assert len(variants) == 5


@pytest.mark.parametrize(
    "chunk_id", ["", "0" * 31, "0" * 33, "A" * 32, "g" * 32, "0" * 32 + "\n", " " + "0" * 31]
)
def test_bad_chunk_ids_are_rejected(chunk_id: str) -> None:
    with pytest.raises(ServiceError) as exc:
        validate_chunk_id(chunk_id)
    assert_invalid(exc)


def test_doc_key_is_kv_safe_and_distinct() -> None:
    key = doc_key("docs", "a/b c:d?")
    assert key.startswith("docs.")
    assert all(ch.isalnum() or ch in "._-" for ch in key)
    assert key != doc_key("docs", "a/b c:d")
    assert key == doc_key("docs", "a/b c:d?")


def test_document_shard_follows_the_bucket_and_spreads_documents() -> None:
    docs = [f"guide/page-{i}.md" for i in range(6000)]
    for count in (1, 2, 3):
        tally = collections.Counter(document_shard(d, count) for d in docs)
        assert set(tally) == set(range(count))
        assert all(abs(n - len(docs) / count) < 0.1 * len(docs) / count for n in tally.values()), tally
    # A bucket moves as one: every document of a bucket is on the same shard.
    assert all(document_shard(d, 4) == bucket_of(d) % 4 for d in docs[:100])
    assert document_shard("a.md", 0) == 0
    # Pinned: the rule must not change under deployed stores, or documents land on the wrong shard.
    assert document_shard("a.md", 4) == 1 and document_shard("guide/intro.md", 7) == 0


def test_a_sparse_shard_is_named_sparse_alone_and_numbered_among_several() -> None:
    # The process, its data dir, the clients' targets and the degradations all use this name.
    assert sparse_shard_name(0, 1) == "sparse"
    assert [sparse_shard_name(i, 3) for i in range(3)] == ["sparse-0", "sparse-1", "sparse-2"]
