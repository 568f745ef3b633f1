from __future__ import annotations

import pytest

from ragmesh.ingestion.v1 import ingestion_pb2 as pb
from services.ingestion.chunking import Chunker
from services.ingestion.normalize import (
    DocumentError,
    NormalizedDocument,
    detect_format,
    document_problem,
    normalize,
)

from .test_chunking import TOKENIZER_PATH

MD, TEXT, HTML, PDF = (
    pb.DOCUMENT_FORMAT_MARKDOWN,
    pb.DOCUMENT_FORMAT_TEXT,
    pb.DOCUMENT_FORMAT_HTML,
    pb.DOCUMENT_FORMAT_PDF,
)


def make_pdf(pages: list[list[str]], title: str | None = None) -> bytes:
    """A minimal valid PDF (pdfminer cannot write one): per page, one Helvetica text
    object with one line per entry; the xref table carries real byte offsets."""
    n = len(pages)
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(n))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {n} >>".encode(),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    for i, lines in enumerate(pages):
        ops = ["BT", "/F1 12 Tf", "14 TL", "72 750 Td"]
        for line in lines:
            escaped = line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
            ops.append(f"({escaped}) Tj T*")
        ops.append("ET")
        stream = "\n".join(ops).encode("latin-1")
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            f"/Resources << /Font << /F1 3 0 R >> >> /Contents {5 + 2 * i} 0 R >>".encode()
        )
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    info = b""
    if title is not None:
        objects.append(f"<< /Title ({title}) >>".encode("latin-1"))
        info = b" /Info %d 0 R" % len(objects)
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    out += b"trailer\n<< /Size %d /Root 1 0 R%s >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, info, xref)
    return bytes(out)


def reason_of(content: bytes, fmt: int, **kwargs: int) -> str:
    with pytest.raises(DocumentError) as caught:
        normalize(content, fmt, "", **kwargs)
    assert str(caught.value) == caught.value.reason
    return caught.value.reason


# --- format detection -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a.md", MD),
        ("dir/READ.ME.Markdown", MD),
        ("x.mdx", MD),
        ("notes.txt", TEXT),
        ("notes.TEXT", TEXT),
        ("index.rst", TEXT),
        ("page.html", HTML),
        ("page.HTM", HTML),
        ("paper.pdf", PDF),
        ("C:\\docs\\paper.PDF", PDF),
    ],
)
def test_detect_format_by_extension(name: str, expected: int) -> None:
    assert detect_format(name, b"whatever") == expected


def test_detect_format_unknown_and_pdf_magic() -> None:
    assert detect_format("image.png", b"\x89PNG") is None
    assert detect_format("noext", b"hello") is None
    assert detect_format("noext", b"%PDF-1.7\n...") == PDF
    assert detect_format("", b"") is None


# --- text decoding rules ----------------------------------------------------------------


@pytest.mark.parametrize("fmt", [MD, TEXT, HTML])
def test_invalid_utf8_names_the_offset(fmt: int) -> None:
    reason = reason_of(b"hello\xc3\x28 world", fmt)
    assert "not valid UTF-8" in reason
    assert "offset 5" in reason
    assert "0xc3" in reason


def test_truncated_utf8_sequence_at_end() -> None:
    assert "offset 3" in reason_of(b"abc\xe2\x82", TEXT)


def test_nul_byte_rejected_with_offset() -> None:
    reason = reason_of(b"ab\x00cd", MD)
    assert "NUL" in reason and "offset 2" in reason


@pytest.mark.parametrize("content", [b"", b"   \n\t\r\n  ", b"\xef\xbb\xbf", b"\xef\xbb\xbf \n"])
@pytest.mark.parametrize("fmt", [MD, TEXT, HTML])
def test_empty_documents(content: bytes, fmt: int) -> None:
    assert reason_of(content, fmt) == "document is empty"


def test_html_with_only_page_furniture_is_empty() -> None:
    html = b"<html><head><title>T</title></head><body><script>x()</script><nav>menu</nav></body></html>"
    assert reason_of(html, HTML) == "document is empty"


def test_bom_is_accepted_and_removed() -> None:
    doc = normalize(b"\xef\xbb\xbf# Title\n\nBody", MD, "")
    assert doc.markdown == "# Title\n\nBody"


def test_unsupported_format() -> None:
    assert "unsupported" in reason_of(b"x", pb.DOCUMENT_FORMAT_UNSPECIFIED)


# --- markdown and text ------------------------------------------------------------------


def test_markdown_passes_through_with_tidy_whitespace() -> None:
    raw = b"\n\n# Guide  \r\n\r\nLine one   \r\nline two\t\n\n\n\n## Next\rMore\x07 text\n\n"
    doc = normalize(raw, MD, "")
    assert doc == NormalizedDocument("# Guide\n\nLine one\nline two\n\n## Next\nMore text", "Guide")


def test_given_title_wins_and_is_cleaned() -> None:
    assert normalize(b"# Heading\n\nx", MD, "  My \n Title ").title == "My Title"
    assert normalize(b"no heading here", MD, "").title == ""


# Shaped like the gRPC documentation's pages (Hugo: YAML front matter, shortcodes, no H1).
HUGO_PAGE = b"""---
title: Keepalive
description: >-
  How to use HTTP/2 PING-based
  keepalives in gRPC.
weight: 40
---

### Overview

Keepalives keep an idle connection open.

{{% alert title="Note" color="info" %}}
  Health checking is a separate concern.
{{% /alert %}}

{{< youtube id="cSGBbwvW1y4" class="youtube-video" title="gRPC" >}}

```sh
git clone -b {{< param grpc_vers.core >}} https://github.com/grpc/grpc
```
"""


def test_front_matter_becomes_title_and_lead_paragraph() -> None:
    doc = normalize(HUGO_PAGE, MD, "")
    assert doc.title == "Keepalive"
    assert doc.markdown.startswith("How to use HTTP/2 PING-based keepalives in gRPC.\n\n### Overview\n")
    for metadata in ("---", "title:", "weight", "description"):
        assert metadata not in doc.markdown


def test_hugo_shortcode_tags_go_their_prose_stays() -> None:
    markdown = normalize(HUGO_PAGE, MD, "").markdown
    assert "{{" not in markdown and "}}" not in markdown
    assert "Health checking is a separate concern." in markdown
    assert "youtube" not in markdown
    assert "git clone -b  https://github.com/grpc/grpc" in markdown


def test_toml_front_matter_and_given_title() -> None:
    doc = normalize(b'+++\ntitle = "Auth"\n+++\n\nUse TLS.', MD, "Given")
    assert doc == NormalizedDocument("Use TLS.", "Given")


def test_front_matter_title_beats_h1_and_h1_is_the_fallback() -> None:
    assert normalize(b"---\ntitle: Page\n---\n# Heading\n\nx", MD, "").title == "Page"
    assert normalize(b"---\nweight: 3\n---\n# Heading\n\nx", MD, "").title == "Heading"


def test_placeholder_page_is_its_title_not_an_empty_document() -> None:
    raw = b"---\ntitle: API reference\n_build: { render: link }\n---\n\n{{% docs/prog-lang-home-content %}}\n"
    assert normalize(raw, MD, "") == NormalizedDocument("API reference", "API reference")
    with pytest.raises(DocumentError, match="empty"):
        normalize(b"---\nweight: 3\n---\n", MD, "")


def test_placeholder_page_makes_a_chunk() -> None:
    chunker = Chunker(TOKENIZER_PATH, chunk_tokens=200, overlap_tokens=32, model_max_tokens=256)
    doc = normalize(b"---\ntitle: API reference\nweight: 90\n---\n", MD, "")
    chunks = chunker.chunk(doc.markdown, doc.title)
    assert len(chunks) == 1 and chunks[0].text.endswith("API reference")


def test_leading_rule_without_closing_delimiter_is_content() -> None:
    raw = b"---\nA thematic break first, then text.\n"
    assert normalize(raw, MD, "").markdown == "---\nA thematic break first, then text."


def test_jinja_like_text_is_not_touched_at_ingest() -> None:
    # Only Hugo's own delimiters are template calls for certain: "{% raw %}" may be content.
    raw = b"Write {% raw %} and {{ name }} in the template."
    assert normalize(raw, MD, "").markdown == raw.decode()


def test_text_keeps_paragraphs_and_escapes_heading_lines() -> None:
    raw = b"#1 priority\n   ## not a header\n    # indented code-ish\n\nSecond para # mid-line\n"
    doc = normalize(raw, TEXT, "Notes")
    assert doc.markdown == (
        "\\#1 priority\n   \\## not a header\n    # indented code-ish\n\nSecond para # mid-line"
    )
    assert doc.title == "Notes"


# --- HTML -------------------------------------------------------------------------------

PAGE = b"""<!doctype html>
<html><head><title> The  Page </title><style>body { color: red }</style>
<script>var secret = "SCRIPT";</script></head>
<body>
<nav><a href="/">Home</a> | <a href="/about">NAVLINK</a></nav>
<article>
<h1>Main heading</h1>
<p>Intro with a <a href="https://example.com/very/long/url">link text</a> and snake_case_name.</p>
<!-- a COMMENT -->
<h2>Lists</h2>
<ul><li>first</li><li>second</li></ul>
<ol><li>one</li><li>two</li></ol>
<h3>Table</h3>
<table><tr><th>Name</th><th>Value</th></tr><tr><td>alpha</td><td>1</td></tr></table>
<pre><code>def f(x):
    return x * 2
</code></pre>
<p><img src="data:image/png;base64,AAAAAAAAAAAAAAAA" alt="a diagram"></p>
</article>
<aside>SIDEBAR</aside>
<footer>FOOTER text</footer>
<script>alert("SCRIPT2")</script>
</body></html>
"""


def test_html_to_markdown() -> None:
    doc = normalize(PAGE, HTML, "")
    md = doc.markdown
    assert doc.title == "The Page"
    for furniture in ("SCRIPT", "color: red", "NAVLINK", "COMMENT", "SIDEBAR", "FOOTER", "base64"):
        assert furniture not in md
    assert "# Main heading" in md.splitlines()
    assert "## Lists" in md.splitlines()
    assert "### Table" in md.splitlines()
    assert "- first\n- second" in md
    assert "1. one\n2. two" in md
    assert "| Name | Value |" in md and "| alpha | 1 |" in md
    assert "```\ndef f(x):\n    return x * 2\n```" in md
    assert "Intro with a link text and snake_case_name." in md
    assert "https://example.com" not in md
    assert "a diagram" in md
    assert "\n\n\n" not in md and not md.startswith("\n")


def test_html_title_falls_back_to_h1_and_given_title_wins() -> None:
    html = b"<body><h1>First <em>heading</em></h1><p>text</p></body>"
    assert normalize(html, HTML, "").title == "First heading"
    assert normalize(html, HTML, "Given").title == "Given"
    assert normalize(b"<p>only text</p>", HTML, "").title == ""


def test_deeply_nested_html_does_not_crash() -> None:
    html = b"<div>" * 20000 + b"deep text" + b"</div>" * 20000
    try:
        doc = normalize(html, HTML, "")
    except DocumentError as e:
        assert "nested too deeply" in e.reason
    else:
        assert "deep text" in doc.markdown


# --- PDF --------------------------------------------------------------------------------


def test_pdf_single_page() -> None:
    doc = normalize(make_pdf([["Hello PDF world.", "Second line here."]]), PDF, "")
    assert doc.markdown == "Hello PDF world.\nSecond line here."
    assert doc.title == ""


def test_pdf_drops_running_headers_footers_and_page_numbers() -> None:
    topics = ["alpha", "beta", "gamma", "delta", "epsilon"]
    pages = [
        [
            "ACME Annual Report 2024",
            f"Section on {topic} begins here.",
            f"The {topic} results were exam-",
            "ple worthy.",
            "# starts with a hash",
            f"Closing words about {topic}.",
            f"Page {i + 1} of {len(topics)}",
        ]
        for i, topic in enumerate(topics)
    ]
    doc = normalize(make_pdf(pages, title="Report Title"), PDF, "")
    assert doc.title == "Report Title"
    md = doc.markdown
    assert "ACME Annual Report" not in md
    assert "Page " not in md
    for topic in topics:
        assert f"Section on {topic} begins here." in md
        assert f"Closing words about {topic}." in md
    assert f"The {topics[0]} results were example worthy.\n\\# starts with a hash" in md
    assert md.count("\n\n") == len(topics) - 1  # pages become paragraphs


def test_pdf_header_on_few_pages_is_kept() -> None:
    pages = [["Shared line", f"body {i} text", "more", "end"] for i in range(2)]
    md = normalize(make_pdf(pages), PDF, "").markdown
    assert md.count("Shared line") == 2


def test_pdf_garbage_and_truncated() -> None:
    assert reason_of(b"%PDF-1.4 this is not really a pdf", PDF).startswith("unparseable PDF: ")
    assert reason_of(b"not a pdf at all", PDF).startswith("unparseable PDF: ")
    good = make_pdf([["text"]])
    assert reason_of(good[: len(good) // 2], PDF).startswith("unparseable PDF")


def test_pdf_without_text() -> None:
    reason = reason_of(make_pdf([[], []]), PDF)
    assert reason.startswith("unparseable PDF: no extractable text")


def test_pdf_page_limit() -> None:
    pdf = make_pdf([["one"], ["two"], ["three"]])
    assert reason_of(pdf, PDF, max_pdf_pages=2) == "PDF has 3 pages, the limit is 2"
    assert "three" in normalize(pdf, PDF, "", max_pdf_pages=3).markdown


# --- cheap pre-check for the API --------------------------------------------------------


def test_document_problem() -> None:
    assert document_problem(b"# fine", MD) is None
    assert document_problem(b"<p>x</p>", HTML) is None
    assert document_problem(b" \n", TEXT) == "document is empty"
    assert "offset 1" in (document_problem(b"a\xff", TEXT) or "")
    assert document_problem(make_pdf([["x"]]), PDF) is None
    assert "%PDF-" in (document_problem(b"hello", PDF) or "")
    assert "unsupported" in (document_problem(b"x", 99) or "")
