from __future__ import annotations

from pathlib import Path

import pytest

from meshkit.domain.ids import chunk_id_for
from services.sparse.collection import Collection
from services.sparse.records import ChunkRecord, DocumentUpdate

COLLECTION = "test"


def chunk(doc_id: str, text: str, title: str = "", location: bytes = b"") -> ChunkRecord:
    return ChunkRecord(chunk_id_for(COLLECTION, doc_id, text), doc_id, title, text, location)


def put(collection: Collection, doc_id: str, *chunks: ChunkRecord, keep: tuple[str, ...] = ()) -> None:
    collection.replace_documents([DocumentUpdate(doc_id, list(chunks), list(keep))])


def open_collection(root: Path) -> Collection:
    return Collection(root, COLLECTION, heap_bytes=32 * 1024 * 1024, title_boost=1.5)


@pytest.fixture
def collection(tmp_path: Path) -> Collection:
    return open_collection(tmp_path)
