"""Pages marked deprecated or legacy rank after current ones (services/gateway/legacy.py): the
marks, the stable partition, and a search through the gateway against fake downstreams."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragmesh.gateway.v1 import gateway_pb2 as pb
from ragmesh.sparse.v1 import sparse_pb2
from services.gateway.fusion import Fused, ordering_scores
from services.gateway.legacy import current_first, is_legacy, path_segments

from .conftest import COLLECTION, NAME_OF, running_gateway

SEGMENTS = path_segments(" legacy, V1-Archive ,,")


def chunk(metadata: dict[str, str] | None = None, source_uri: str = "") -> sparse_pb2.ChunkText:
    return sparse_pb2.ChunkText(chunk_id="c", metadata=metadata or {}, source_uri=source_uri)


def test_the_operators_segments_are_trimmed_and_case_folded() -> None:
    assert sorted(SEGMENTS) == ["legacy", "v1-archive"] and path_segments("") == frozenset()


@pytest.mark.parametrize(
    ("metadata", "source_uri", "legacy"),
    [
        ({"deprecated": "true"}, "", True),
        ({"legacy": "True "}, "", True),
        ({"status": "Archived"}, "", True),
        ({"status": "stable", "deprecated": "false"}, "", False),
        ({}, "file:///site/docs/legacy/streaming.md", True),
        ({}, "s3://bucket/V1-ARCHIVE/page.md", True),
        ({}, "file:///site/docs/legacy-notes/page.md", False),  # a segment, not a substring
        ({}, "file:///site/docs/current/page.md", False),
    ],
)
def test_what_marks_a_page_legacy(metadata: dict[str, str], source_uri: str, legacy: bool) -> None:
    assert is_legacy(chunk(metadata, source_uri), SEGMENTS) is legacy
    assert not is_legacy(None, SEGMENTS)


@given(st.text(alphabet="/legacy-", max_size=5000))
def test_a_path_rule_is_a_split_whatever_the_uri(uri: str) -> None:
    assert is_legacy(chunk(source_uri=uri), SEGMENTS) == ("legacy" in uri.split("/"))


def test_current_results_keep_their_order_and_legacy_ones_follow_in_theirs() -> None:
    items = [Fused(chunk_id=f"c{i}", doc_id=f"d{i}", score=1.0 - i / 10) for i in range(5)]
    chunks = {"c0": chunk({"deprecated": "true"}), "c3": chunk(source_uri="a/legacy/b")}
    ordered = current_first(items, chunks, SEGMENTS)
    assert [item.chunk_id for item in ordered] == ["c1", "c2", "c4", "c0", "c3"]
    scores = ordering_scores(ordered)
    assert scores == sorted(scores, reverse=True)  # the score shown is the one that ordered them
    assert current_first(items, {}, SEGMENTS) == items


async def test_a_search_answers_current_pages_first_and_keeps_the_legacy_ones() -> None:
    async with running_gateway(gateway_legacy_path_segments="legacy") as gateway:
        gateway.fakes.chunk_metadata["c0"] = {"deprecated": "true"}
        gateway.fakes.chunk_sources["c2"] = "file:///site/legacy/alpha.md"
        request = pb.SearchRequest(
            collection=COLLECTION, query="what is a zx-81", pool_size=30, doc_ids=["alpha.md", "delta.md"]
        )
        response = await gateway.stub.Search(request, timeout=10)
    # Fused: c0 c2 c4 c1 c3 (test_search); c0 and c2 are legacy.
    assert [NAME_OF[r.chunk_id] for r in response.results] == ["c4", "c1", "c3", "c0", "c2"]
    scores = [r.score for r in response.results]
    assert scores == sorted(scores, reverse=True)
    assert response.results[3].metadata["deprecated"] == "true"
