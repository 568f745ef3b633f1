"""A document's failure reason (its status, its dead letter) is in our words: a parser's
exception class and text go to the worker's log only, with the document and request ids.

Broken inputs go through the real parsing code: normalize, the sandbox's child processes, the
pipeline, and the whole write path (the API and a worker on a real nats-server).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from meshkit.settings import IngestionSettings
from ragmesh.ingestion.v1 import ingestion_pb2 as pb
from services.ingestion import normalize as normalize_module
from services.ingestion import sandbox as sandbox_module
from services.ingestion.chunking import Chunker
from services.ingestion.events import IngestEvent, MalformedEvent
from services.ingestion.normalize import (
    HTML_UNPARSEABLE,
    PDF_DAMAGED,
    PDF_ENCRYPTED,
    DocumentError,
    normalize,
)
from services.ingestion.sandbox import NO_PROCESS, UNEXPECTED_FAILURE

from .conftest import Harness
from .test_chunking import TOKENIZER_PATH
from .test_normalize import make_pdf
from .test_sandbox import bomb_pdf, failure_of, pipeline_chunk, sandbox_with
from .write_helpers import FAILED

MD, TEXT, HTML, PDF = (
    pb.DOCUMENT_FORMAT_MARKDOWN,
    pb.DOCUMENT_FORMAT_TEXT,
    pb.DOCUMENT_FORMAT_HTML,
    pb.DOCUMENT_FORMAT_PDF,
)
BROKEN_PDF = b"%PDF-1.4\n not a pdf at all"
GOOD_PDF = make_pdf([["A page of text about basalt."]])
TRUNCATED_PDF = GOOD_PDF[: len(GOOD_PDF) // 2]
# A security handler pdfminer does not know: it refuses the file as encrypted.
ENCRYPTED_PDF = GOOD_PDF.replace(
    b"/Root 1 0 R", b"/Root 1 0 R /Encrypt << /Filter /Bogus /V 1 >> /ID [<00> <00>]"
)
REJECTED_HTML = b"<![" * 1000

# What the parsers and Python say of these inputs: none of it may reach a reason.
LIBRARY_TEXT = (
    "Exception",
    "Error",
    "Pdfminer",
    "pdfminer",
    "No /Root",
    "Is this really",
    "Unexpected EOF",
    "Unknown filter",
    "expected name token",
    "<![",
    "invalid start byte",
    "invalid continuation byte",
    "Traceback",
)

# Failure kind -> the reason callers see.
REASONS: list[tuple[str, bytes, int, str]] = [
    ("damaged PDF", BROKEN_PDF, PDF, PDF_DAMAGED),
    ("truncated PDF", TRUNCATED_PDF, PDF, PDF_DAMAGED),
    ("encrypted PDF", ENCRYPTED_PDF, PDF, PDF_ENCRYPTED),
    ("PDF without a header", b"not a pdf at all", PDF, PDF_DAMAGED),
    ("markup the HTML parser rejects", REJECTED_HTML, HTML, HTML_UNPARSEABLE),
    (
        "text that is not UTF-8",
        b"caf\xe9 au lait",
        TEXT,
        "document is not valid UTF-8: byte 0xe9 at offset 3 (a character is cut short)",
    ),
    (
        "Markdown with a stray byte",
        b"ok \xff",
        MD,
        "document is not valid UTF-8: byte 0xff at offset 3 (no character starts with this byte)",
    ),
    (
        "HTML cut inside a character",
        b"<p>caf\xc3",
        HTML,
        "document is not valid UTF-8: byte 0xc3 at offset 6 (the text ends inside a character)",
    ),
    (
        "binary data",
        b"abc\x00def",
        TEXT,
        "document contains a NUL byte at offset 3: binary data is not text",
    ),
]
KINDS = [pytest.param(content, fmt, reason, id=kind) for kind, content, fmt, reason in REASONS]


def assert_ours(reason: str) -> None:
    leaked = [text for text in LIBRARY_TEXT if text in reason]
    assert not leaked, (reason, leaked)


def settings(**overrides: Any) -> IngestionSettings:
    return IngestionSettings(ingest_tokenizer_path=TOKENIZER_PATH, **overrides)


@pytest.fixture(scope="module")
def chunker() -> Chunker:
    return Chunker.from_settings(settings())


# --- normalize, in this process ---------------------------------------------------------------


@pytest.mark.parametrize(("content", "fmt", "reason"), KINDS)
def test_each_failure_kind_has_a_reason_of_our_own(content: bytes, fmt: int, reason: str) -> None:
    with pytest.raises(DocumentError) as caught:
        normalize(content, fmt, "")
    assert caught.value.reason == reason
    assert_ours(caught.value.reason)


def test_the_parsers_own_words_are_kept_for_the_log() -> None:
    with pytest.raises(DocumentError) as caught:
        normalize(BROKEN_PDF, PDF, "")
    assert "No /Root object" in caught.value.detail
    with pytest.raises(DocumentError) as caught:
        normalize(REJECTED_HTML, HTML, "")
    assert "ParserRejectedMarkup" in caught.value.detail


def test_running_out_of_memory_in_the_pdf_parser_is_not_called_damage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pdfplumber wraps whatever pdfminer raised, MemoryError too: that is the sandbox's limit
    talking (it names it), not a damaged file."""

    def exhausted(*args: Any, **kwargs: Any) -> Any:
        raise normalize_module.PdfminerException(MemoryError("Unable to allocate output buffer."))

    monkeypatch.setattr(normalize_module.pdfplumber, "open", exhausted)
    with pytest.raises(MemoryError):
        normalize(GOOD_PDF, PDF, "")


def test_the_page_limit_reason_is_ours() -> None:
    with pytest.raises(DocumentError) as caught:
        normalize(make_pdf([["one"], ["two"], ["three"]]), PDF, "", max_pdf_pages=2)
    assert caught.value.reason == "PDF has 3 pages, the limit is 2"


# --- the sandbox's children and the pipeline --------------------------------------------------


async def test_the_pipeline_fails_broken_documents_with_our_reasons(
    chunker: Chunker, caplog: pytest.LogCaptureFixture
) -> None:
    for content, fmt, reason in [(BROKEN_PDF, PDF, PDF_DAMAGED), (REJECTED_HTML, HTML, HTML_UNPARSEABLE)]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="services.ingestion.pipeline"):
            job, _gap = await pipeline_chunk(content, fmt, chunker, ingest_prepare_processes=1)
        assert job.failure is not None and job.failure.permanent
        assert job.failure.reason == reason
        assert_ours(job.failure.reason)
        # The parser's text is in the worker's log, with the document it is about.
        (logged,) = [r for r in caplog.records if r.getMessage() == "document could not be prepared"]
        assert getattr(logged, "doc_id", "") == job.event.doc_id
        assert getattr(logged, "reason", "") == reason
        assert getattr(logged, "detail", "")


async def test_the_memory_cap_reason_names_the_cap_not_the_allocator(chunker: Chunker) -> None:
    bomb = bomb_pdf(400 << 20)
    async with sandbox_with(
        chunker, ingest_prepare_processes=1, ingest_prepare_memory_bytes=256 << 20
    ) as sandbox:
        failure = await failure_of(sandbox.prepare(bomb, PDF, ""))
    assert failure.permanent
    assert failure.reason == "processing needs more than 256 MiB of memory"


def test_a_parser_that_raises_unexpectedly_fails_in_our_words() -> None:
    class Crashing:
        def chunk(self, markdown: str, title: str) -> Any:
            raise KeyError("internal table /Font/F9 at 0x7f3a")

    request = sandbox_module._Request(b"# Title\n\ntext", MD, "", 10, 30.0)
    reply = sandbox_module._run(request, Crashing(), 0)  # type: ignore[arg-type]
    status, reason, permanent, detail = reply
    assert (status, reason, permanent) == ("failed", UNEXPECTED_FAILURE, False)
    assert_ours(reason)
    assert "KeyError" in detail and "0x7f3a" in detail


async def test_a_child_that_cannot_start_fails_in_our_words(
    chunker: Chunker, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with sandbox_with(chunker, ingest_prepare_processes=1) as sandbox:
        child = sandbox._children[0]

        def broken(*args: Any) -> None:
            raise OSError(24, "Too many open files")

        monkeypatch.setattr(child, "ensure_running", broken)
        failure = await failure_of(sandbox.prepare(b"# T\n\ntext", MD, ""))
    assert failure.reason == NO_PROCESS and not failure.permanent
    assert "Too many open files" in failure.detail
    assert_ours(failure.reason)


# --- events that are no ingest events ---------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{not json", "undecodable ingest event: not JSON"),
        (b"\xff\xfe", "undecodable ingest event: not JSON"),
        (json.dumps({"op": "upsert"}).encode(), "undecodable ingest event: collection, doc_id missing"),
        (
            json.dumps({"op": "delete", "collection": 5, "doc_id": "a.md"}).encode(),
            "collection is not a string",
        ),
    ],
)
def test_a_malformed_event_is_described_in_our_words(raw: bytes, reason: str) -> None:
    with pytest.raises(MalformedEvent) as caught:
        IngestEvent.from_bytes(raw)
    assert str(caught.value) == reason
    assert_ours(str(caught.value))


# --- the whole write path: API, worker, dead letters ------------------------------------------


async def test_dead_letters_and_statuses_carry_only_our_reasons(harness: Harness) -> None:
    await harness.start_api()
    await harness.start_worker()
    broken = {
        "broken.pdf": (BROKEN_PDF, PDF, PDF_DAMAGED),
        "locked.pdf": (ENCRYPTED_PDF, PDF, PDF_ENCRYPTED),
        "rejected.html": (REJECTED_HTML, HTML, HTML_UNPARSEABLE),
    }
    for doc_id, (content, fmt, _reason) in broken.items():
        await harness.submit("c", doc_id, content, fmt=fmt)
    for doc_id, (_content, _fmt, reason) in broken.items():
        status = await harness.wait_state("c", doc_id, FAILED)
        assert status.reason == reason
    letters = {letter.doc_id: letter.reason for letter in await harness.dead_letters("c")}
    assert letters == {doc_id: reason for doc_id, (_c, _f, reason) in broken.items()}
    for reason in letters.values():
        assert_ours(reason)


async def test_a_malformed_event_is_dead_lettered_in_our_words(harness: Harness) -> None:
    await harness.start_api()
    await harness.start_worker()
    js = (await harness.connect()).jetstream()
    await js.publish("ragmesh.ingest.c.junk", b"{not json", stream=harness.settings().ingest_stream)
    for _ in range(400):
        letters = await harness.dead_letters()
        if letters:
            break
        await asyncio.sleep(0.05)
    assert [letter.reason for letter in letters] == ["malformed event: undecodable ingest event: not JSON"]
