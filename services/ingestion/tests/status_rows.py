"""Rows and expectations shared by the status index tests."""

from __future__ import annotations

from meshkit.domain.ids import doc_key
from services.ingestion.lifecycle.index import (
    CollectionCounts,
    Removal,
    StatusIndex,
)
from services.ingestion.lifecycle.machine import (
    INDEXED,
    STATES,
)
from services.ingestion.lifecycle.rows import Row

C = "col"
OTHER = "other"


def make_row(
    doc_id: str,
    revision: int,
    state: str = INDEXED,
    chunks: int = 1,
    collection: str = C,
    source_uri: str = "",
) -> Row:
    return Row(
        collection=collection,
        doc_id=doc_id,
        key=doc_key(collection, doc_id),
        revision=revision,
        state=state,
        chunks=chunks,
        source_uri=source_uri,
        op="upsert",
        target_sha256=f"t{revision}",
        indexed_sha256=f"i{revision}" if state == INDEXED else "",
        indexed_version=1,
        source_digest="",
    )


def removal(doc_id: str, revision: int, collection: str = C) -> Removal:
    return Removal(doc_key(collection, doc_id), revision)


def all_rows(index: StatusIndex, collection: str = C) -> list[Row]:
    rows: list[Row] = []
    after = ""
    while True:
        page = index.rows_after(collection, after, 97)
        rows += page
        if len(page) < 97:
            return rows
        after = page[-1].doc_id


def expected_counts(rows: list[Row]) -> CollectionCounts | None:
    if not rows:
        return None
    by_state = {state: sum(1 for r in rows if r.state == state) for state in STATES}
    return CollectionCounts(by_state, sum(r.chunks for r in rows if r.state == INDEXED))
