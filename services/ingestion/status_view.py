"""An in-memory view of every document's lifecycle, kept current by watching the status
bucket, so collection counts cost no KV round trips. Writes made by this process are applied
at once (write-through) so a caller that just submitted sees its documents as queued.

``follow_statuses`` is the watch loop itself, shared with the reconciler."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from nats.js.kv import KeyValue

from services.ingestion.lifecycle_entries import DocStatus
from services.ingestion.lifecycle_states import DELETED, INDEXED, STATES

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CollectionCounts:
    by_state: dict[str, int]
    chunks: int


class StatusView:
    def __init__(self) -> None:
        self._docs: dict[str, dict[str, tuple[int, DocStatus]]] = defaultdict(dict)
        self._task: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()

    def apply(self, key: str, revision: int, status: DocStatus | None) -> None:
        collection = key.split(".", 1)[0]
        docs = self._docs[collection]
        held = docs.get(key)
        if held is not None and held[0] >= revision:
            return
        if status is None:
            docs.pop(key, None)
        else:
            docs[key] = (revision, status)

    def counts(self, collection: str) -> CollectionCounts | None:
        docs = self._docs.get(collection)
        if not docs:
            return None
        states = Counter(status.state for _rev, status in docs.values())
        chunks = sum(status.chunks for _rev, status in docs.values() if status.state == INDEXED)
        return CollectionCounts({state: states.get(state, 0) for state in STATES}, chunks)

    def statuses(self, collection: str) -> list[DocStatus]:
        """Every document status of ``collection`` as last seen."""
        return [status for _rev, status in self._docs.get(collection, {}).values()]

    def documents(
        self, collection: str, source_prefix: str, after_doc_id: str, limit: int
    ) -> tuple[list[DocStatus], bool]:
        """Up to ``limit`` documents of ``collection`` that are not deleted, whose latest
        submission's source_uri starts with ``source_prefix``, with a doc id after
        ``after_doc_id``, in doc id order; and whether more follow."""
        docs = self._docs.get(collection, {})
        matching = sorted(
            (
                status
                for _rev, status in docs.values()
                if status.doc_id > after_doc_id
                and status.state != DELETED
                and (status.request.source_uri if status.request else "").startswith(source_prefix)
            ),
            key=lambda status: status.doc_id,
        )
        return matching[:limit], len(matching) > limit

    def collections(self) -> list[str]:
        return sorted(name for name, docs in self._docs.items() if docs)

    async def start(self, bucket: KeyValue) -> None:
        watcher = await bucket.watchall()
        self._task = asyncio.create_task(follow_statuses(watcher, self.apply, self.ready))
        await asyncio.wait_for(self.ready.wait(), timeout=60)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


Apply = Callable[[str, int, DocStatus | None], None]


async def follow_statuses(watcher: KeyValue.KeyWatcher, apply: Apply, ready: asyncio.Event) -> None:
    """Feed every status entry (the current ones, then each change) to ``apply``; ``ready``
    is set once the current ones are in. Stops the watcher when it ends (a watcher left
    subscribed makes the connection's drain wait for its timeout)."""
    try:
        async for entry in watcher:
            if entry is None:  # the initial values have all been delivered
                ready.set()
                continue
            try:
                deleted = entry.operation in ("DEL", "PURGE") or not entry.value
                status = None if deleted else DocStatus.from_bytes(entry.value or b"")
                apply(entry.key, int(entry.revision or 0), status)
            except Exception:
                log.exception("bad status entry", extra={"key": entry.key})
            if not ready.is_set() and not entry.delta:
                ready.set()
    finally:
        with contextlib.suppress(Exception):
            await asyncio.shield(watcher.stop())
