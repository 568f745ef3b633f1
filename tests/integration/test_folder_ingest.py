"""``ragmesh ingest DIR`` against the real stack as it ships (``auth_stack``: API keys, mTLS, two
ingestion workers, two index shards, production timings): a folder with bad files among good
ones, a folder synced after a file was deleted (and its dry run), front matter from the grpc-docs
corpus filtered through the gateway, and an Obsidian vault."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc import aio

from ragmesh.index.v1 import index_pb2
from ragmesh.ingestion.v1 import ingestion_pb2
from ragmesh.sparse.v1 import sparse_pb2
from ragmesh_cli.main import main
from ragmesh_cli.stack import Stack
from ragmesh_client import EXISTS, Filter, SearchResult

from .meshclients import MD, Mesh

pytestmark = pytest.mark.integration

# Three real grpc-docs pages, committed with the tests (their README says where from).
GRPC_DOCS = Path(__file__).parent / "data" / "grpc-docs"
INDEXED = ingestion_pb2.DOCUMENT_STATE_INDEXED


@pytest.fixture
async def mesh(auth_stack: Stack) -> AsyncIterator[Mesh]:
    clients = Mesh(auth_stack)
    yield clients
    await clients.close()


def new_collection() -> str:
    return f"f-{uuid.uuid4().hex[:10]}"


def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        path.write_text(content)
    else:
        path.write_bytes(content)
    return path


async def ingest(stack: Stack, folder: Path, collection: str, *extra: str) -> int:
    # The CLI's own size check at 1 MB (the "too large" file is over it). In a thread:
    # the command runs an event loop of its own.
    return await asyncio.to_thread(
        main,
        [
            "ingest",
            str(folder),
            "--collection",
            collection,
            "--state-dir",
            str(stack.state_dir),
            "--max-file-bytes",
            "1000000",
            *extra,
        ],
    )


async def index_doc_ids(mesh: Mesh, collection: str) -> set[str]:
    found: set[str] = set()
    for shard in mesh.shards:
        try:
            reply = await shard.ListDocuments(
                index_pb2.ListDocumentsRequest(collection=collection), timeout=10
            )
        except aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise
            continue
        found.update(d.doc_id for d in reply.documents if d.chunk_ids)
    return found


async def sparse_doc_ids(mesh: Mesh, collection: str) -> set[str]:
    reply = await mesh.sparse.ListDocuments(
        sparse_pb2.ListDocumentsRequest(collection=collection), timeout=10
    )
    return {d.doc_id for d in reply.documents if d.chunk_ids}


async def search(
    stack: Stack, collection: str, query: str, filter: Filter | None = None
) -> tuple[SearchResult, ...]:
    mesh = Mesh(stack)
    try:
        reply = await mesh.client().search(collection, query, top_k=20, filter=filter, timeout=60)
    finally:
        await mesh.close()
    return reply.results


async def test_bad_files_are_skipped_and_listed_and_the_good_ones_go_in(
    auth_stack: Stack, mesh: Mesh, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "docs"
    write(folder / "good.md", "# Good\n\nA valid ragmesh page about keepalives.\n")
    write(folder / "sub" / "notes.txt", "Plain ragmesh notes.\n")
    write(folder / "stub.md", "# Zanzibar changelog\n")
    write(folder / "empty.md", "")
    write(folder / "blank.md", "  \n\n")
    write(folder / "image.png", b"\x89PNG\r\n\x1a\n")
    write(folder / "latin1.md", b"caf\xe9 ragmesh")
    write(folder / "huge.md", "ragmesh " * 200_000)
    collection = new_collection()
    assert await ingest(auth_stack, folder, collection, "--wait") == 0
    out = capsys.readouterr().out
    for name, reason in [
        ("empty.md", "empty"),
        ("blank.md", "empty"),
        ("image.png", "unsupported format"),
        ("latin1.md", "not UTF-8"),
        ("huge.md", "too large"),
    ]:
        assert f"{folder / name}: {reason}" in out, out
    statuses = await mesh.statuses(collection, ["good.md", "sub/notes.txt", "stub.md"])
    assert {s.state for s in statuses.values()} == {INDEXED}
    # The heading-only page is indexed as its title.
    assert [h.doc_id for h in await mesh.bm25(collection, "zanzibar")] == ["stub.md"]
    # --strict: the same folder exits non-zero (the good files are unchanged, the bad listed).
    assert await ingest(auth_stack, folder, collection, "--strict") == 1
    # Nothing that can go in: non-zero.
    only_bad = tmp_path / "bad"
    write(only_bad / "empty.md", "")
    assert await ingest(auth_stack, only_bad, new_collection()) == 1


async def test_sync_deletes_the_documents_of_deleted_files_from_every_store(
    auth_stack: Stack, mesh: Mesh, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    collection = new_collection()
    folder = tmp_path / "site"
    other = tmp_path / "site-old"  # a prefix of the folder's name: must never match it
    write(folder / "keep.md", "# Keep\n\nThe ragmesh page that stays.\n")
    write(folder / "gone.md", "# Gone\n\nThe ragmesh page about zeppelins that is deleted.\n")
    write(other / "elsewhere.md", "# Elsewhere\n\nAnother ragmesh folder about zeppelins.\n")
    assert await ingest(auth_stack, folder, collection, "--wait") == 0
    assert await ingest(auth_stack, other, collection, "--wait") == 0
    # An API document without a file source is never a sync's business either.
    await mesh.ingest_indexed(collection, [("api-doc.md", "# API\n\nA ragmesh document about zeppelins.")])
    everything = {"keep.md", "gone.md", "elsewhere.md", "api-doc.md"}
    assert await index_doc_ids(mesh, collection) == everything
    assert await sparse_doc_ids(mesh, collection) == everything
    (folder / "gone.md").unlink()
    (other / "elsewhere.md").unlink()  # gone too, but another folder: this sync leaves it
    write(folder / "new.md", "# New\n\nA new ragmesh page.\n")
    capsys.readouterr()

    # The dry run lists, and changes nothing.
    assert await ingest(auth_stack, folder, collection, "--sync", "--dry-run") == 0
    out = capsys.readouterr().out
    assert "would add: 1\n  new.md" in out and "would delete: 1\n  gone.md" in out
    assert "elsewhere.md" not in out and "api-doc.md" not in out and "unchanged: 1" in out
    assert await index_doc_ids(mesh, collection) == everything
    assert await sparse_doc_ids(mesh, collection) == everything
    with pytest.raises(aio.AioRpcError):
        await mesh.statuses(collection, ["new.md"])

    assert await ingest(auth_stack, folder, collection, "--sync", "--wait") == 0
    assert "deleted (files gone): 1\n  gone.md" in capsys.readouterr().out
    remaining = {"keep.md", "new.md", "elsewhere.md", "api-doc.md"}
    assert await index_doc_ids(mesh, collection) == remaining
    assert await sparse_doc_ids(mesh, collection) == remaining
    status = (await mesh.statuses(collection, ["gone.md"]))["gone.md"]
    assert status.state == ingestion_pb2.DOCUMENT_STATE_DELETED
    hits = await search(auth_stack, collection, "zeppelins")
    assert hits and "gone.md" not in {h.doc_id for h in hits}
    assert {"elsewhere.md", "api-doc.md"} <= {h.doc_id for h in hits}
    # An empty folder never empties the collection.
    (folder / "keep.md").unlink()
    (folder / "new.md").unlink()
    assert await ingest(auth_stack, folder, collection, "--sync") == 1
    assert "not syncing" in capsys.readouterr().out
    assert await index_doc_ids(mesh, collection) == remaining


async def test_front_matter_of_grpc_docs_is_filterable_metadata(auth_stack: Stack, tmp_path: Path) -> None:
    folder = tmp_path / "grpc"
    folder.mkdir()
    for name in ("introduction.md", "core-concepts.md", "faq.md"):
        shutil.copy(GRPC_DOCS / name, folder / name)
    collection = new_collection()
    assert await ingest(auth_stack, folder, collection, "--wait") == 0
    everything = await search(auth_stack, collection, "gRPC protocol buffers")
    assert {h.doc_id for h in everything} == {"introduction.md", "core-concepts.md", "faq.md"}
    linked = await search(auth_stack, collection, "gRPC protocol buffers", {"linkTitle": "Introduction"})
    assert linked and {h.doc_id for h in linked} == {"introduction.md"}
    assert linked[0].title == "Introduction to gRPC"
    assert linked[0].metadata["weight"] == "10"
    weighted = await search(auth_stack, collection, "gRPC", {"weight": EXISTS})
    assert {h.doc_id for h in weighted} == {"introduction.md"}
    # Front matter is not body text.
    assert all("linkTitle" not in h.text and "spelling:" not in h.text for h in everything)


async def test_obsidian_vault(auth_stack: Stack, mesh: Mesh, tmp_path: Path) -> None:
    vault = tmp_path / "vault"
    write(vault / ".obsidian" / "app.json", '{"theme": "dark"}')
    write(vault / ".obsidian" / "notes.md", "# Settings ragmesh page that must not be indexed\n")
    write(
        vault / "Daily" / "Standup.md",
        "---\ntags: [meeting]\n---\n\nDiscussed [[Projects/Zeppelin Launch|the launch]] and "
        "[[Budget#Q3]] with the ragmesh team. ![[whiteboard.png]] #status/active\n",
    )
    write(vault / "Budget.md", "# Budget\n\nThe ragmesh budget for Q3.\n")
    collection = new_collection()
    assert await ingest(auth_stack, vault, collection, "--wait") == 0
    assert await index_doc_ids(mesh, collection) == {"Daily/Standup.md", "Budget.md"}
    hits = await search(auth_stack, collection, "launch budget standup")
    standup = next(h for h in hits if h.doc_id == "Daily/Standup.md")
    assert "Discussed the launch and Budget > Q3 with the ragmesh team." in standup.text
    assert "[[" not in standup.text and "whiteboard" not in standup.text
    assert standup.metadata["tags"] == "meeting, status/active"
    tagged = await search(auth_stack, collection, "ragmesh", {"tag:status.active": "true"})
    assert {h.doc_id for h in tagged} == {"Daily/Standup.md"}


async def test_the_service_rejects_bad_documents_one_by_one(mesh: Mesh) -> None:
    collection = new_collection()
    reply = await mesh.ingest(
        collection, [("good.md", "# Fine\n\nA valid ragmesh document."), ("empty.md", "", MD)]
    )
    assert [(r.doc_id, r.outcome) for r in reply.results] == [
        ("good.md", ingestion_pb2.SUBMIT_OUTCOME_QUEUED),
        ("empty.md", ingestion_pb2.SUBMIT_OUTCOME_REJECTED),
    ]
    assert "empty" in reply.results[1].reason
    assert (await mesh.wait_settled(collection, ["good.md"]))["good.md"].state == INDEXED
