"""The ingestion start bench records statuses the API reads as it reads its own: a file of a
bench folder, submitted again unchanged, is "unchanged" by the API's own rule, and the status
index makes the same row of the entry as of the decoded status."""

from __future__ import annotations

import json
from pathlib import Path

from bench.ingestion_start_bench import COLLECTION, entries, folder_file, unchanged_summary, write_folder
from meshkit.domain.ids import doc_key, sha256_hex
from services.ingestion.events import IngestEvent
from services.ingestion.lifecycle.entries import DocStatus
from services.ingestion.lifecycle.machine import QUEUED
from services.ingestion.lifecycle.requests import UNCHANGED, unneeded
from services.ingestion.lifecycle.rows import row_from_entry, row_of


def _template() -> dict[str, object]:
    event = IngestEvent(
        op="upsert",
        collection=COLLECTION,
        doc_id="sample.txt",
        content_sha256="0" * 64,
        object_key="k",
        format=1,
        source_uri="file:///tmp/template/sample.txt",
        request_id="r1",
    )
    status = DocStatus(COLLECTION, "sample.txt", QUEUED, request=event, target_sha256="0" * 64)
    decoded: dict[str, object] = json.loads(status.to_bytes())
    return decoded


def _submitted_again(path: Path, doc_id: str) -> IngestEvent:
    """The event the API builds when ``ragmesh ingest`` submits the file again."""
    return IngestEvent(
        op="upsert",
        collection=COLLECTION,
        doc_id=doc_id,
        content_sha256=sha256_hex(path.read_bytes()),
        source_uri=path.absolute().as_uri(),
    )


def test_a_recorded_folder_file_submitted_again_is_unchanged(tmp_path: Path) -> None:
    roots = [tmp_path / "folder-3", tmp_path / "folder-5"]
    for root, n in zip(roots, (3, 5), strict=True):
        write_folder(root, n)
    recorded = dict(entries(_template(), roots, [3, 5], 12))
    assert len(recorded) == 12
    # The folders' ids are distinct (each starts with its folder's name), the rest synthetic.
    assert sum(d.startswith("folder-3/") for d in recorded) == 3
    assert sum(d.startswith("synthetic/") for d in recorded) == 4
    for root in roots:
        for i in range(3):
            path, _content = folder_file(root, i)
            doc_id = path.relative_to(root).as_posix()
            status = DocStatus.from_bytes(json.dumps(recorded[doc_id]).encode())
            assert unneeded(status, _submitted_again(path, doc_id)) == UNCHANGED
            key = doc_key(COLLECTION, doc_id)
            data = json.dumps(recorded[doc_id]).encode()
            assert row_from_entry(key, 7, data) == row_of(key, 7, status)
    # Another file's bytes at that path are a change.
    path, _content = folder_file(roots[0], 0)
    doc_id = path.relative_to(roots[0]).as_posix()
    path.write_bytes(b"edited\n")
    status = DocStatus.from_bytes(json.dumps(recorded[doc_id]).encode())
    assert unneeded(status, _submitted_again(path, doc_id)) is None


def test_the_cli_summary_line_is_picked_out() -> None:
    output = (
        "submitted: 10doc\nsubmitted 10 documents to collection 'c': 0 queued, 10 unchanged, 0 rejected\n"
    )
    assert unchanged_summary(output).endswith("0 queued, 10 unchanged, 0 rejected")
    assert unchanged_summary("no summary") == ""
