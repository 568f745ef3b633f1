"""Normalisation and chunking of hostile documents: linear time, same results.

Two kinds of tests:
- differential properties (hypothesis, small inputs): each rewritten function gives exactly what
  the regex it replaced gave (the old patterns are kept here as oracles), so chunk ids of
  ordinary documents do not change;
- hostile inputs (runs of blanks, '#', backticks, brackets, '*', '_', '>', every Unicode line
  break, one multi-megabyte line, deep nesting, NULs, invalid UTF-8) in every format: the result
  is well formed or a DocumentError, and comes within a time bound that only a non-linear
  implementation misses (the old code needed hours for the one-megabyte cases).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import pytest
from bs4 import BeautifulSoup, Comment
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from ragmesh.ingestion.v1 import ingestion_pb2 as pb
from services.ingestion import chunking, markdown_sections, normalize, token_windows
from services.ingestion.chunking import Chunker
from services.ingestion.normalize import DocumentError

from .test_chunking import TOKENIZER_PATH, assert_nothing_lost, assert_well_formed
from .test_normalize import make_pdf

MD, TEXT, HTML, PDF = (
    pb.DOCUMENT_FORMAT_MARKDOWN,
    pb.DOCUMENT_FORMAT_TEXT,
    pb.DOCUMENT_FORMAT_HTML,
    pb.DOCUMENT_FORMAT_PDF,
)
MEGABYTE = 1_000_000
# Far above what the linear code needs (well under a second each, a few on a loaded machine),
# far below what the quadratic code needed (hours for a megabyte).
BOUND_S = 15.0

# --- the replaced patterns, as oracles --------------------------------------------------------

OLD_TRAILING_SPACE = re.compile(r"[ \t]+$", re.MULTILINE)
OLD_MARKDOWN_H1 = re.compile(r"^ {0,3}# +(.+?)(?: +#+)? *$", re.MULTILINE)
OLD_ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")


def old_tidy(text: str) -> str:
    text = normalize._LINE_BREAKS_RE.sub("\n", text)
    text = normalize._CONTROL_CHARS_RE.sub("", text)
    text = OLD_TRAILING_SPACE.sub("", text)
    text = normalize._BLANK_RUN_RE.sub("\n\n", text)
    return text.strip("\n")


def old_markdown_h1(markdown: str) -> str:
    match = OLD_MARKDOWN_H1.search(markdown)
    return normalize._clean_title(match.group(1)) if match else ""


def old_strip_span(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def old_html_to_markdown(html: str) -> tuple[str, str]:
    soup = BeautifulSoup(html, "html.parser")
    found_title = normalize._html_title(soup)
    for element in soup.find_all(normalize._HTML_DROP_TAGS):
        element.decompose()
    for comment in soup.find_all(string=lambda s: isinstance(s, Comment)):
        comment.extract()
    return normalize._tidy(normalize._CONVERTER.convert_soup(soup)), found_title


# --- hostile text -------------------------------------------------------------------------------

LINE_BREAKS = ["\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
PIECES = [
    " ",
    "\t",
    "#",
    "# ",
    "`",
    "```",
    "~~~",
    "[",
    "]",
    "(",
    "*",
    "_",
    ">",
    "-",
    "|",
    ".",
    "!",
    "e.g. ",
    "word",
    "x",
    "\u3000",
    "\u00e9",
    "\U0001f600",
    "\x07",
    *LINE_BREAKS,
]


def runs(max_run: int, max_runs: int = 10) -> st.SearchStrategy[str]:
    """Text made of runs of hostile pieces: long runs are what backtracking patterns choke on."""
    length = st.one_of(st.integers(1, 8), st.integers(max_run // 2, max_run))
    run = st.tuples(st.sampled_from(PIECES), length)
    return st.lists(run, min_size=1, max_size=max_runs).map(lambda rs: "".join(p * n for p, n in rs))


def small_text(max_size: int = 40) -> st.SearchStrategy[str]:
    alphabet = [" ", "\t", "#", "a", "b", ".", "\n", "\x0b", "\u2028", "\u3000"]
    return st.text(st.sampled_from(alphabet), max_size=max_size)


def timed(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - started


def assert_body_covered(markdown: str, chunks: list[chunking.ChunkDraft]) -> None:
    """Every non-blank char outside the heading lines the chunker found is in some chunk's span
    (heading text travels in heading paths; a heading without a body has no chunk at all)."""
    covered = bytearray(len(markdown))
    for c in chunks:
        covered[c.char_start : c.char_end] = b"\x01" * (c.char_end - c.char_start)
    for section in markdown_sections.split_sections(markdown)[1:]:
        covered[section.start : section.body_start] = b"\x01" * (section.body_start - section.start)
    lost = [i for i, flag in enumerate(covered) if not flag and not markdown[i].isspace()]
    assert not lost, f"lost content at {lost[0]}: {markdown[max(0, lost[0] - 20) : lost[0] + 20]!r}"


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    tok = Tokenizer.from_file(TOKENIZER_PATH)
    tok.no_truncation()
    tok.no_padding()
    return tok


@pytest.fixture(scope="module")
def chunker() -> Chunker:
    return Chunker(TOKENIZER_PATH, chunk_tokens=200, overlap_tokens=32, model_max_tokens=256)


# --- same results as the replaced patterns ------------------------------------------------------


@settings(max_examples=800, deadline=None)
@given(small_text())
def test_tidy_matches_the_trailing_space_pattern(text: str) -> None:
    assert normalize._tidy(text) == old_tidy(text)


@settings(max_examples=1000, deadline=None)
@given(small_text())
def test_markdown_h1_matches_its_pattern(text: str) -> None:
    assert normalize._markdown_h1(text) == old_markdown_h1(text)
    for line in text.split("\n"):
        match = OLD_MARKDOWN_H1.match(line)
        assert normalize._h1_text(line) == (match.group(1) if match else None)


@settings(max_examples=1000, deadline=None)
@given(st.text(st.sampled_from([" ", "\t", "#", "a", "\u3000", "\x0b"]), max_size=30))
def test_atx_heading_matches_its_pattern(line: str) -> None:
    match = OLD_ATX_HEADING.match(line)
    assert markdown_sections._atx_heading(line) == (
        (len(match.group(1)), match.group(2) or "") if match else None
    )


@settings(max_examples=500, deadline=None)
@given(small_text(), st.integers(0, 40), st.integers(0, 40))
def test_strip_span_matches_the_char_loop(text: str, a: int, b: int) -> None:
    start, end = sorted((min(a, len(text)), min(b, len(text))))
    assert markdown_sections.strip_span(text, start, end) == old_strip_span(text, start, end)


HTML_TAGS = ["<p>", "</p>", "<pre>", "</pre>", "<b>", "</b>", "<li>", "<br>"]
HTML_PIECES = [*HTML_TAGS, " ", "\t", "\n", "\r", "a", "#"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(HTML_PIECES), max_size=30).map("".join))
def test_html_blank_collapse_changes_no_output(html: str) -> None:
    assert normalize._html_to_markdown(html) == old_html_to_markdown(html)


# --- hostile documents: well formed results, linear time ------------------------------------


@pytest.mark.parametrize("fmt", [MD, TEXT, HTML])
@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(text=runs(20_000))
def test_hostile_text_normalises_and_chunks_in_time(fmt: int, text: str, chunker: Chunker) -> None:
    content = (f"<body><p>{text}</p></body>" if fmt == HTML else text).encode()
    started = time.perf_counter()
    try:
        doc = normalize.normalize(content, fmt, "")
    except DocumentError as exc:
        assert exc.reason
        return
    chunks = chunker.chunk(doc.markdown, doc.title)
    assert time.perf_counter() - started < BOUND_S
    md = doc.markdown
    assert "\r" not in md and "\n\n\n" not in md and md == md.strip("\n")
    assert all(line == line.rstrip(" \t") for line in md.split("\n"))
    # Normalising is idempotent: its output is a document it leaves as it is.
    assert normalize.normalize(md.encode(), MD, "").markdown == md
    assert_body_covered(md, chunks)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=runs(600, max_runs=8))
def test_hostile_markdown_chunks_are_well_formed(text: str, chunker: Chunker, tokenizer: Tokenizer) -> None:
    try:
        doc = normalize.normalize(text.encode(), MD, "")
    except DocumentError:
        return
    chunks = chunker.chunk(doc.markdown, "A title")
    assert_well_formed(doc.markdown, chunks, chunker, tokenizer)
    assert_body_covered(doc.markdown, chunks)


@settings(max_examples=40, deadline=None)
@given(
    text=runs(50, max_runs=6),
    junk=st.sampled_from([b"\x00", b"\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80"]),
    at=st.integers(0, 200),
)
@pytest.mark.parametrize("fmt", [MD, TEXT, HTML])
def test_nul_and_invalid_utf8_fail_with_their_offset(fmt: int, text: str, junk: bytes, at: int) -> None:
    raw = text.encode()
    at = min(at, len(raw))
    # Only where a char starts: the junk, not a cut char, is what must be reported.
    while 0 < at < len(raw) and (raw[at] & 0xC0) == 0x80:
        at -= 1
    content = raw[:at] + junk + raw[at:]
    with pytest.raises(DocumentError) as caught:
        normalize.normalize(content, fmt, "")
    assert f"offset {at}" in caught.value.reason


PDF_LINES = [
    " " * 200,
    "#" * 200,
    "- 12 -" + " " * 100 + "x",
    "Page 3 of 10",
    "exam-",
    "ple words here",
    "1" + " " * 150 + "of" + " " * 150,
    "(" * 100,
    "-" * 50 + "7",
    "\xad\xa0" * 40,
]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.sampled_from(PDF_LINES), min_size=1, max_size=6), min_size=1, max_size=5))
def test_hostile_pdf_pages_normalise_or_fail_cleanly(pages: list[list[str]]) -> None:
    try:
        doc, took = timed(normalize.normalize, make_pdf(pages), PDF, "")
    except DocumentError as exc:
        assert exc.reason
        return
    assert took < BOUND_S
    assert "\n\n\n" not in doc.markdown


# --- the cases the old patterns took hours over ---------------------------------------------------

X_SPACES_Y = "x" + " " * MEGABYTE + "y"


def test_a_megabyte_space_run_is_tidied_in_linear_time() -> None:
    tidied, took = timed(normalize._tidy, X_SPACES_Y + "\n" + " " * MEGABYTE + "z")
    assert tidied == X_SPACES_Y + "\n" + " " * MEGABYTE + "z"
    assert took < BOUND_S


def test_a_megabyte_heading_is_read_in_linear_time() -> None:
    title, took = timed(normalize._markdown_h1, "# x" + " " * MEGABYTE + "y #")
    assert title == "x y"
    assert took < BOUND_S


def test_five_megabytes_of_would_be_heading_lines_cost_linear_time() -> None:
    # Each line is under the 300-char heading limit, where the old pattern was quadratic: its
    # lazy text group retried the blank run before an optional closing sequence at every char.
    lines = ("# x" + " " * 295 + "y\n") * (5 * MEGABYTE // 300)
    sections, took = timed(markdown_sections.split_sections, lines)
    assert [s.path for s in sections[1:3]] == [("x y",), ("x y",)]
    assert took < BOUND_S


@pytest.mark.parametrize(
    ("fmt", "content"),
    [
        (MD, X_SPACES_Y),
        (TEXT, X_SPACES_Y),
        (HTML, f"<p>{X_SPACES_Y}</p>"),
        (HTML, "<p>x" + "\t" * MEGABYTE + "y</p>"),
        (MD, "x" + "\t" * MEGABYTE + "y"),
        (MD, "# x" + " " * MEGABYTE + "y"),
    ],
)
def test_the_space_run_document_is_prepared_in_time(fmt: int, content: str, chunker: Chunker) -> None:
    started = time.perf_counter()
    doc = normalize.normalize(content.encode(), fmt, "")
    chunks = chunker.chunk(doc.markdown, doc.title)
    assert time.perf_counter() - started < BOUND_S
    assert len(chunks) <= 4  # "x" and "y" (and the "#"), overlapping windows at most
    assert_nothing_lost(doc.markdown, chunks)


RUN = 200_000


@pytest.mark.parametrize(
    "content",
    [
        "x" + "\u2028" * MEGABYTE + "y",
        "x" + "\r" * MEGABYTE + "y",
        "#" * RUN,
        "`" * RUN,
        "```\n" * (RUN // 4),
        "[" * RUN,
        "> " * (RUN // 2) + "deep quote",
        "*_" * (RUN // 2),
        "{{<" * (RUN // 3),
        "{{< a\n\n" * (RUN // 7) + ">}}",
        "{{% x %}} y " * (RUN // 11),
        "---\n" + "k: v\n" * (RUN // 4),
        "---\n" + "---\n" * (RUN // 4),
    ],
)
def test_long_runs_of_markup_are_prepared_in_time(content: str, chunker: Chunker) -> None:
    started = time.perf_counter()
    doc = normalize.normalize(content.encode(), MD, "")
    chunks = chunker.chunk(doc.markdown, doc.title)
    assert time.perf_counter() - started < BOUND_S
    assert_nothing_lost(doc.markdown, chunks)


def test_one_five_megabyte_line_is_normalised_and_sectioned_in_time() -> None:
    line = " ".join(f"w{i}" for i in range(5 * MEGABYTE // 8)) + " " * MEGABYTE + "#"
    started = time.perf_counter()
    doc = normalize.normalize(line.encode(), MD, "")
    sections = markdown_sections.split_sections(doc.markdown)
    assert time.perf_counter() - started < BOUND_S
    assert [len(s.paragraphs) for s in sections] == [1]


def test_a_one_megabyte_line_is_chunked_whole(chunker: Chunker, tokenizer: Tokenizer) -> None:
    line = " ".join(f"w{i}" for i in range(MEGABYTE // 8))
    chunks, took = timed(chunker.chunk, line, "")
    # Tokenizing is the bulk of it (about a second); a quadratic step would be hours.
    assert took < BOUND_S
    assert_nothing_lost(line, chunks)
    sample = chunks[:: max(1, len(chunks) // 50)]
    assert all(len(tokenizer.encode(c.text).ids) <= chunker.model_max_tokens for c in sample)


def test_huge_sections_chunk_as_one_pass_would(chunker: Chunker, monkeypatch: pytest.MonkeyPatch) -> None:
    # Past TOKENIZE_PIECE_CHARS a section is tokenized in pieces: the chunks are the same.
    text = " ".join(f"token{i % 977} and more." for i in range(8_000))
    assert len(text) > token_windows.TOKENIZE_PIECE_CHARS
    pieced = chunker.chunk(text, "T")
    monkeypatch.setattr(chunking, "TOKENIZE_PIECE_CHARS", 10 * len(text))
    assert chunker.chunk(text, "T") == pieced


def test_deeply_nested_html_is_refused_or_converted_in_time() -> None:
    html = "<div><blockquote>" * 25_000 + "deep text" + "</blockquote></div>" * 25_000
    started = time.perf_counter()
    try:
        doc = normalize.normalize(html.encode(), HTML, "")
    except DocumentError as exc:
        assert "nested too deeply" in exc.reason
    else:
        assert "deep text" in doc.markdown
    assert time.perf_counter() - started < BOUND_S


def test_markup_the_html_parser_rejects_is_a_document_error() -> None:
    with pytest.raises(DocumentError) as caught:
        normalize.normalize(b"<![" * 1000, HTML, "")
    assert caught.value.reason.startswith("unparseable HTML")


def test_a_nul_after_five_megabytes_is_found_in_time() -> None:
    content = b"a" * (5 * MEGABYTE) + b"\x00"
    with pytest.raises(DocumentError):
        timed(normalize.normalize, content, MD, "")


def test_pdf_furniture_rules_cost_linear_time() -> None:
    # Margin lines are matched against the page-number pattern: a long blank run in one.
    number = "- 1" + " " * MEGABYTE + "x -"
    pages = [[number, "header", f"body {i}", f"more {i}", "footer", "end"] for i in range(3)]
    cleaned, took = timed(normalize._drop_page_furniture, pages)
    assert took < BOUND_S
    assert [page[-2:] for page in cleaned] == [[f"body {i}", f"more {i}"] for i in range(3)]
