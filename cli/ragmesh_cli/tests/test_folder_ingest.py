"""Forgiving folder ingest, vault detection and the sync plan of ``ragmesh ingest`` (pure
parts; the wire is tested in tests/integration/test_folder_ingest.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio

from ragmesh.ingestion.v1 import ingestion_pb2, ingestion_pb2_grpc
from ragmesh_cli import documents, folder_sync, ingest
from ragmesh_cli.documents import Skipped, WalkStats
from ragmesh_client import DocumentSummary

from .fake_ingestion import serve

MD = ingestion_pb2.DOCUMENT_FORMAT_MARKDOWN
OBSIDIAN = ingestion_pb2.DOCUMENT_FORMAT_OBSIDIAN_MARKDOWN
PDF = ingestion_pb2.DOCUMENT_FORMAT_PDF
FORMATS = {".md": MD, ".txt": ingestion_pb2.DOCUMENT_FORMAT_TEXT, ".pdf": PDF}


def fake_detect(filename: str, content: bytes) -> int | None:
    return FORMATS.get(Path(filename).suffix)


def write(path: Path, content: str | bytes = "some text") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        path.write_text(content)
    else:
        path.write_bytes(content)
    return path


def collect(paths: list[Path], max_file_bytes: int = 1000) -> tuple[list[ingestion_pb2.Document], WalkStats]:
    stats, warnings = WalkStats(), []
    docs = list(documents.iter_documents(paths, fake_detect, stats, warnings.append, max_file_bytes))
    assert len(warnings) == len(stats.skipped) + len(stats.duplicates)
    return docs, stats


def test_bad_files_are_skipped_with_their_reason_and_the_good_ones_kept(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    write(root / "good.md", "# Good\n\ntext")
    write(root / "empty.md", "")
    write(root / "blank.txt", " \n\t")
    write(root / "image.png", b"\x89PNG")
    write(root / "latin1.md", b"caf\xe9")
    write(root / "nul.txt", b"a\x00b")
    write(root / "fake.pdf", b"not a pdf")
    write(root / "huge.md", "x" * 1001)
    docs, stats = collect([root])
    assert [d.doc_id for d in docs] == ["good.md"]
    reasons = {Path(s.path).name: s.reason for s in stats.skipped}
    assert reasons == {
        "blank.txt": "empty",
        "empty.md": "empty",
        "fake.pdf": "not a PDF (no %PDF- header)",
        "huge.md": "too large (1001 bytes, the limit is 1000)",
        "image.png": "unsupported format",
        "latin1.md": "not UTF-8 text (byte 0xe9 at offset 3)",
        "nul.txt": "binary data, not text (NUL byte)",
    }
    assert stats.skipped_unknown == [str(root / "image.png")]
    # Every walked file counts as present for a sync, sent or not.
    assert stats.walked_ids == {"good.md", *reasons}


def test_unreadable_file_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "docs"
    write(root / "a.md")
    locked = write(root / "locked.md")
    real_read = Path.read_bytes

    def read_bytes(path: Path) -> bytes:
        if path == locked:
            raise PermissionError(13, "Permission denied")
        return real_read(path)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    docs, stats = collect([root])
    assert [d.doc_id for d in docs] == ["a.md"]
    assert stats.skipped == [Skipped(str(locked), "unreadable (Permission denied)")]


def test_a_vault_sends_obsidian_markdown_and_skips_dot_folders(tmp_path: Path) -> None:
    vault = tmp_path / "vault"
    write(vault / ".obsidian" / "workspace.md", "# app state")
    write(vault / "Note.md", "[[Other]]")
    write(vault / "sub" / "Deep.md", "text")
    write(vault / "sub" / "plain.txt", "text")
    docs, _ = collect([vault])
    assert {d.doc_id: d.format for d in docs} == {
        "Note.md": OBSIDIAN,
        "sub/Deep.md": OBSIDIAN,
        "sub/plain.txt": ingestion_pb2.DOCUMENT_FORMAT_TEXT,
    }
    # A folder inside a vault is in the vault; a folder beside it is not.
    docs, _ = collect([vault / "sub"])
    assert {d.doc_id: d.format for d in docs}["Deep.md"] == OBSIDIAN
    docs, _ = collect([write(tmp_path / "other" / "x.md").parent])
    assert docs[0].format == MD


def summary(doc_id: str, path: Path, sha: str = "", state: str = "indexed") -> DocumentSummary:
    return DocumentSummary(
        doc_id=doc_id, state=state, source_uri=path.absolute().as_uri(), content_sha256=sha
    )


def test_stale_documents_are_only_those_of_the_folder_whose_files_are_gone(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    kept = write(root / "kept.md")
    walked_but_skipped = write(root / "now-empty.md", "")
    listing = [
        summary("kept.md", kept),
        summary("gone.md", root / "gone.md"),
        summary("sub/gone too.md", root / "sub" / "gone too.md"),
        # Same relative id, another folder whose name extends this one's: never this sync's.
        summary("other.md", tmp_path / "docs-old" / "other.md"),
        summary("leaving.md", root / "leaving.md", state="deleting"),
        summary("now-empty.md", walked_but_skipped),
        DocumentSummary(doc_id="api.md", state="indexed", source_uri="", content_sha256=""),
        DocumentSummary(
            doc_id="http.md",
            state="indexed",
            source_uri="https://example.com/docs/gone.md",
            content_sha256="",
        ),
        # A file id this walk produced (renamed source, same doc id): kept.
        summary("renamed.md", root / "old-name.md"),
    ]
    stale = folder_sync.stale_documents(listing, [root], {"kept.md", "now-empty.md", "renamed.md"})
    assert stale == ["gone.md", "sub/gone too.md"]
    assert folder_sync.folder_prefix(root).endswith("/docs/")


def test_classify_compares_bytes_and_source(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    same, edited, _moved = (
        write(root / "same.md", "a"),
        write(root / "edited.md", "b"),
        write(root / "moved.md", "c"),
    )
    docs, _ = collect([root])

    def sha(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()

    listing = [
        summary("same.md", same, sha("a")),
        summary("edited.md", edited, sha("old")),
        summary("moved.md", tmp_path / "elsewhere" / "moved.md", sha("c")),
    ]
    plan = folder_sync.classify(docs, listing)
    assert (plan.added, plan.updated, plan.unchanged) == ([], ["edited.md", "moved.md"], ["same.md"])
    write(root / "new.md", "d")
    docs, _ = collect([root])
    assert folder_sync.classify(docs, listing).added == ["new.md"]


class RejectingStub:
    """IngestionService that rejects documents whose id starts with 'rej'."""

    async def IngestDocuments(self, request: Any, **_: Any) -> Any:
        return ingestion_pb2.IngestDocumentsResponse(
            results=[
                ingestion_pb2.SubmitResult(
                    doc_id=d.doc_id, outcome=ingestion_pb2.SUBMIT_OUTCOME_REJECTED, reason="bad metadata"
                )
                if d.doc_id.startswith("rej")
                else ingestion_pb2.SubmitResult(doc_id=d.doc_id, outcome=ingestion_pb2.SUBMIT_OUTCOME_QUEUED)
                for d in request.documents
            ]
        )


async def test_rejections_are_listed_and_decide_the_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "docs"
    write(root / "ok.md")
    write(root / "rej.md")
    write(root / "empty.md", "")
    stats = WalkStats()
    async with serve(RejectingStub()) as client:
        result = await ingest.submit(client, "c", [root], fake_detect, stats)
    assert (result.queued, result.rejected) == (1, [("rej.md", "bad metadata")])
    ingest._print_summary("c", result, stats)
    out = capsys.readouterr().out
    assert "rej.md: bad metadata" in out and f"{root / 'empty.md'}: empty" in out
    assert ingest._exit_code(result, stats, ingest.FolderOptions()) == 0
    assert ingest._exit_code(result, stats, ingest.FolderOptions(strict=True)) == 1
    nothing = ingest.IngestResult(submitted=1, rejected=[("rej.md", "bad metadata")])
    assert ingest._exit_code(nothing, WalkStats(), ingest.FolderOptions()) == 1


def test_what_ingest_sends_through_the_client_is_the_walked_document(tmp_path: Path) -> None:
    from ragmesh_client._convert import document_message

    vault = tmp_path / "vault"
    (vault / ".obsidian").mkdir(parents=True)
    write(vault / "note.md", "# Note\n\n[[Other]] #tag")
    write(tmp_path / "plain.txt", "text")
    write(tmp_path / "paper.pdf", b"%PDF-1.4 fake")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"_id": "c1", "title": "T", "text": "body"}\n')
    docs, _ = collect([vault, tmp_path / "plain.txt", tmp_path / "paper.pdf", corpus])
    assert {d.format for d in docs} == {OBSIDIAN, PDF, ingestion_pb2.DOCUMENT_FORMAT_TEXT}
    for doc in docs:
        assert document_message(ingest.client_document(doc)) == doc


class HoldingApi(ingestion_pb2_grpc.IngestionServiceServicer):
    """Documents by doc id: (source_uri, content_sha256, state); counts the documents it lists."""

    def __init__(self, docs: dict[str, tuple[str, str, int]]) -> None:
        self.docs = docs
        self.listed = 0

    async def ListDocuments(self, request: Any, context: aio.ServicerContext) -> Any:
        page = [
            ingestion_pb2.DocumentSummary(doc_id=d, source_uri=uri, content_sha256=sha, state=state)
            for d, (uri, sha, state) in sorted(self.docs.items())
            if uri.startswith(request.source_uri_prefix)
        ]
        self.listed += len(page)
        return ingestion_pb2.ListDocumentsResponse(documents=page)

    async def GetDocumentStatus(self, request: Any, context: aio.ServicerContext) -> Any:
        unknown = [d for d in request.doc_ids if d not in self.docs]
        if unknown:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown documents {unknown}")
        return ingestion_pb2.GetDocumentStatusResponse(
            documents=[
                ingestion_pb2.DocumentStatus(collection=request.collection, doc_id=d, state=self.docs[d][2])
                for d in request.doc_ids
            ]
        )


async def test_a_dry_run_over_folders_lists_only_them_and_finds_documents_held_from_elsewhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "docs"
    same = write(root / "same.md", "kept")
    write(root / "moved.md", "moved here")
    write(root / "new.md", "new")
    write(root / "gone-again.md", "was deleted")
    indexed, deleted = ingestion_pb2.DOCUMENT_STATE_INDEXED, ingestion_pb2.DOCUMENT_STATE_DELETED
    api = HoldingApi(
        {
            "same.md": (same.absolute().as_uri(), hashlib.sha256(b"kept").hexdigest(), indexed),
            # Held from another folder: submitting this file would update it.
            "moved.md": ("file:///elsewhere/moved.md", "0" * 64, indexed),
            "gone-again.md": ("file:///elsewhere/gone-again.md", "0" * 64, deleted),
            **{f"other-{i}.md": (f"file:///elsewhere/other-{i}.md", "0" * 64, indexed) for i in range(50)},
        }
    )
    async with serve(api) as client:
        code = await ingest._dry_run(client, "c", [root], fake_detect, ingest.FolderOptions(sync=True))
    out = capsys.readouterr().out
    assert code == 0
    assert "would add: 2\n  gone-again.md\n  new.md" in out
    assert "would update: 1\n  moved.md" in out and "unchanged: 1" in out and "would delete: 0" in out
    # The other folder's 50 documents were never listed: the listing is the folder's.
    assert api.listed == 1
