"""What other code may use of ingestion in-process (it imports this module only, never the
servicer, the worker or the lifecycle): how a document becomes the chunks ingestion stores, the
same normaliser and chunker the workers run, so a tool that must see the stored text (the
reranker build, benchmarks) gets exactly it.

A worker prepares untrusted documents in child processes under a CPU and memory budget
(``sandbox.py``); ``DocumentPreparer`` runs in the caller's process with no budget: for corpora
the caller trusts.
"""

from __future__ import annotations

from meshkit.settings import IngestionSettings
from ragmesh.ingestion.v1 import ingestion_pb2
from services.ingestion.chunking import ChunkDraft, Chunker
from services.ingestion.normalize import DocumentError
from services.ingestion.normalize import normalize as normalize_document
from services.ingestion.sandbox import PreparedDocument

__all__ = ["ChunkDraft", "Chunker", "DocumentError", "DocumentPreparer", "PreparedDocument"]


class DocumentPreparer:
    """Normalise, then chunk, as the ingestion workers do with ``settings`` (default: the
    RAGMESH_INGEST_* environment, as the workers read it). Deterministic and thread-safe."""

    def __init__(self, settings: IngestionSettings | None = None) -> None:
        self.settings = settings if settings is not None else IngestionSettings()
        self.chunker = Chunker.from_settings(self.settings)

    def prepare(self, content: bytes, fmt: int, title: str = "") -> PreparedDocument:
        """The document's title (the given one, else one found in it), its chunks and the
        metadata its own text declares (front matter, tags). ``fmt``: a
        ``ragmesh.ingestion.v1.DocumentFormat``. Raises DocumentError for a document ingestion
        would refuse (empty, undecodable, an unknown format)."""
        normalized = normalize_document(content, fmt, title, max_pdf_pages=self.settings.ingest_max_pdf_pages)
        return PreparedDocument(
            normalized.title,
            self.chunker.chunk(normalized.markdown, normalized.title),
            normalized.metadata,
        )

    def prepare_text(self, text: str, title: str = "") -> PreparedDocument:
        """A plain-text document (a corpus record) as ``prepare`` gives it."""
        return self.prepare(text.encode("utf-8"), ingestion_pb2.DOCUMENT_FORMAT_TEXT, title)
