"""Path walking, doc-id sanitising, BEIR corpus parsing and batching of ``ragmesh ingest``."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from meshkit.domain.ids import doc_id_problem
from ragmesh.ingestion.v1 import ingestion_pb2
from ragmesh_cli import documents
from ragmesh_cli.documents import InputError, WalkStats

FORMATS = {".md": ingestion_pb2.DOCUMENT_FORMAT_MARKDOWN, ".txt": ingestion_pb2.DOCUMENT_FORMAT_TEXT}


def fake_detect(filename: str, content: bytes) -> int | None:
    return FORMATS.get(Path(filename).suffix)


def collect(paths: list[Path]) -> tuple[list[ingestion_pb2.Document], WalkStats, list[str]]:
    stats, warnings = WalkStats(), []
    docs = list(documents.iter_documents(paths, fake_detect, stats, warnings.append))
    return docs, stats, warnings


def write(path: Path, text: str = "some text") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("notes/a.md", "notes/a.md"),
        ("my file (1).txt", "my_file__1_.txt"),
        ("héllo wörld.md", "h_llo_w_rld.md"),
        ("a//b/", "a/b"),
        ("/abs/path", "abs/path"),
        ("../up/./x", "__/up/_/x"),
        ("", "_"),
        ("k=v:1@h+2-3_4.5", "k=v:1@h+2-3_4.5"),
    ],
)
def test_sanitize_doc_id(raw: str, expected: str) -> None:
    assert documents.sanitize_doc_id(raw) == expected
    assert doc_id_problem(expected) is None


def test_sanitize_keeps_long_ids_valid_and_distinct() -> None:
    a = documents.sanitize_doc_id("x" * 300 + "a")
    b = documents.sanitize_doc_id("x" * 300 + "b")
    assert len(a) <= documents.MAX_DOC_ID_CHARS
    assert a != b
    assert doc_id_problem(a) is None


def test_folder_walk_ids_hidden_and_unknown(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    write(root / "a.md")
    write(root / "sub dir" / "b.txt")
    write(root / ".hidden.md")
    write(root / ".git" / "c.md")
    write(root / "sub dir" / "image.png")
    docs, stats, warnings = collect([root])
    assert [d.doc_id for d in docs] == ["a.md", "sub_dir/b.txt"]
    assert docs[1].format == ingestion_pb2.DOCUMENT_FORMAT_TEXT
    assert docs[1].content == b"some text"
    # A file:// URI (spaces percent-encoded) that opens the file.
    assert docs[1].source_uri == (root / "sub dir" / "b.txt").absolute().as_uri()
    assert docs[1].source_uri.startswith("file:///") and "sub%20dir" in docs[1].source_uri
    assert stats.files == 2
    assert stats.skipped_unknown == [str(root / "sub dir" / "image.png")]
    assert len(warnings) == 1 and "image.png" in warnings[0]


def test_explicit_file_uses_its_name_and_unknown_format_is_an_error(tmp_path: Path) -> None:
    docs, _, _ = collect([write(tmp_path / "deep" / "one.md")])
    assert [d.doc_id for d in docs] == ["one.md"]
    unknown = write(tmp_path / "data.bin")
    with pytest.raises(InputError, match="unsupported format"):
        collect([unknown])
    with pytest.raises(InputError, match="unsupported format"):
        documents.check_explicit_files([unknown], fake_detect)
    with pytest.raises(InputError, match="no such file"):
        documents.check_explicit_files([tmp_path / "missing.md"], fake_detect)


def test_duplicate_ids_keep_the_first(tmp_path: Path) -> None:
    first = write(tmp_path / "a" / "x.md", "first")
    second = write(tmp_path / "b" / "x.md", "second")
    docs, stats, warnings = collect([first, second])
    assert [d.content for d in docs] == [b"first"]
    assert stats.duplicates == ["x.md"]
    assert warnings


def _corpus_lines(records: list[object]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def test_corpus_jsonl_and_gz(tmp_path: Path) -> None:
    records = [
        {"_id": "4983", "title": "Microstructural development", "text": "Alterations of the architecture."},
        {"_id": 5836, "title": "", "text": "Numeric ids are fine."},
        {"_id": "empty", "title": "T", "text": ""},
    ]
    plain = write(tmp_path / "corpus.jsonl", _corpus_lines(records) + "\n")
    packed = tmp_path / "gz" / "corpus.jsonl.gz"
    packed.parent.mkdir()
    with gzip.open(packed, "wt", encoding="utf-8") as handle:
        handle.write(_corpus_lines(records))
    for path in (plain, packed):
        docs, stats, _ = collect([path])
        assert [d.doc_id for d in docs] == ["4983", "5836"]
        assert docs[0].title == "Microstructural development"
        assert docs[0].content == b"Alterations of the architecture."
        assert docs[0].format == ingestion_pb2.DOCUMENT_FORMAT_TEXT
        assert docs[0].source_uri.endswith("#4983")
        assert stats.corpus_documents == 2
        assert stats.skipped_empty == 1


def test_corpus_in_a_folder_is_expanded(tmp_path: Path) -> None:
    write(tmp_path / "beir" / "corpus.jsonl", _corpus_lines([{"_id": "d1", "text": "x"}]))
    write(tmp_path / "beir" / "queries.jsonl", _corpus_lines([{"_id": "q1", "text": "?"}]))
    docs, stats, _ = collect([tmp_path / "beir"])
    assert [d.doc_id for d in docs] == ["d1"]
    assert stats.skipped_unknown == [str(tmp_path / "beir" / "queries.jsonl")]


@pytest.mark.parametrize(
    ("line", "message"),
    [("{not json", "not JSON"), ('{"title": "no id"}', "_id"), ('{"_id": "x", "text": 3}', "strings")],
)
def test_malformed_corpus_line_names_file_and_line(line: str, message: str) -> None:
    lines = [json.dumps({"_id": "ok", "text": "fine"}), line]
    with pytest.raises(InputError, match=message) as failure:
        list(documents.parse_corpus_lines(lines, "corpus.jsonl", WalkStats()))
    assert "corpus.jsonl:2" in str(failure.value)


def _doc(doc_id: str, size: int) -> ingestion_pb2.Document:
    return ingestion_pb2.Document(doc_id=doc_id, content=b"x" * size)


def test_batches_limit_count() -> None:
    docs = [_doc(f"d{i}", 10) for i in range(7)]
    sizes = [len(b) for b in documents.batches(docs, max_docs=3, max_bytes=10**6)]
    assert sizes == [3, 3, 1]


def test_batches_limit_bytes_and_oversized_documents_go_alone() -> None:
    docs = [_doc("a", 400), _doc("b", 400), _doc("big", 5000), _doc("c", 100)]
    got = [[d.doc_id for d in b] for b in documents.batches(docs, max_docs=100, max_bytes=1000)]
    assert got == [["a", "b"], ["big"], ["c"]]
    for batch in documents.batches(docs, max_docs=100, max_bytes=1000):
        if len(batch) > 1:
            request = ingestion_pb2.IngestDocumentsRequest(collection="c", documents=batch)
            assert request.ByteSize() <= 1000


def test_batches_of_nothing() -> None:
    assert list(documents.batches([])) == []
