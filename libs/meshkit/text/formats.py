"""A document's format from its name and first bytes, with no parser imported: the ingestion
service's normaliser (services.ingestion.normalize) and ``ragmesh ingest`` (which walks folders
and must not load pdfplumber or BeautifulSoup to do it) use this one function, so they agree."""

from __future__ import annotations

from pathlib import PurePosixPath

from ragmesh.ingestion.v1 import ingestion_pb2

EXTENSION_FORMATS: dict[str, ingestion_pb2.DocumentFormat] = {
    ".md": ingestion_pb2.DOCUMENT_FORMAT_MARKDOWN,
    ".markdown": ingestion_pb2.DOCUMENT_FORMAT_MARKDOWN,
    ".mdx": ingestion_pb2.DOCUMENT_FORMAT_MARKDOWN,
    ".txt": ingestion_pb2.DOCUMENT_FORMAT_TEXT,
    ".text": ingestion_pb2.DOCUMENT_FORMAT_TEXT,
    ".rst": ingestion_pb2.DOCUMENT_FORMAT_TEXT,
    ".html": ingestion_pb2.DOCUMENT_FORMAT_HTML,
    ".htm": ingestion_pb2.DOCUMENT_FORMAT_HTML,
    ".xhtml": ingestion_pb2.DOCUMENT_FORMAT_HTML,
    ".pdf": ingestion_pb2.DOCUMENT_FORMAT_PDF,
}
PDF_MAGIC = b"%PDF-"


def detect_format(filename: str, content: bytes) -> ingestion_pb2.DocumentFormat | None:
    """The format a file's extension names; a file without a known extension is recognised
    only if it is a PDF (by its magic bytes). None: unknown, the caller rejects it."""
    suffix = PurePosixPath(filename.replace("\\", "/")).suffix.lower()
    if suffix in EXTENSION_FORMATS:
        return EXTENSION_FORMATS[suffix]
    if content.lstrip()[:5] == PDF_MAGIC:
        return ingestion_pb2.DOCUMENT_FORMAT_PDF
    return None
