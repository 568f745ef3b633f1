"""The ingestion API's view of every document's lifecycle: the status index
(``index.StatusIndex``, SQLite in the API's data dir) fed by a follower of the status bucket
(``follow.IndexFollower``), so collection counts, listings and reindex passes cost their page,
never the collection, and the API starts in seconds whatever the document count. Writes made by
this process are applied at once (write-through) so a caller that just submitted sees its
documents as queued.

Until the index has applied everything the bucket held when the API started (a fresh data dir
rebuilds it from the first entry; a restart resumes from its sequence and is caught up within
moments), ``catching_up`` is true: the calls it answers are refused (``not_ready_reason``).

``follow_statuses`` is the watch loop the reconciler uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from meshkit.settings import IngestionSettings
from services.ingestion.lifecycle.entries import DocStatus
from services.ingestion.lifecycle.follow import IndexFollower
from services.ingestion.lifecycle.index import CollectionCounts, Removal, StatusIndex
from services.ingestion.lifecycle.rows import Row, row_of

# Its log lines keep the name they had before the view joined the lifecycle package.
log = logging.getLogger("services.ingestion.status_view")

__all__ = ["Apply", "CollectionCounts", "Row", "StatusView", "follow_statuses"]


class StatusView:
    def __init__(self, settings: IngestionSettings) -> None:
        self.settings = settings
        self.index: StatusIndex | None = None
        self.follower: IndexFollower | None = None

    async def start(self, js: JetStreamContext) -> None:
        """Open the index, follow the bucket from the index's sequence, and wait for it to catch
        up at most ``ingest_index_start_wait_s``: the API serves either way."""
        started = time.monotonic()
        self.index = StatusIndex(self.settings.index_dir())
        self.follower = IndexFollower(js, self.index)
        await self.follower.start()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.follower.caught_up.wait(), self.settings.ingest_index_start_wait_s)
        progress = {**self.follower.progress(), "start_s": round(time.monotonic() - started, 2)}
        if self.catching_up:
            log.warning(
                "serving while the status index catches up: collection status, listings and reindex "
                "answer UNAVAILABLE until it has",
                extra=progress,
            )
        else:
            log.info("status index ready", extra=progress)

    async def stop(self) -> None:
        if self.follower is not None:
            await self.follower.stop()
        if self.index is not None:
            self.index.close()

    @property
    def ready(self) -> StatusIndex:
        assert self.index is not None, "the view is not started"
        return self.index

    @property
    def catching_up(self) -> bool:
        return self.follower is None or not self.follower.caught_up.is_set()

    def not_ready_reason(self) -> str:
        """Why the index cannot answer yet ('' when it can)."""
        if not self.catching_up:
            return ""
        if self.follower is None:
            return "the status index is not open yet"
        progress = self.follower.progress()
        return (
            "the ingestion API's status index is catching up with NATS after a fresh start "
            f"({progress['applied_sequence']:,} of {progress['bucket_sequence_at_start']:,} status entries "
            "applied)"
        )

    # --- this process's own writes ------------------------------------------------------------

    def apply(self, key: str, revision: int, status: DocStatus | None) -> None:
        if status is None:
            self.ready.apply([Removal(key, revision)])
        else:
            self.ready.apply([row_of(key, revision, status)])

    # --- reads ----------------------------------------------------------------------------

    def counts(self, collection: str) -> CollectionCounts | None:
        return self.ready.counts(collection)

    def collections(self) -> list[str]:
        return self.ready.collections()

    def has_documents(self, collection: str) -> bool:
        return self.ready.counts(collection) is not None

    def documents(
        self, collection: str, source_prefix: str, after_doc_id: str, limit: int
    ) -> tuple[list[Row], bool]:
        """See ``StatusIndex.documents``."""
        return self.ready.documents(collection, source_prefix, after_doc_id, limit)

    def documents_by_source(
        self, collection: str, source_prefix: str, after_source_uri: str, after_doc_id: str, limit: int
    ) -> tuple[list[Row], bool]:
        """See ``StatusIndex.documents_by_source``."""
        return self.ready.documents_by_source(
            collection, source_prefix, after_source_uri, after_doc_id, limit
        )

    def rows_after(self, collection: str, after_doc_id: str, limit: int) -> list[Row]:
        return self.ready.rows_after(collection, after_doc_id, limit)

    def changes(self, collection: str) -> int:
        return self.ready.changes(collection)


Apply = Callable[[str, int, bytes | None], None]


async def follow_statuses(watcher: KeyValue.KeyWatcher, apply: Apply, ready: asyncio.Event) -> None:
    """Feed every status entry's raw bytes (the current ones, then each change; None: deleted)
    to ``apply``, which decodes what it needs; ``ready`` is set once the current ones are in.
    Stops the watcher when it ends (a watcher left subscribed makes the connection's drain wait
    for its timeout)."""
    try:
        async for entry in watcher:
            if entry is None:  # the initial values have all been delivered
                ready.set()
                continue
            try:
                deleted = entry.operation in ("DEL", "PURGE") or not entry.value
                apply(entry.key, int(entry.revision or 0), None if deleted else entry.value)
            except Exception:
                log.exception("bad status entry", extra={"key": entry.key})
            if not ready.is_set() and not entry.delta:
                ready.set()
    finally:
        with contextlib.suppress(Exception):
            await asyncio.shield(watcher.stop())
