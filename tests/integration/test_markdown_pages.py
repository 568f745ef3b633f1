"""A documentation page written for a static-site generator (Hugo front matter, shortcodes), as
the grpc-docs corpus holds them, through the real write path: what the stores keep is the
page's text under its front-matter title, not its metadata or template calls."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from meshkit.text.evidence import evidence_sentences
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
