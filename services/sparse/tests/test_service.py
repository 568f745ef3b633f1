from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from meshkit.domain.ids import chunk_id_for
from meshkit.rpc.server import start_service
from meshkit.settings import SparseSettings
from ragmesh.common.v1 import common_pb2
from ragmesh.sparse.v1 import sparse_pb2 as pb
from ragmesh.sparse.v1 import sparse_pb2_grpc
from services.sparse.servicer import build_spec

LIMITS = {
    "sparse_max_top_k": 50,
    "sparse_max_keywords": 3,
    "sparse_max_query_chars": 100,
    "sparse_max_batch_chunks": 4,
    "sparse_max_chunk_chars": 500,
    "sparse_max_doc_filter": 2,
}


def settings_for(root: Path, mode: str) -> SparseSettings:
    return SparseSettings(
        port=0,
        log_format="text",
        sparse_data_dir=root,
        sparse_exact_mode=mode,
        store_log="local",
        sparse_upload_snapshots=False,
        **LIMITS,
    )


async def started(root: Path, mode: str) -> AsyncIterator[sparse_pb2_grpc.SparseServiceStub]:
    settings = settings_for(root, mode)
    running = await start_service(build_spec(settings), settings)
    async with aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        yield sparse_pb2_grpc.SparseServiceStub(channel)
    await running.stop(1.0)


@pytest.fixture(scope="module")
async def stub(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[sparse_pb2_grpc.SparseServiceStub]:
    async for s in started(tmp_path_factory.mktemp("sparse"), "ripgrep"):
        yield s


def text_chunk(collection: str, doc_id: str, text: str, title: str = "", ordinal: int = 0) -> pb.ChunkText:
    location = common_pb2.ChunkLocation(
        heading_path=["Errors", "Network"], ordinal=ordinal, char_end=len(text)
    )
    return pb.ChunkText(
        chunk_id=chunk_id_for(collection, doc_id, text),
        doc_id=doc_id,
        title=title,
        text=text,
        location=location,
    )


async def test_health_is_serving(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, "ripgrep")
    running = await start_service(build_spec(settings), settings)
    async with aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="ragmesh.sparse.v1.SparseService")
        )
    await running.stop(1.0)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("mode", ["ripgrep", "phrase"])
async def test_end_to_end(tmp_path: Path, mode: str) -> None:
    async for stub in started(tmp_path, mode):
        net = text_chunk(
            "docs", "runbook", "Clients see ERR_CONN_RESET when the proxy restarts.", "Network errors"
        )
        disk = text_chunk("docs", "runbook", "Disks fill up when logs are not rotated.", "Disk", ordinal=1)
        other = text_chunk("docs", "faq", "Rotating logs daily keeps disks healthy.", "FAQ")
        reply = await stub.ReplaceDocuments(
            pb.ReplaceDocumentsRequest(
                collection="docs",
                documents=[
                    pb.DocumentReplacement(doc_id="runbook", upserts=[net, disk]),
                    pb.DocumentReplacement(doc_id="faq", upserts=[other]),
                ],
            )
        )
        assert (reply.upserted, reply.removed, list(reply.missing_chunk_ids)) == (3, 0, [])

        bm25 = await stub.SearchBm25(pb.SearchBm25Request(collection="docs", query="rotating logs", top_k=5))
        assert {h.chunk_id for h in bm25.hits} == {disk.chunk_id, other.chunk_id}
        assert list(bm25.unknown_terms) == [] and not bm25.chunks
        with_text = await stub.SearchBm25(
            pb.SearchBm25Request(collection="docs", query="rotating logs", top_k=5, with_text=1)
        )
        # The first hit's text, as GetChunks gives it.
        first = with_text.hits[0].chunk_id
        assert list(with_text.chunks) == [{disk.chunk_id: disk, other.chunk_id: other}[first]]
        unknown = await stub.SearchBm25(
            pb.SearchBm25Request(collection="docs", query="rotating kafka logs on kubernetes", top_k=5)
        )
        assert list(unknown.unknown_terms) == ["kafka", "kubernetes"] and len(unknown.hits) == 2
        assert list(unknown.novel_terms) == ["kafka", "kubernetes"]
        typo = await stub.SearchBm25(pb.SearchBm25Request(collection="docs", query="rotating logz", top_k=5))
        assert list(typo.unknown_terms) == ["logz"] and list(typo.novel_terms) == []
        filtered = await stub.SearchBm25(
            pb.SearchBm25Request(collection="docs", query="rotating logs", top_k=5, doc_ids=["faq"])
        )
        assert [h.chunk_id for h in filtered.hits] == [other.chunk_id]

        exact = await stub.SearchExact(
            pb.SearchExactRequest(collection="docs", keywords=["err_conn_reset", "proxy"], top_k=5)
        )
        assert [(h.chunk_id, h.doc_id, list(h.matched_keywords)) for h in exact.hits] == [
            (net.chunk_id, "runbook", ["err_conn_reset", "proxy"])
        ]

        got = await stub.GetChunks(
            pb.GetChunksRequest(collection="docs", chunk_ids=[disk.chunk_id, "0" * 32])
        )
        assert list(got.chunks) == [disk]  # unknown ids are left out

        stats = await stub.GetStats(pb.GetStatsRequest(collection="docs"))
        assert (stats.collection, stats.chunks, stats.documents) == ("docs", 3, 2)

        # New version of the runbook: keep the disk chunk, drop the network one.
        reply = await stub.ReplaceDocuments(
            pb.ReplaceDocumentsRequest(
                collection="docs",
                documents=[
                    pb.DocumentReplacement(doc_id="runbook", keep_chunk_ids=[disk.chunk_id, "a" * 32])
                ],
            )
        )
        assert (reply.upserted, reply.removed, list(reply.missing_chunk_ids)) == (0, 1, ["a" * 32])
        exact = await stub.SearchExact(
            pb.SearchExactRequest(collection="docs", keywords=["ERR_CONN_RESET"], top_k=5)
        )
        assert list(exact.hits) == []

        deleted = await stub.Delete(pb.DeleteRequest(collection="docs", doc_ids=["faq", "runbook"]))
        assert deleted.removed == 2
        stats = await stub.GetStats(pb.GetStatsRequest(collection="docs"))
        assert (stats.chunks, stats.documents) == (0, 0)
        unknown = await stub.Delete(pb.DeleteRequest(collection="never-written", doc_ids=["faq"]))
        assert unknown.removed == 0


OK_ID = "b" * 32
IC = grpc.StatusCode.INVALID_ARGUMENT
RE = grpc.StatusCode.RESOURCE_EXHAUSTED
NF = grpc.StatusCode.NOT_FOUND


def replace(*documents: pb.DocumentReplacement, collection: str = "docs") -> pb.ReplaceDocumentsRequest:
    return pb.ReplaceDocumentsRequest(collection=collection, documents=list(documents))


def upsert(text: str = "some text", chunk_id: str = OK_ID, doc_id: str = "") -> pb.DocumentReplacement:
    return pb.DocumentReplacement(
        doc_id="d", upserts=[pb.ChunkText(chunk_id=chunk_id, doc_id=doc_id, text=text)]
    )


CASES: list[tuple[str, str, Any, grpc.StatusCode]] = [
    ("bad collection", "SearchBm25", pb.SearchBm25Request(collection="Bad Name", query="x", top_k=1), IC),
    (
        "unknown collection bm25",
        "SearchBm25",
        pb.SearchBm25Request(collection="nope", query="x", top_k=1),
        NF,
    ),
    (
        "unknown collection exact",
        "SearchExact",
        pb.SearchExactRequest(collection="nope", keywords=["x"], top_k=1),
        NF,
    ),
    ("unknown collection stats", "GetStats", pb.GetStatsRequest(collection="nope"), NF),
    ("unknown collection chunks", "GetChunks", pb.GetChunksRequest(collection="nope", chunk_ids=[OK_ID]), NF),
    ("empty query", "SearchBm25", pb.SearchBm25Request(collection="docs", query="  ", top_k=1), IC),
    ("long query", "SearchBm25", pb.SearchBm25Request(collection="docs", query="x" * 101, top_k=1), RE),
    ("top_k 0", "SearchBm25", pb.SearchBm25Request(collection="docs", query="x", top_k=0), IC),
    ("top_k big", "SearchBm25", pb.SearchBm25Request(collection="docs", query="x", top_k=51), RE),
    (
        "bad doc filter",
        "SearchBm25",
        pb.SearchBm25Request(collection="docs", query="x", top_k=1, doc_ids=["../x"]),
        IC,
    ),
    (
        "big doc filter",
        "SearchBm25",
        pb.SearchBm25Request(collection="docs", query="x", top_k=1, doc_ids=["a", "b", "c"]),
        RE,
    ),
    ("no keywords", "SearchExact", pb.SearchExactRequest(collection="docs", top_k=1), IC),
    (
        "blank keyword",
        "SearchExact",
        pb.SearchExactRequest(collection="docs", keywords=["a", " \n"], top_k=1),
        IC,
    ),
    (
        "long keyword",
        "SearchExact",
        pb.SearchExactRequest(collection="docs", keywords=["k" * 201], top_k=1),
        RE,
    ),
    (
        "many keywords",
        "SearchExact",
        pb.SearchExactRequest(collection="docs", keywords=list("abcd"), top_k=1),
        RE,
    ),
    ("no documents", "ReplaceDocuments", replace(), IC),
    ("bad doc id", "ReplaceDocuments", replace(pb.DocumentReplacement(doc_id="a//b")), IC),
    ("twice listed doc", "ReplaceDocuments", replace(upsert(), pb.DocumentReplacement(doc_id="d")), IC),
    ("bad chunk id", "ReplaceDocuments", replace(upsert(chunk_id="XYZ")), IC),
    (
        "bad keep id",
        "ReplaceDocuments",
        replace(pb.DocumentReplacement(doc_id="d", keep_chunk_ids=["x"])),
        IC,
    ),
    ("empty chunk", "ReplaceDocuments", replace(upsert(text=" ")), IC),
    ("chunk of other doc", "ReplaceDocuments", replace(upsert(doc_id="other")), IC),
    ("huge chunk", "ReplaceDocuments", replace(upsert(text="x" * 501)), RE),
    (
        "too many chunks",
        "ReplaceDocuments",
        replace(pb.DocumentReplacement(doc_id="d", keep_chunk_ids=[OK_ID] * 5)),
        RE,
    ),
    ("nothing to delete", "Delete", pb.DeleteRequest(collection="docs"), IC),
    ("bad delete id", "Delete", pb.DeleteRequest(collection="docs", chunk_ids=["nope"]), IC),
    ("no chunk ids", "GetChunks", pb.GetChunksRequest(collection="docs"), IC),
    ("bad stats collection", "GetStats", pb.GetStatsRequest(collection=""), IC),
]


@pytest.mark.parametrize(("name", "method", "request_", "code"), CASES, ids=[c[0] for c in CASES])
async def test_validation_statuses(
    stub: sparse_pb2_grpc.SparseServiceStub, name: str, method: str, request_: Any, code: grpc.StatusCode
) -> None:
    call: Callable[..., Any] = getattr(stub, method)
    with pytest.raises(aio.AioRpcError) as info:
        await call(request_, timeout=10)
    assert info.value.code() == code, info.value.details()


async def test_weird_queries_and_keywords_are_fine(stub: sparse_pb2_grpc.SparseServiceStub) -> None:
    chunk = text_chunk("weird", "doc", 'Use "C++" (x) AND: -y in what\'s this.', "Weird")
    await stub.ReplaceDocuments(
        replace(pb.DocumentReplacement(doc_id="doc", upserts=[chunk]), collection="weird")
    )
    bm25 = await stub.SearchBm25(
        pb.SearchBm25Request(collection="weird", query='what\'s "C++" (x) AND: -y', top_k=3)
    )
    assert [h.chunk_id for h in bm25.hits] == [chunk.chunk_id]
    exact = await stub.SearchExact(
        pb.SearchExactRequest(collection="weird", keywords=['"C++"', "(x) and:", "-y"], top_k=3)
    )
    assert [list(h.matched_keywords) for h in exact.hits] == [['"C++"', "(x) and:", "-y"]]


def _filter(key: str, op: int, *values: str) -> common_pb2.MetadataFilter:
    return common_pb2.MetadataFilter(clauses=[common_pb2.MetadataClause(key=key, op=op, values=list(values))])  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["ripgrep", "phrase"])
async def test_sources_are_returned_and_filter_every_search_also_after_a_restart(
    tmp_path: Path, mode: str
) -> None:
    a = text_chunk("docs", "a.md", "Rotate logs daily with logrotate ZX-81.", "A")
    b = text_chunk("docs", "b.md", "Rotate logs weekly with cron ZX-81.", "B")
    docs = _filter("team", common_pb2.FILTER_OP_EQ, "docs")
    async for stub in started(tmp_path, mode):
        await stub.ReplaceDocuments(
            pb.ReplaceDocumentsRequest(
                collection="docs",
                documents=[
                    pb.DocumentReplacement(
                        doc_id="a.md",
                        upserts=[a],
                        source=common_pb2.DocumentSource(
                            source_uri="file:///a.md", metadata={"team": "docs"}
                        ),
                    ),
                    pb.DocumentReplacement(
                        doc_id="b.md",
                        upserts=[b],
                        source=common_pb2.DocumentSource(source_uri="file:///b.md", metadata={"team": "ops"}),
                    ),
                ],
            )
        )
        with pytest.raises(aio.AioRpcError) as caught:
            await stub.SearchBm25(
                pb.SearchBm25Request(
                    collection="docs", query="logs", top_k=5, filter=_filter("team", common_pb2.FILTER_OP_EQ)
                )
            )
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "exactly one value" in (caught.value.details() or "")
    async for stub in started(tmp_path, mode):
        bm25 = await stub.SearchBm25(
            pb.SearchBm25Request(collection="docs", query="rotate logs", top_k=5, filter=docs)
        )
        assert [h.doc_id for h in bm25.hits] == ["a.md"]
        exact = await stub.SearchExact(
            pb.SearchExactRequest(collection="docs", keywords=["ZX-81"], top_k=5, filter=docs)
        )
        assert [h.doc_id for h in exact.hits] == ["a.md"]
        nobody = _filter("team", common_pb2.FILTER_OP_IN, "x", "y")
        empty = await stub.SearchBm25(
            pb.SearchBm25Request(collection="docs", query="logs", top_k=5, filter=nobody)
        )
        assert not empty.hits
        got = await stub.GetChunks(pb.GetChunksRequest(collection="docs", chunk_ids=[a.chunk_id, b.chunk_id]))
        assert {(c.doc_id, c.source_uri, dict(c.metadata)["team"]) for c in got.chunks} == {
            ("a.md", "file:///a.md", "docs"),
            ("b.md", "file:///b.md", "ops"),
        }
