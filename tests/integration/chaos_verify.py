"""The chaos run's verifier (tests/integration/chaos.py): waits until every document has
settled, then checks the write path's invariants on every store and replica (chunk ids computed
here from the submitted bytes, fences alike across replicas, no duplicates, statuses final, the
dead-letter stream holding exactly the poison documents)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter
from typing import Any

import grpc
from grpc import aio

from meshkit.domain.ids import chunk_id_for, document_shard
from meshkit.settings import IngestionSettings
from ragmesh.index.v1 import index_pb2, index_pb2_grpc
from ragmesh.ingestion.v1 import ingestion_pb2
from ragmesh.sparse.v1 import sparse_pb2, sparse_pb2_grpc
from services.ingestion.chunking import Chunker
from services.ingestion.normalize import normalize

from .chaos_workload import FINAL_STATES, INDEXED, MD, Workload
from .meshclients import Mesh


class Violation(AssertionError):
    pass


class Verifier:
    """Reads every store and replica directly (``ListDocuments``, as the ``ops`` identity on a
    secure stack) and compares it with what the workload's accepted requests imply."""

    def __init__(self, mesh: Mesh, workload: Workload, settings: IngestionSettings) -> None:
        self.stack = mesh.stack
        self.mesh = mesh
        self.workload = workload
        self.collection = workload.collection
        self.chunker = Chunker.from_settings(settings)

    def _channel(self, name: str) -> aio.Channel:
        return self.mesh.channel(name)

    # --- what should be there -------------------------------------------------------------

    def expected_chunks(self) -> dict[str, set[str]]:
        """doc_id -> chunk ids of its expected version (indexed documents only)."""
        out: dict[str, set[str]] = {}
        for doc_id, want in self.workload.expected.items():
            if want.state != INDEXED:
                continue
            assert want.content is not None
            normalized = normalize(want.content, MD, "")
            drafts = self.chunker.chunk(normalized.markdown, normalized.title)
            out[doc_id] = {chunk_id_for(self.collection, doc_id, d.text) for d in drafts}
        return out

    # --- waiting --------------------------------------------------------------------------

    async def settle(self, timeout_s: float) -> float:
        """Seconds until every document is final and as expected; raises on timeout."""
        ingestion = self.mesh.ingestion
        ids = list(self.workload.expected)
        started = time.monotonic()
        last: dict[str, str] = {}
        while True:
            try:
                reply = await ingestion.GetDocumentStatus(
                    ingestion_pb2.GetDocumentStatusRequest(collection=self.collection, doc_ids=ids),
                    timeout=10,
                )
                last = {
                    d.doc_id: ingestion_pb2.DocumentState.Name(d.state)
                    for d in reply.documents
                    if not self._final_as_expected(d)
                }
                if not last:
                    return round(time.monotonic() - started, 1)
            except aio.AioRpcError as exc:
                last = {"(ingestion API)": exc.code().name}
            if time.monotonic() - started > timeout_s:
                raise Violation(f"not settled after {timeout_s:.0f}s: {dict(list(last.items())[:15])}")
            await asyncio.sleep(1.0)

    def _final_as_expected(self, status: ingestion_pb2.DocumentStatus) -> bool:
        want = self.workload.expected[status.doc_id]
        if status.state not in FINAL_STATES:
            return False
        if want.state == INDEXED:
            assert want.content is not None
            return (
                status.state == INDEXED and status.content_sha256 == hashlib.sha256(want.content).hexdigest()
            )
        return status.state == want.state

    # --- the checks -----------------------------------------------------------------------

    async def verify(self) -> dict[str, Any]:
        expected = self.expected_chunks()
        report: dict[str, Any] = {"documents": len(self.workload.expected), "indexed": len(expected)}
        report["statuses"] = await self._check_statuses()
        report["index"] = await self._check_index(expected)
        report["sparse"] = await self._check_sparse(expected)
        report["dead_letters"] = await self._check_dead_letters()
        report["collection_counts"] = await self._check_counts(expected)
        return report

    async def _check_statuses(self) -> dict[str, int]:
        ingestion = self.mesh.ingestion
        ids = list(self.workload.expected)
        reply = await ingestion.GetDocumentStatus(
            ingestion_pb2.GetDocumentStatusRequest(collection=self.collection, doc_ids=ids), timeout=10
        )
        wrong = {
            d.doc_id: ingestion_pb2.DocumentState.Name(d.state)
            for d in reply.documents
            if not self._final_as_expected(d)
        }
        if wrong:
            raise Violation(f"documents not in their last submitted version: {wrong}")
        return dict(Counter(ingestion_pb2.DocumentState.Name(d.state) for d in reply.documents))

    async def _list(self, stub: Any, request_type: Any) -> dict[str, tuple[int, list[str]]]:
        """doc_id -> (fence, chunk ids) of one replica, every page; a duplicate chunk id anywhere
        in the listing is a violation."""
        out: dict[str, tuple[int, list[str]]] = {}
        token = ""
        seen: Counter[str] = Counter()
        while True:
            request = request_type(collection=self.collection, page_token=token)
            try:
                reply = await stub.ListDocuments(request, timeout=30)
            except aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    return out
                raise
            for doc in reply.documents:
                out[doc.doc_id] = (doc.fence, list(doc.chunk_ids))
                seen.update(doc.chunk_ids)
            token = reply.next_page_token
            if not token:
                break
        duplicates = [c for c, n in seen.items() if n > 1]
        if duplicates:
            raise Violation(f"chunk ids held twice: {duplicates[:10]}")
        return out

    def _replicas(self, kind: str) -> list[str]:
        return [n for n in self.stack.names() if self.stack.component(n).kind == kind]

    async def _check_index(self, expected: dict[str, set[str]]) -> dict[str, Any]:
        replicas = self._replicas("index")
        shard_count = self.stack.index_shards
        by_shard: dict[int, list[tuple[str, dict[str, tuple[int, list[str]]]]]] = {}
        for name in replicas:
            shard = int(self.stack.component(name).env["RAGMESH_INDEX_SHARD"])
            stub = index_pb2_grpc.IndexServiceStub(self._channel(name))
            by_shard.setdefault(shard, []).append(
                (name, await self._list(stub, index_pb2.ListDocumentsRequest))
            )
        for shard, listings in by_shard.items():
            # A document and all its chunks live on the shard that owns it, and only there.
            want = {
                doc_id: chunks
                for doc_id, chunks in expected.items()
                if chunks and document_shard(doc_id, shard_count) == shard
            }
            for name, listing in listings:
                self._compare(f"{name} (index shard {shard})", listing, want)
            self._same_fences([(n, lst) for n, lst in listings], f"index shard {shard}")
        return {"replicas": len(replicas), "shards": sorted(by_shard)}

    async def _check_sparse(self, expected: dict[str, set[str]]) -> dict[str, Any]:
        replicas = self._replicas("sparse")
        listings = []
        for name in replicas:
            stub = sparse_pb2_grpc.SparseServiceStub(self._channel(name))
            listing = await self._list(stub, sparse_pb2.ListDocumentsRequest)
            self._compare(f"{name} (sparse)", listing, expected)
            listings.append((name, listing))
        self._same_fences(listings, "sparse")
        return {"replicas": len(replicas)}

    @staticmethod
    def _compare(where: str, listing: dict[str, tuple[int, list[str]]], want: dict[str, set[str]]) -> None:
        got = {d: set(chunks) for d, (_fence, chunks) in listing.items() if chunks}
        extra = sorted(set(got) - set(want))
        missing = sorted(set(want) - set(got))
        differ = sorted(d for d in set(got) & set(want) if got[d] != want[d])
        if extra or missing or differ:
            raise Violation(
                f"{where}: documents it should not hold {extra[:10]}, missing {missing[:10]}, "
                f"with other chunks {differ[:10]}"
            )

    @staticmethod
    def _same_fences(listings: list[tuple[str, dict[str, tuple[int, list[str]]]]], where: str) -> None:
        if len(listings) < 2:
            return
        first_name, first = listings[0]
        for name, other in listings[1:]:
            fences = {d: f for d, (f, chunks) in first.items() if chunks}
            other_fences = {d: f for d, (f, chunks) in other.items() if chunks}
            if fences != other_fences:
                diff = {d for d in set(fences) | set(other_fences) if fences.get(d) != other_fences.get(d)}
                raise Violation(f"{where}: {first_name} and {name} disagree on fences of {sorted(diff)[:10]}")

    async def _check_dead_letters(self) -> dict[str, Any]:
        ingestion = self.mesh.ingestion
        reply = await ingestion.ListDeadLetters(
            ingestion_pb2.ListDeadLettersRequest(collection=self.collection, limit=1000), timeout=30
        )
        letters = Counter(letter.doc_id for letter in reply.dead_letters)
        want = Counter(self.workload.poison_ids)
        if letters != want:
            raise Violation(f"dead letters {dict(letters)} are not exactly the poison documents {dict(want)}")
        return {
            "letters": sum(letters.values()),
            "reasons": sorted({d.reason[:80] for d in reply.dead_letters}),
        }

    async def _check_counts(self, expected: dict[str, set[str]]) -> dict[str, int]:
        ingestion = self.mesh.ingestion
        counts = await ingestion.GetCollectionStatus(
            ingestion_pb2.GetCollectionStatusRequest(collection=self.collection), timeout=10
        )
        stuck = (counts.queued, counts.processing, counts.deleting)
        if any(stuck):
            raise Violation(f"documents stuck: queued/processing/deleting = {stuck}")
        return {
            "indexed": counts.indexed,
            "failed": counts.failed,
            "chunks": counts.chunks,
            "expected_chunks": sum(len(c) for c in expected.values()),
        }
