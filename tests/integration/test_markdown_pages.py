"""A documentation page written for a static-site generator (Hugo front matter, shortcodes), as
the grpc-docs corpus holds them, through the real write path: what the stores keep is the
page's text under its front-matter title, not its metadata or template calls."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from meshkit.text.evidence import evidence_sentences
from ragmesh.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from ragmesh.ingestion.v1 import ingestion_pb2
from ragmesh.sparse.v1 import sparse_pb2
from ragmesh_cli.stack import Stack

from .meshclients import Mesh

pytestmark = pytest.mark.integration

PAGE = """---
title: Keepalive
description: >-
  How to use HTTP/2 PING-based keepalives in ragmesh.
weight: 70
linkTitle: zanzibarlink
---

### Overview

HTTP/2 PING-based keepalives keep a ragmesh connection alive when no data is transferred.

{{% alert title="Note" color="info" %}}
  Health checking is a separate ragmesh concern.
{{% /alert %}}

{{< youtube id="cSGBbwvW1y4" class="youtube-video" >}}
"""

PLACEHOLDER = "---\ntitle: API reference\n_build: { render: link }\n---\n"


@pytest.fixture
async def mesh(stack: Stack) -> AsyncIterator[Mesh]:
    clients = Mesh(stack)
    yield clients
    await clients.close()


async def test_hugo_page_is_stored_as_its_text_under_its_title(mesh: Mesh) -> None:
    collection = f"t-{uuid.uuid4().hex[:10]}"
    await mesh.ingest(collection, [("guides/keepalive.md", PAGE), ("api.md", PLACEHOLDER)])
    statuses = await mesh.wait_settled(collection, ["guides/keepalive.md", "api.md"])
    assert {s.state for s in statuses.values()} == {ingestion_pb2.DOCUMENT_STATE_INDEXED}

    hits = await mesh.sparse_chunks_of(collection, "guides/keepalive.md")
    reply = await mesh.sparse.GetChunks(
        sparse_pb2.GetChunksRequest(collection=collection, chunk_ids=[h.chunk_id for h in hits]), timeout=10
    )
    text = "\n".join(chunk.text for chunk in reply.chunks)
    assert {chunk.title for chunk in reply.chunks} == {"Keepalive"}
    assert text.startswith("Keepalive\n\nHow to use HTTP/2 PING-based keepalives in ragmesh.")
    assert "Health checking is a separate ragmesh concern." in text
    for metadata in ("---", "weight", "linkTitle", "{{", "}}", "youtube"):
        assert metadata not in text
    # Front-matter values are not searchable words of the page.
    assert await mesh.bm25(collection, "zanzibarlink") == []
    assert "Health checking is a separate ragmesh concern." in evidence_sentences(text)

    placeholder = await mesh.bm25(collection, "reference")
    assert [hit.doc_id for hit in placeholder] == ["api.md"]


OLD_PAGE = """---
title: Redelivery limits in Streaming
deprecated: true
---

Streaming limits the redeliveries of a message with max_deliver: after that many deliveries
the message is dropped. Set max_deliver on the subscription to limit redeliveries.
"""

CURRENT_PAGE = """---
title: Consumer redelivery
---

A consumer limits how often a message is redelivered with max_deliver. After max_deliver
deliveries the message is no longer redelivered.
"""


async def test_a_deprecated_page_ranks_after_the_current_one_that_answers_too(
    mesh: Mesh, gateway: gateway_pb2_grpc.GatewayServiceStub
) -> None:
    collection = f"t-{uuid.uuid4().hex[:10]}"
    pages = [("streaming/redelivery.md", OLD_PAGE), ("jetstream/consumers.md", CURRENT_PAGE)]
    await mesh.ingest(collection, pages)
    statuses = await mesh.wait_settled(collection, [doc_id for doc_id, _ in pages])
    assert {s.state for s in statuses.values()} == {ingestion_pb2.DOCUMENT_STATE_INDEXED}

    question = "How do I limit the redeliveries of a message with max_deliver on the subscription?"
    request = gateway_pb2.SearchRequest(
        collection=collection, query=question, top_k=5, collapse_documents=True
    )
    # Without the mark the old page, which repeats the question's words, would come first.
    legs = await gateway.Search(
        gateway_pb2.SearchRequest(
            collection=collection, query=question, top_k=5, collapse_documents=True, include_leg_results=True
        ),
        timeout=30,
    )
    bm25 = next(leg for leg in legs.leg_results if leg.leg == gateway_pb2.LEG_BM25)
    assert bm25.hits[0].doc_id == "streaming/redelivery.md"
    response = await gateway.Search(request, timeout=30)
    assert [r.doc_id for r in response.results] == ["jetstream/consumers.md", "streaming/redelivery.md"]
    assert response.results[1].metadata["deprecated"] == "true"
    assert response.results[0].score >= response.results[1].score
