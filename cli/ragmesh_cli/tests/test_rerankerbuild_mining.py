"""The reranker build mines its training passages with ingestion's and the sparse service's
public entry points (``services/<stage>/public.py``): the chunks ingestion would store, BM25 over
them as the sparse service ranks."""

from __future__ import annotations

from pathlib import Path

from meshkit.domain.ids import chunk_id_for
from ragmesh.ingestion.v1 import ingestion_pb2
from ragmesh_cli.rerankerbuild.mining import COLLECTION, bm25_collection, chunk_corpus
from services.ingestion.public import DocumentPreparer

RECORDS = [
    ("d1", "Vitamin D", "Vitamin D supplements and bone fractures in the elderly. " * 80),
    ("d2", "", "Zeppelins carried mail across the Atlantic.\n\nThey were slow."),
    ("d3", "Empty", "   "),
]


def test_passages_are_the_chunks_ingestion_stores() -> None:
    corpus = chunk_corpus(RECORDS, COLLECTION)
    assert sorted(corpus.by_doc) == ["d1", "d2"] and len(corpus.by_doc["d1"]) > 1
    preparer = DocumentPreparer()
    for doc_id, title, text in RECORDS[:2]:
        prepared = preparer.prepare(text.encode(), ingestion_pb2.DOCUMENT_FORMAT_TEXT, title)
        assert corpus.titles[doc_id] == prepared.title
        assert [corpus.passages[i].text for i in corpus.by_doc[doc_id]] == [d.text for d in prepared.drafts]
        assert [corpus.passages[i].chunk_id for i in corpus.by_doc[doc_id]] == [
            chunk_id_for(COLLECTION, doc_id, d.text) for d in prepared.drafts
        ]


def test_markdown_front_matter_is_prepared_like_ingestion_does() -> None:
    page = b"---\ntitle: Keys\ntags: [ops]\n---\n# Rotating\n\nMint a new key."
    prepared = DocumentPreparer().prepare(page, ingestion_pb2.DOCUMENT_FORMAT_MARKDOWN)
    assert prepared.title == "Keys" and prepared.metadata.get("tag:ops") == "true"
    assert prepared.drafts and "Mint a new key." in prepared.drafts[0].text


def test_bm25_over_the_passages(tmp_path: Path) -> None:
    corpus = chunk_corpus(RECORDS, COLLECTION)
    collection = bm25_collection(corpus, tmp_path)
    try:
        hits = collection.search_bm25("zeppelins atlantic", 5, [])
    finally:
        collection.close()
    assert hits and hits[0].doc_id == "d2"
