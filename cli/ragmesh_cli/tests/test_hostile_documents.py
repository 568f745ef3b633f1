"""Files the CLI reads are untrusted too: a corpus line nested too deeply is a clear input
error (json's parser raises RecursionError, not JSONDecodeError, past the interpreter's depth),
and any name becomes a valid doc id in linear time."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshkit.domain.ids import doc_id_problem
from ragmesh_cli import documents
from ragmesh_cli.documents import InputError, WalkStats


@pytest.mark.parametrize("line", ["[" * 100_000, '{"_id": "x", "text": ' + "[" * 100_000])
def test_a_deeply_nested_corpus_line_is_an_input_error(line: str) -> None:
    lines = [json.dumps({"_id": "ok", "text": "fine"}), line]
    with pytest.raises(InputError, match="nested too deeply") as failure:
        list(documents.parse_corpus_lines(lines, "corpus.jsonl", WalkStats()))
    assert "corpus.jsonl:2" in str(failure.value)


NAME_PIECES = ["/", ".", "..", " ", "a", "\u00e9", "\x00", "\n", "-", "_", "%"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(NAME_PIECES), max_size=300).map("".join))
def test_any_name_becomes_a_valid_doc_id(name: str) -> None:
    assert doc_id_problem(documents.sanitize_doc_id(name)) is None


def test_a_megabyte_name_is_sanitised_in_linear_time() -> None:
    started = time.perf_counter()
    doc_id = documents.sanitize_doc_id("/." * 500_000 + "\u00e9" * 500_000)
    assert time.perf_counter() - started < 5.0
    assert doc_id_problem(doc_id) is None
