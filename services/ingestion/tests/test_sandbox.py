"""Document preparation in child processes under a hard CPU budget (services/ingestion/sandbox.py).

Real child processes, real documents: a document the HTML parser chokes on (CPython's
html.parser is quadratic on a run of unclosed "<a b" tags) is the over-budget case; a child
killed with SIGSEGV stands for a crashing parser, one stopped with SIGSTOP for a stuck one."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import time
import zlib
from collections.abc import AsyncIterator, Awaitable
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest

from meshkit.settings import IngestionSettings
from ragmesh.ingestion.v1 import ingestion_pb2 as pb
from services.ingestion.chunking import Chunker
from services.ingestion.events import IngestEvent
from services.ingestion.jobs import Job, JobFailure
from services.ingestion.lifecycle.entries import DocStatus
from services.ingestion.lifecycle.outcomes import Claim
from services.ingestion.normalize import normalize
from services.ingestion.pipeline import IngestPipeline
from services.ingestion.sandbox import DocumentSandbox, PreparationFailed, PreparedDocument

from .test_chunking import TOKENIZER_PATH
from .test_normalize import make_pdf

MD, TEXT, HTML, PDF = (
    pb.DOCUMENT_FORMAT_MARKDOWN,
    pb.DOCUMENT_FORMAT_TEXT,
    pb.DOCUMENT_FORMAT_HTML,
    pb.DOCUMENT_FORMAT_PDF,
)
# Minutes of html.parser time in CPython 3.11.7 (its unclosed-tag handling is quadratic; the
# gh-135462 fix in later releases makes it linear): far over any budget used here.
SLOW_HTML = ("<p>start</p>" + "<a b" * 100_000).encode()
NORMAL = b"# A normal page\n\nIt has a paragraph about volcanoes and basalt."
T = TypeVar("T")


def settings(**overrides: Any) -> IngestionSettings:
    return IngestionSettings(ingest_tokenizer_path=TOKENIZER_PATH, **overrides)


@pytest.fixture(scope="module")
def chunker() -> Chunker:
    return Chunker.from_settings(settings())


@contextlib.asynccontextmanager
async def sandbox_with(chunker: Chunker, **overrides: Any) -> AsyncIterator[DocumentSandbox]:
    sandbox = DocumentSandbox(settings(**overrides), chunker)
    try:
        await sandbox.start()
        yield sandbox
    finally:
        await sandbox.close()


class LoopWatch:
    """The longest the event loop went without running a 10 ms ticker."""

    def __init__(self) -> None:
        self.longest_gap = 0.0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LoopWatch:
        self._task = asyncio.create_task(self._tick())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _tick(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            self.longest_gap = max(self.longest_gap, now - last)
            last = now


async def failure_of(awaitable: Awaitable[Any]) -> PreparationFailed:
    with pytest.raises(PreparationFailed) as caught:
        await awaitable
    return caught.value


async def test_prepares_what_normalize_and_chunk_give(chunker: Chunker) -> None:
    documents = [
        (MD, NORMAL),
        (TEXT, b"#1 plain text\n\nwith two paragraphs"),
        (HTML, b"<title>T</title><h1>Head</h1><p>Some <b>bold</b> text.</p><pre>  code  </pre>"),
        (PDF, make_pdf([["A PDF page of text."]], title="Doc")),
    ]
    async with sandbox_with(chunker, ingest_prepare_processes=1) as sandbox:
        for fmt, content in documents:
            expected = normalize(content, fmt, "Given")
            prepared = await sandbox.prepare(content, fmt, "Given")
            assert prepared == PreparedDocument(
                expected.title, chunker.chunk(expected.markdown, expected.title)
            )


async def test_a_bad_document_fails_permanently_with_its_reason(chunker: Chunker) -> None:
    async with sandbox_with(chunker, ingest_prepare_processes=1) as sandbox:
        failure = await failure_of(sandbox.prepare(b"ok\xc3\x28", MD, ""))
        assert failure.permanent and "not valid UTF-8" in failure.reason
        assert (await sandbox.prepare(NORMAL, MD, "")).title == "A normal page"


async def test_a_document_over_the_cpu_budget_fails_without_stalling_the_rest(chunker: Chunker) -> None:
    async with sandbox_with(chunker, ingest_document_cpu_budget_s=1.0) as sandbox:
        pids_before = set(sandbox.child_pids)
        async with LoopWatch() as loop:
            slow = asyncio.create_task(sandbox.prepare(SLOW_HTML, HTML, ""))
            started = time.monotonic()
            normal = await sandbox.prepare(NORMAL, MD, "")
            normal_took = time.monotonic() - started
            failure = await failure_of(slow)
            slow_took = time.monotonic() - started
        assert normal.title == "A normal page" and normal_took < 1.0
        assert failure.permanent
        assert failure.reason.startswith("processing took more than 1 s of CPU")
        assert slow_took < 10.0  # a CPU second or two (the limit counts whole seconds)
        assert loop.longest_gap < 0.5
        # The killed child was replaced: the pool still has two, and they work.
        assert None not in sandbox.child_pids and set(sandbox.child_pids) != pids_before
        assert (await sandbox.prepare(NORMAL, MD, "")).title == "A normal page"


async def test_a_crashing_child_is_a_permanent_clear_failure(chunker: Chunker) -> None:
    async with sandbox_with(chunker, ingest_prepare_processes=1) as sandbox:
        (pid,) = sandbox.child_pids
        assert pid is not None
        busy = asyncio.create_task(sandbox.prepare(SLOW_HTML, HTML, ""))
        await asyncio.sleep(0.3)
        os.kill(pid, signal.SIGSEGV)
        failure = await failure_of(busy)
        assert failure.permanent
        assert failure.reason == "document processing crashed (signal SIGSEGV); the document was abandoned"
        assert (await sandbox.prepare(NORMAL, MD, "")).title == "A normal page"


async def test_a_stuck_child_is_abandoned_at_the_wall_clock_limit(chunker: Chunker) -> None:
    async with sandbox_with(chunker, ingest_prepare_processes=1) as sandbox:
        sandbox.wall_limit_s = 1.0
        (pid,) = sandbox.child_pids
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)  # stopped: it uses no CPU, so only the wall clock can end it
        started = time.monotonic()
        failure = await failure_of(sandbox.prepare(NORMAL, MD, ""))
        assert time.monotonic() - started < 5.0
        assert failure.permanent and "wall-clock" in failure.reason
        assert (await sandbox.prepare(NORMAL, MD, "")).title == "A normal page"


def bomb_pdf(expanded_bytes: int) -> bytes:
    """A one-page PDF whose content stream inflates to ``expanded_bytes`` of spaces."""
    squeeze = zlib.compressobj(9)
    block = b" " * (1 << 20)
    data = b"".join(squeeze.compress(block) for _ in range(expanded_bytes >> 20)) + squeeze.flush()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R >>",
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(data) + data + b"\nendstream",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


async def test_the_memory_cap_turns_a_decompression_bomb_into_a_clean_failure(chunker: Chunker) -> None:
    bomb = bomb_pdf(400 << 20)
    assert len(bomb) < 1 << 20
    async with sandbox_with(
        chunker, ingest_prepare_processes=1, ingest_prepare_memory_bytes=256 << 20
    ) as sandbox:
        failure = await failure_of(sandbox.prepare(bomb, PDF, ""))
        assert failure.permanent
        assert "allocate" in failure.reason or "memory" in failure.reason
        assert (await sandbox.prepare(NORMAL, MD, "")).title == "A normal page"


async def test_a_cancelled_preparation_gives_its_child_back(chunker: Chunker) -> None:
    async with sandbox_with(chunker, ingest_prepare_processes=1, ingest_document_cpu_budget_s=1.0) as sandbox:
        slow = asyncio.create_task(sandbox.prepare(SLOW_HTML, HTML, ""))
        await asyncio.sleep(0.2)
        slow.cancel()
        # The only child is still busy with the abandoned document until its budget ends it.
        assert (await asyncio.wait_for(sandbox.prepare(NORMAL, MD, ""), 15.0)).title == "A normal page"


async def test_closing_mid_document_is_not_the_documents_fault(chunker: Chunker) -> None:
    sandbox = DocumentSandbox(settings(ingest_prepare_processes=1), chunker)
    await sandbox.start()
    busy = asyncio.create_task(sandbox.prepare(SLOW_HTML, HTML, ""))
    await asyncio.sleep(0.3)
    await sandbox.close()
    failure = await failure_of(busy)
    assert not failure.permanent and "shutting down" in failure.reason
    assert sandbox.child_pids == [None]


class Objects:
    def __init__(self, content: bytes) -> None:
        self.content = content

    async def get(self, bucket: str, key: str) -> bytes:
        return self.content


def job_for(content: bytes, fmt: int) -> Job:
    event = IngestEvent(
        op="upsert",
        collection="c",
        doc_id="d.md",
        content_sha256=hashlib.sha256(content).hexdigest(),
        object_key="c/d/x",
        format=fmt,
    )
    status = DocStatus("c", "d.md", "processing", request=event, owner="w", fence=1)
    return Job(event, Claim(event, "w", 1, status))


async def pipeline_chunk(content: bytes, fmt: int, chunker: Chunker, **overrides: Any) -> tuple[Job, float]:
    """Prepare one document through IngestPipeline._chunk; the longest event-loop stall."""
    pipeline = IngestPipeline(
        settings(**overrides), Objects(content), None, SimpleNamespace(shards=[None]), chunker
    )  # type: ignore[arg-type]
    job = job_for(content, fmt)
    try:
        async with LoopWatch() as loop:
            try:
                await pipeline._chunk(job)
            except JobFailure as failure:
                job.failure = failure
    finally:
        await pipeline.close()
    return job, loop.longest_gap


async def test_the_pipeline_prepares_a_space_run_document_without_freezing_its_loop(chunker: Chunker) -> None:
    # The old pipeline ran the quadratic trailing-space pattern in a thread that held the GIL:
    # 200k spaces froze the worker's event loop (heartbeat included) for about two minutes.
    content = b"x" + b" " * 200_000 + b"y"
    job, longest_gap = await pipeline_chunk(content, MD, chunker, ingest_prepare_processes=1)
    assert job.failure is None
    assert [c.draft.text for c in job.chunks] == ["x", "y"]
    assert longest_gap < 0.5


async def test_the_pipeline_fails_an_over_budget_document_permanently(chunker: Chunker) -> None:
    job, longest_gap = await pipeline_chunk(
        SLOW_HTML, HTML, chunker, ingest_document_cpu_budget_s=1.0, ingest_prepare_processes=1
    )
    assert job.failure is not None and job.failure.permanent
    assert "of CPU" in job.failure.reason
    assert longest_gap < 0.5
