"""What a submitted document carries into both stores, with the real API and workers on a real
nats-server (fakes only for the object store and the stores, see conftest): title, source URI
and metadata (front matter merged, the caller's keys win), a bad document rejected alone while
the good ones go in, and the same bytes indexed again when their description or the
preparation version changes.
"""

from __future__ import annotations

import pytest

from meshkit.core.errors import ServiceError
from ragmesh.ingestion.v1 import ingestion_pb2
from services.ingestion.lifecycle import claims, requests

from .conftest import MD, Harness
from .write_helpers import INDEXED, doc


async def test_source_uri_title_and_metadata_reach_both_stores_with_the_chunk_text(harness: Harness) -> None:
    await harness.start_api()
    await harness.start_worker()
    document = ingestion_pb2.Document(
        doc_id="guide.md",
        title="The guide",
        format=ingestion_pb2.DOCUMENT_FORMAT_MARKDOWN,
        content=doc("alpha").encode(),
        source_uri="file:///srv/docs/guide.md",
        metadata={"team": "docs", "lang": "en"},
    )
    await harness.api.IngestDocuments(
        ingestion_pb2.IngestDocumentsRequest(collection="c", documents=[document]), None
    )
    await harness.wait_state("c", "guide.md", INDEXED)
    assert harness.stores.index_service is not None
    index = harness.stores.index_service.replacements["guide.md"]
    sparse = harness.stores.sparse_service.replacements["guide.md"]
    for replacement in (index, sparse):
        assert replacement.source.source_uri == "file:///srv/docs/guide.md"
        assert dict(replacement.source.metadata) == {"team": "docs", "lang": "en"}
        assert replacement.source.title
    # The index keeps the passage text (the payload the gateway reads when sparse is down).
    assert [c.text for c in index.upserts] == [c.text for c in sparse.upserts] and index.upserts[0].text
    assert index.upserts[0].location.char_end > 0

    bad = ingestion_pb2.Document(doc_id="x.md", content=b"# x\n\ntext", metadata={"has space": "v"})
    reply = await harness.api.IngestDocuments(
        ingestion_pb2.IngestDocumentsRequest(collection="c", documents=[bad]), None
    )
    assert reply.results[0].outcome == ingestion_pb2.SUBMIT_OUTCOME_REJECTED
    assert "may only hold letters" in reply.results[0].reason


async def test_a_bad_document_is_rejected_alone_and_the_good_ones_go_in(harness: Harness) -> None:
    await harness.start_api(ingest_max_document_bytes=10_000)
    await harness.start_worker()
    docs = [
        ingestion_pb2.Document(doc_id="good.md", format=MD, content=doc("alpha").encode()),
        ingestion_pb2.Document(doc_id="empty.md", format=MD, content=b"  \n"),
        ingestion_pb2.Document(doc_id="latin1.md", format=MD, content=b"caf\xe9"),
        ingestion_pb2.Document(doc_id="huge.md", format=MD, content=b"x" * 10_001),
        ingestion_pb2.Document(doc_id="good.md", format=MD, content=b"# twice"),
        ingestion_pb2.Document(doc_id="stub.md", format=MD, content=b"# Just a title\n"),
    ]
    reply = await harness.api.IngestDocuments(
        ingestion_pb2.IngestDocumentsRequest(collection="c", documents=docs), None
    )
    outcomes = [(r.doc_id, r.outcome) for r in reply.results]
    assert outcomes == [
        ("good.md", ingestion_pb2.SUBMIT_OUTCOME_QUEUED),
        ("empty.md", ingestion_pb2.SUBMIT_OUTCOME_REJECTED),
        ("latin1.md", ingestion_pb2.SUBMIT_OUTCOME_REJECTED),
        ("huge.md", ingestion_pb2.SUBMIT_OUTCOME_REJECTED),
        ("good.md", ingestion_pb2.SUBMIT_OUTCOME_REJECTED),
        ("stub.md", ingestion_pb2.SUBMIT_OUTCOME_QUEUED),
    ]
    reasons = [r.reason for r in reply.results]
    assert "empty" in reasons[1] and "UTF-8" in reasons[2] and "too large" in reasons[3]
    assert "twice" in reasons[4] and not reasons[0]
    await harness.wait_state("c", "good.md", INDEXED)
    # A heading-only page is indexed as its title instead of failing with "no chunks".
    await harness.wait_state("c", "stub.md", INDEXED)
    assert harness.stores.index_service is not None
    stub = harness.stores.index_service.replacements["stub.md"]
    assert stub.source.title == "Just a title" and "Just a title" in stub.upserts[0].text
    for doc_id in ("empty.md", "latin1.md", "huge.md"):
        with pytest.raises(ServiceError, match="no such documents"):
            await harness.status("c", doc_id)


async def test_front_matter_metadata_reaches_both_stores_and_the_caller_wins(harness: Harness) -> None:
    await harness.start_api()
    await harness.start_worker()
    page = (
        "---\ntitle: Guide\ntags: [Alpha, beta]\nteam: platform\n---\n\nThe body #gamma, see [[Other|it]].\n"
    )
    document = ingestion_pb2.Document(
        doc_id="fm.md",
        format=ingestion_pb2.DOCUMENT_FORMAT_OBSIDIAN_MARKDOWN,
        content=page.encode(),
        metadata={"team": "docs"},
    )
    await harness.api.IngestDocuments(
        ingestion_pb2.IngestDocumentsRequest(collection="c", documents=[document]), None
    )
    await harness.wait_state("c", "fm.md", INDEXED)
    assert harness.stores.index_service is not None
    for stores in (harness.stores.index_service, harness.stores.sparse_service):
        source = stores.replacements["fm.md"].source
        assert source.title == "Guide"
        assert dict(source.metadata) == {
            "team": "docs",
            "tags": "alpha, beta, gamma",
            "tag:alpha": "true",
            "tag:beta": "true",
            "tag:gamma": "true",
        }


async def test_new_metadata_on_unchanged_bytes_reaches_both_stores(harness: Harness) -> None:
    await harness.start_api()
    await harness.start_worker()

    def document(team: str) -> ingestion_pb2.Document:
        return ingestion_pb2.Document(
            doc_id="guide.md",
            format=ingestion_pb2.DOCUMENT_FORMAT_MARKDOWN,
            content=doc("alpha").encode(),
            source_uri="file:///srv/docs/guide.md",
            metadata={"team": team},
        )

    async def submit(team: str) -> ingestion_pb2.SubmitResult:
        request = ingestion_pb2.IngestDocumentsRequest(collection="c", documents=[document(team)])
        return (await harness.api.IngestDocuments(request, None)).results[0]

    await submit("docs")
    await harness.wait_state("c", "guide.md", INDEXED)
    assert (await submit("docs")).outcome == ingestion_pb2.SUBMIT_OUTCOME_UNCHANGED
    assert (await submit("platform")).outcome == ingestion_pb2.SUBMIT_OUTCOME_QUEUED
    await harness.wait_state("c", "guide.md", INDEXED)
    assert harness.stores.index_service is not None
    for store in (harness.stores.index_service, harness.stores.sparse_service):
        assert dict(store.replacements["guide.md"].source.metadata) == {"team": "platform"}
    assert (await submit("platform")).outcome == ingestion_pb2.SUBMIT_OUTCOME_UNCHANGED


async def test_a_document_indexed_by_an_older_preparation_is_indexed_again(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    await harness.start_api()
    await harness.start_worker()
    await harness.submit("c", "n.md", doc("same"))
    await harness.wait_state("c", "n.md", INDEXED)
    assert (await harness.submit("c", "n.md", doc("same"))).outcome == ingestion_pb2.SUBMIT_OUTCOME_UNCHANGED
    # A new release changes what the same bytes become.
    # Both users of the version: the API's check (lifecycle.requests) and the worker's record
    # (lifecycle.claims).
    newer = requests.PREPARATION_VERSION + 1
    monkeypatch.setattr(requests, "PREPARATION_VERSION", newer)
    monkeypatch.setattr(claims, "PREPARATION_VERSION", newer)
    assert (await harness.submit("c", "n.md", doc("same"))).outcome == ingestion_pb2.SUBMIT_OUTCOME_QUEUED
    status = await harness.wait_state("c", "n.md", INDEXED)
    assert status.attempts >= 1
    assert (await harness.submit("c", "n.md", doc("same"))).outcome == ingestion_pb2.SUBMIT_OUTCOME_UNCHANGED
