"""Checks of the documents an IngestDocuments call submits, before anything of them is
written: per document a ``Submission`` (valid: its detected format and content hash) or a
REJECTED result with the reason (id, size, title and metadata limits, format, content); only
request-level problems (no documents, too many) raise.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter

from meshkit.core.errors import invalid_argument, resource_exhausted
from meshkit.domain.ids import doc_id_problem, sha256_hex
from meshkit.domain.metadata import metadata_problem
from meshkit.settings import IngestionSettings
from ragmesh.ingestion.v1 import ingestion_pb2
from services.ingestion.normalize import detect_format, document_problem

REJECTED = Counter("ragmesh_ingest_rejected_total", "Documents rejected at submission (invalid).")
MAX_TITLE_CHARS = 1000
MAX_METADATA_ENTRIES = 64
MAX_METADATA_CHARS = 4096


@dataclass(frozen=True)
class Submission:
    doc: ingestion_pb2.Document
    fmt: int
    sha: str


def validate_documents(
    request: ingestion_pb2.IngestDocumentsRequest, settings: IngestionSettings
) -> list[Submission | ingestion_pb2.SubmitResult]:
    """Per document: a Submission for a valid one, a REJECTED result with its reason for
    an invalid one (nothing of it is written). Only request-level problems raise."""
    docs = request.documents
    if not docs:
        raise invalid_argument("no documents in the request")
    limit = settings.ingest_max_documents_per_request
    if len(docs) > limit:
        raise resource_exhausted(f"{len(docs)} documents in one request, the limit is {limit}")
    seen: set[str] = set()
    checked: list[Submission | ingestion_pb2.SubmitResult] = []
    for doc in docs:
        fmt = doc.format or (detect_format(doc.source_uri or doc.doc_id, doc.content) or 0)
        problem = _document_problem(doc, fmt, seen, settings)
        seen.add(doc.doc_id)
        if problem:
            REJECTED.inc()
            checked.append(
                ingestion_pb2.SubmitResult(
                    doc_id=doc.doc_id, outcome=ingestion_pb2.SUBMIT_OUTCOME_REJECTED, reason=problem
                )
            )
        else:
            checked.append(Submission(doc, fmt, sha256_hex(doc.content)))
    return checked


def _document_problem(
    doc: ingestion_pb2.Document, fmt: int, seen: set[str], settings: IngestionSettings
) -> str | None:
    problem = doc_id_problem(doc.doc_id)
    if problem is None and doc.doc_id in seen:
        problem = "doc_id appears twice in the request"
    if problem is None and len(doc.content) > settings.ingest_max_document_bytes:
        problem = (
            f"document is too large: {len(doc.content)} bytes, "
            f"the limit is {settings.ingest_max_document_bytes}"
        )
    return problem or _metadata_problem(doc) or _content_problem(doc, fmt)


def _metadata_problem(doc: ingestion_pb2.Document) -> str | None:
    if len(doc.title) > MAX_TITLE_CHARS:
        return f"title is {len(doc.title)} chars, the limit is {MAX_TITLE_CHARS}"
    if len(doc.metadata) > MAX_METADATA_ENTRIES:
        return f"{len(doc.metadata)} metadata entries, the limit is {MAX_METADATA_ENTRIES}"
    size = sum(len(k) + len(v) for k, v in doc.metadata.items()) + len(doc.source_uri)
    if size > MAX_METADATA_CHARS:
        return f"metadata and source_uri take {size} chars, the limit is {MAX_METADATA_CHARS}"
    # Every key is indexed for filtering (meshkit.domain.metadata): it must be one a filter can name.
    return metadata_problem(doc.metadata)


def _content_problem(doc: ingestion_pb2.Document, fmt: int) -> str | None:
    if fmt == ingestion_pb2.DOCUMENT_FORMAT_UNSPECIFIED:
        return "unknown format: set format or use a .md, .txt, .html or .pdf name"
    if fmt not in ingestion_pb2.DocumentFormat.values():
        return f"unknown format {fmt}"
    if not doc.content:
        return "document is empty"
    if fmt == ingestion_pb2.DOCUMENT_FORMAT_PDF:
        # Full parsing happens in the worker; an unparseable PDF is dead-lettered there.
        return None if doc.content.startswith(b"%PDF-") else "content is not a PDF (no %PDF- header)"
    return document_problem(doc.content, fmt)
