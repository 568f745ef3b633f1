"""The tantivy side of a sparse collection: the schema (BM25 fields title and body, a lower-cased
unstemmed copy for exact phrases), its two analyzers and the terms and tokens they make of a
query (and the one-line form of text that chunk files and exact keywords share), and how a
chunk record becomes a tantivy document and back."""

from __future__ import annotations

import re
from typing import Any

import tantivy

from services.sparse.records import ChunkRecord

EXACT_TOKENIZER = "ragmesh_exact"
# Tokens longer than this are dropped by the exact analyzer; long identifiers (hashes, paths)
# are exactly what the exact leg exists for, so the limit is far above en_stem's 40.
_EXACT_MAX_TOKEN_CHARS = 255
_WHITESPACE_RE = re.compile(r"\s+")


def _build_schema() -> tantivy.Schema:
    sb = tantivy.SchemaBuilder()
    # raw: ids are matched whole, never split on '-' or '.'; basic: no positions needed.
    sb.add_text_field("chunk_id", stored=True, tokenizer_name="raw", index_option="basic")
    sb.add_text_field("doc_id", stored=True, tokenizer_name="raw", index_option="basic")
    sb.add_text_field("title", stored=True, tokenizer_name="en_stem")
    sb.add_text_field("body", stored=True, tokenizer_name="en_stem")
    # Not stored (title/body already are): the exact leg's phrase mode searches it.
    sb.add_text_field("exact", stored=False, tokenizer_name=EXACT_TOKENIZER)
    sb.add_bytes_field("location", stored=True, indexed=False)
    return sb.build()


SCHEMA = _build_schema()


def _bm25_analyzer() -> tantivy.TextAnalyzer:
    # Same pipeline as tantivy's built-in en_stem, so query terms equal indexed terms.
    return (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
        .filter(tantivy.Filter.remove_long(40))
        .filter(tantivy.Filter.lowercase())
        .filter(tantivy.Filter.stemmer("english"))
        .build()
    )


def exact_analyzer() -> tantivy.TextAnalyzer:
    return (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
        .filter(tantivy.Filter.remove_long(_EXACT_MAX_TOKEN_CHARS))
        .filter(tantivy.Filter.lowercase())
        .build()
    )


_BM25_ANALYZER = _bm25_analyzer()
_EXACT_ANALYZER = exact_analyzer()


def query_terms(query: str) -> list[str]:
    """The distinct stemmed terms of a free-text query. Building the query from terms (instead
    of tantivy's query parser) means no user input can be a syntax error."""
    return list(dict.fromkeys(_BM25_ANALYZER.analyze(query)))


def exact_tokens(text: str) -> list[str]:
    return list(_EXACT_ANALYZER.analyze(text))


def one_line(text: str) -> str:
    """Whitespace runs to one space: keywords and file lines compare the same way, and a phrase
    broken across lines in the source still matches."""
    return _WHITESPACE_RE.sub(" ", text).strip()


def stored_value(doc: tantivy.Document, name: str) -> Any:
    return doc.get_first(name)


def to_record(doc: tantivy.Document) -> ChunkRecord:
    location = stored_value(doc, "location")
    return ChunkRecord(
        chunk_id=stored_value(doc, "chunk_id"),
        doc_id=stored_value(doc, "doc_id"),
        title=stored_value(doc, "title") or "",
        text=stored_value(doc, "body") or "",
        location=bytes(location) if location is not None else b"",
    )


def to_document(record: ChunkRecord) -> tantivy.Document:
    doc = tantivy.Document()
    doc.add_text("chunk_id", record.chunk_id)
    doc.add_text("doc_id", record.doc_id)
    doc.add_text("title", record.title)
    doc.add_text("body", record.text)
    # Two values, as the ripgrep file has two lines; the phrase counter treats them apart too.
    doc.add_text("exact", record.title)
    doc.add_text("exact", record.text)
    doc.add_bytes("location", record.location)
    return doc
