"""Turn a raw document (Markdown, plain text, HTML or PDF bytes) into normalised Markdown.

Everything downstream (chunking, chunk offsets, content-hash chunk ids) works on the
Markdown returned here, so the output must be a pure function of the input bytes.
Problems with the document itself raise DocumentError: they are permanent (retrying the
same bytes cannot succeed), so the worker dead-letters them instead of retrying.
"""

from __future__ import annotations

import io
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pdfplumber
from bs4 import BeautifulSoup, Comment, Doctype, NavigableString, Tag
from bs4.exceptions import ParserRejectedMarkup
from markdownify import ATX, MarkdownConverter
from pdfminer.pdfdocument import PDFEncryptionError
from pdfminer.pdftypes import resolve1
from pdfplumber.utils.exceptions import PdfminerException

from meshkit.text.formats import detect_format as detect_format  # re-exported: the service imports it here
from meshkit.text.front_matter import split_front_matter
from meshkit.text.markdown_blocks import heading_text
from meshkit.text.markup import HUGO_SHORTCODES, strip_tags
from ragmesh.ingestion.v1 import ingestion_pb2
from services.ingestion.frontmatter import parse_front_matter, tag_metadata
from services.ingestion.vault import resolve_vault_markdown

DEFAULT_MAX_PDF_PAGES = 2000

_MARKDOWN_FORMATS = frozenset(
    {ingestion_pb2.DOCUMENT_FORMAT_MARKDOWN, ingestion_pb2.DOCUMENT_FORMAT_OBSIDIAN_MARKDOWN}
)
_TEXT_FORMATS = frozenset(
    {
        *_MARKDOWN_FORMATS,
        ingestion_pb2.DOCUMENT_FORMAT_TEXT,
        ingestion_pb2.DOCUMENT_FORMAT_HTML,
    }
)

# Elements that are page furniture or executable, never document content.
_HTML_DROP_TAGS = (
    "script",
    "style",
    "noscript",
    "template",
    "nav",
    "footer",
    "aside",
    "iframe",
    "svg",
    "canvas",
    "object",
    "embed",
    "button",
    "head",
)

# C0 controls other than tab and newline carry no text; the tokenizer drops them anyway.
_CONTROL_CHARS_RE = re.compile(r"[\x01-\x08\x0b\x0e-\x1f\x7f]")
_LINE_BREAKS_RE = re.compile(r"\r\n?|[\f\x85\u2028\u2029]")
_BLANK_RUN_RE = re.compile(r"\n{3,}")
_WHITESPACE_RE = re.compile(r"\s+")
# Up to three spaces of indent then '#': CommonMark would read it as an ATX heading.
_HEADING_LIKE_RE = re.compile(r"^( {0,3})#", re.MULTILINE)
# A PDF line that is only a page number: "12", "- 12 -", "Page 3", "3 of 10", "3/10".
_PAGE_NUMBER_RE = re.compile(
    r"^[\s\-\u2013\u2014]*(?:page\s*)?\d{1,5}(?:\s*(?:/|of)\s*\d{1,5})?[\s\-\u2013\u2014]*$", re.IGNORECASE
)
_DIGITS_RE = re.compile(r"\d+")
# Blanks as markdownify normalises them in HTML text (tabs, spaces and line breaks only).
_HTML_BLANK_RUN_RE = re.compile(r"[\t \r\n]+")
# Soft hyphenation at a line end: "exam-\nple" -> "example".
_HYPHENATED_BREAK_RE = re.compile(r"(\w)-\n([a-z])")
_MAX_TITLE_CHARS = 512
_MAX_ERROR_DETAIL_CHARS = 500
# How many lines at the top and bottom of a PDF page may be running headers/footers.
_PDF_MARGIN_LINES = 2


class DocumentError(Exception):
    """The document cannot be processed, and never will be: a permanent failure. ``reason``
    is shown to callers (status, dead letters) and is in our words; ``detail``, a parser's own
    exception and text, is for the worker's log only."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


# Why a parser refused a document, in our words: the parsers' own texts ("No /Root object! - Is
# this really a PDF?", "expected name token at '<![<!'") name their internals and quote bytes.
PDF_DAMAGED = "unparseable PDF: the file is damaged or is not a PDF"
PDF_ENCRYPTED = "unparseable PDF: the file is encrypted or forbids text extraction"
HTML_UNPARSEABLE = "unparseable HTML: the markup could not be parsed"
# What Python's UTF-8 decoder says (UnicodeDecodeError.reason), in our words.
_UTF8_PROBLEMS = {
    "invalid start byte": "no character starts with this byte",
    "invalid continuation byte": "a character is cut short",
    "unexpected end of data": "the text ends inside a character",
}


# Metadata keys a document's own text may give it (front matter, tags); a caller's keys are
# added on top, up to the stores' limit.
MAX_DOCUMENT_METADATA_KEYS = 48


@dataclass(frozen=True)
class NormalizedDocument:
    markdown: str
    title: str
    # Front matter fields and tags (Markdown only), as filterable metadata.
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _MarkdownSource:
    body: str
    title: str
    metadata: dict[str, str]


def normalize(
    content: bytes,
    fmt: int,
    title: str,
    *,
    max_pdf_pages: int = DEFAULT_MAX_PDF_PAGES,
) -> NormalizedDocument:
    """Normalised Markdown and the document's title (the given one, else one found in the
    document, else ''). Raises DocumentError for documents that cannot be processed."""
    given_title = _clean_title(title)
    metadata: dict[str, str] = {}
    if fmt in _MARKDOWN_FORMATS:
        vault = fmt == ingestion_pb2.DOCUMENT_FORMAT_OBSIDIAN_MARKDOWN
        source = _markdown_source(_decode_text(content), vault=vault)
        markdown = _tidy(source.body)
        found_title = source.title or _markdown_h1(markdown)
        markdown = _headings_as_text(markdown)
        metadata = source.metadata
    elif fmt == ingestion_pb2.DOCUMENT_FORMAT_TEXT:
        markdown = _escape_headings(_tidy(_decode_text(content)))
        found_title = ""
    elif fmt == ingestion_pb2.DOCUMENT_FORMAT_HTML:
        markdown, found_title = _html_to_markdown(_decode_text(content))
        markdown = _headings_as_text(markdown)
    elif fmt == ingestion_pb2.DOCUMENT_FORMAT_PDF:
        markdown, found_title = _pdf_to_markdown(content, max_pdf_pages)
    else:
        raise DocumentError(f"unsupported document format {fmt}")
    if not markdown.strip():
        raise DocumentError("document is empty")
    return NormalizedDocument(markdown=markdown, title=given_title or found_title, metadata=metadata)


def document_problem(content: bytes, fmt: int) -> str | None:
    """Why ``normalize`` will certainly reject the document, found cheaply (no parsing), or
    None. Lets the API refuse bad text up front instead of dead-lettering it later."""
    if fmt == ingestion_pb2.DOCUMENT_FORMAT_PDF:
        return None if content.lstrip()[:5] == b"%PDF-" else "unparseable PDF: no %PDF- header"
    if fmt not in _TEXT_FORMATS:
        return f"unsupported document format {fmt}"
    try:
        text = _decode_text(content)
    except DocumentError as e:
        return e.reason
    return None if text.strip() else "document is empty"


def _decode_text(content: bytes) -> str:
    nul = content.find(b"\x00")
    if nul >= 0:
        raise DocumentError(f"document contains a NUL byte at offset {nul}: binary data is not text")
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as e:
        problem = _UTF8_PROBLEMS.get(e.reason, "not a UTF-8 sequence")
        raise DocumentError(
            f"document is not valid UTF-8: byte 0x{content[e.start]:02x} at offset {e.start} ({problem})",
            detail=_detail(e),
        ) from None
    return text.removeprefix("\ufeff")


def _detail(exc: BaseException) -> str:
    """A parser's exception as the log shows it."""
    return f"{type(exc).__name__}: {exc}"[:_MAX_ERROR_DETAIL_CHARS]


def _tidy(text: str) -> str:
    """Unix newlines, no control characters, no trailing spaces, at most one blank line in a
    row, no leading or trailing blank lines."""
    text = _LINE_BREAKS_RE.sub("\n", text)
    text = _CONTROL_CHARS_RE.sub("", text)
    # Per line rather than a "[ \t]+$" regex: that one restarts at every char of a space run
    # that is not at a line end, which is quadratic ("x", a million spaces, "y": hours).
    text = "\n".join(line.rstrip(" \t") for line in text.split("\n"))
    text = _BLANK_RUN_RE.sub("\n\n", text)
    return text.strip("\n")


def _markdown_source(text: str, *, vault: bool) -> _MarkdownSource:
    """The Markdown a site generator would render, the front matter's title ('' if none) and
    the page's metadata (front matter fields and tags).

    Front matter (YAML "---" or TOML "+++" at the top) is page metadata, not content: it goes,
    except its title (the page's title: such pages rarely have an H1) and its description (the
    lead paragraph the page shows under the title); a block that does not parse stays as body
    text. Hugo shortcodes ({{< name >}}, {{% name %}}) are template calls: the tags go and the
    prose between a pair's tags stays. In a vault's Markdown, wikilinks read as their text,
    embeds go and inline tags join the front matter's (services.ingestion.vault); elsewhere
    "[[" is text ("[[ -f x ]]" in a shell guide)."""
    text = _LINE_BREAKS_RE.sub("\n", text)
    front = split_front_matter(text)
    parsed = parse_front_matter(front, text[:3]) if front is not None else None
    body = strip_tags(front.body if front is not None and parsed is not None else text, HUGO_SHORTCODES)
    inline_tags: tuple[str, ...] = ()
    if vault:
        resolved = resolve_vault_markdown(body)
        body, inline_tags = resolved.markdown, resolved.tags
    if parsed is None:
        return _MarkdownSource(body, "", tag_metadata(inline_tags, MAX_DOCUMENT_METADATA_KEYS))
    title = _clean_title(parsed.title)
    if not body.strip():
        # A placeholder page (a redirect, a list rendered by a template): its title is all it
        # says, and an indexed title beats a document that fails ingestion as empty. As a
        # paragraph, not a heading: a heading alone makes no chunk.
        body = title
    description = parsed.description
    metadata = dict(parsed.metadata)
    metadata.pop("tags", None)
    budget = MAX_DOCUMENT_METADATA_KEYS - len(metadata)
    metadata.update(tag_metadata((*parsed.tags, *inline_tags), budget))
    return _MarkdownSource((f"{description}\n\n{body}" if description else body), title, metadata)


def _headings_as_text(markdown: str) -> str:
    """A page of headings only (a stub: "# Title") as the headings' text in paragraphs: a
    heading alone makes no chunk, and the page is then indexed as its title. Other pages are
    returned as they are."""
    texts = []
    for line in markdown.split("\n"):
        if not line.strip():
            continue
        # A heading has at most three spaces of indent (a tab makes it an indented code line).
        unindented = line.lstrip(" ")
        text = heading_text(unindented.rstrip()) if len(line) - len(unindented) <= 3 else None
        if text is None:
            return markdown
        if text:
            texts.append(text)
    # A heading's text may itself start with '#' ("# # x"): escaped, it stays a paragraph.
    return _escape_headings("\n\n".join(texts)) if texts else markdown


def _escape_headings(text: str) -> str:
    # Plain text has no structure: a line such as "#1 priority" must not become a section.
    return _HEADING_LIKE_RE.sub(r"\1\\#", text)


def _clean_title(title: str) -> str:
    return _WHITESPACE_RE.sub(" ", title).strip()[:_MAX_TITLE_CHARS]


def _markdown_h1(markdown: str) -> str:
    """The text of the first ATX level-1 heading line ("# Title", "# Title #"), or ''."""
    for line in markdown.split("\n"):
        text = _h1_text(line)
        if text is not None:
            return _clean_title(text)
    return ""


def _h1_text(line: str) -> str | None:
    """What ``^ {0,3}# +(.+?)(?: +#+)? *$`` captures on ``line`` (None: no match), found with
    string methods: that regex's lazy group before optional space runs is quadratic on a long
    run of spaces."""
    indent = len(line) - len(line.lstrip(" "))
    rest = line[indent:]
    if indent > 3 or not rest.startswith("# "):
        return None
    body = rest[1:].lstrip(" ")
    if not body:
        # Only spaces after '#': the regex lends one of them to the group, if it has two.
        return " " if len(rest) >= 3 else None
    text = body.rstrip(" ")
    # A closing sequence (" ##") is not part of the text, unless the text would then be empty.
    before_closer = text.rstrip("#")
    if before_closer != text and before_closer.endswith(" ") and before_closer.rstrip(" "):
        return before_closer.rstrip(" ")
    return text


class _Converter(MarkdownConverter):
    """Markdown for retrieval, not for display: link targets and image sources are token-
    expensive noise (and data: URIs can be megabytes), so links keep their text and images
    their alt text."""

    def convert_a(self, el: Any, text: str, parent_tags: set[str]) -> str:
        return text

    def convert_img(self, el: Any, text: str, parent_tags: set[str]) -> str:
        return str(el.attrs.get("alt") or "")


_CONVERTER = _Converter(
    heading_style=ATX,
    bullets="-",
    # Escaping would turn snake_case identifiers into snake\_case, which hurts keyword search.
    escape_asterisks=False,
    escape_underscores=False,
)


def _html_to_markdown(html: str) -> tuple[str, str]:
    try:
        soup = BeautifulSoup(html, "html.parser")
    except ParserRejectedMarkup as e:
        raise DocumentError(HTML_UNPARSEABLE, detail=_detail(e)) from None
    found_title = _html_title(soup)
    for element in soup.find_all(_HTML_DROP_TAGS):
        element.decompose()
    for comment in soup.find_all(string=lambda s: isinstance(s, Comment)):
        comment.extract()
    _collapse_blank_runs(soup)
    try:
        markdown = _CONVERTER.convert_soup(soup)
    except RecursionError:
        raise DocumentError("HTML is nested too deeply to convert") from None
    return _tidy(markdown), found_title


# Text nodes markdownify leaves out (comments are removed before, doctypes skipped).
_SKIPPED_TEXT = (Comment, Doctype)


def _collapse_blank_runs(soup: BeautifulSoup) -> None:
    """Collapse blank runs in text outside <pre> as markdownify does (a run with a line break
    to "\n", else to " "), in linear time: its own pattern for that, "[\t \r\n]*[\r\n][\t \r\n]*",
    retries from every char of a long run of spaces (quadratic). The tree is walked with an
    explicit stack, so deep nesting costs no recursion."""
    stack: list[tuple[Tag, bool]] = [(soup, False)]
    while stack:
        node, in_pre = stack.pop()
        for child in list(node.children):
            if isinstance(child, Tag):
                stack.append((child, in_pre or child.name == "pre"))
            elif not in_pre and isinstance(child, NavigableString) and not isinstance(child, _SKIPPED_TEXT):
                collapsed = _HTML_BLANK_RUN_RE.sub(_blank_run, child)
                if collapsed != child:
                    child.replace_with(type(child)(collapsed))


def _blank_run(match: re.Match[str]) -> str:
    run = match.group(0)
    return "\n" if "\n" in run or "\r" in run else " "


def _html_title(soup: BeautifulSoup) -> str:
    for tag in ("title", "h1"):
        element = soup.find(tag)
        if element is not None:
            title = _clean_title(element.get_text(" "))
            if title:
                return title
    return ""


def _pdf_to_markdown(content: bytes, max_pages: int) -> tuple[str, str]:
    try:
        with pdfplumber.open(io.BytesIO(content)) as pdf:
            # The declared count is checked before pdfplumber materialises every page object.
            _check_page_count(_declared_page_count(pdf), max_pages)
            _check_page_count(len(pdf.pages), max_pages)
            pages = [_pdf_page_text(page) for page in pdf.pages]
            found_title = _pdf_metadata_title(pdf.metadata)
    except DocumentError:
        raise
    except Exception as e:  # pdfminer raises a zoo of types for malformed files
        raise _pdf_failure(e) from None
    pages = _drop_page_furniture(pages)
    text = "\n\n".join("\n".join(lines) for lines in pages if lines)
    text = _HYPHENATED_BREAK_RE.sub(r"\1\2", text)
    markdown = _escape_headings(_tidy(text))
    if not markdown.strip():
        raise DocumentError("unparseable PDF: no extractable text (a scanned image?)")
    return markdown, found_title


def _pdf_failure(exc: Exception) -> Exception:
    """What a parser's exception says of the PDF. pdfplumber wraps pdfminer's in a
    PdfminerException; running out of memory or stack is no fault of the file's structure and
    stays what it is (the sandbox names the limit that was reached)."""
    wrapped = exc.args[0] if isinstance(exc, PdfminerException) and exc.args else None
    cause = wrapped if isinstance(wrapped, BaseException) else exc
    if isinstance(cause, MemoryError | RecursionError):
        return cause
    reason = PDF_ENCRYPTED if isinstance(cause, PDFEncryptionError) else PDF_DAMAGED
    return DocumentError(reason, detail=_detail(cause))


def _declared_page_count(pdf: pdfplumber.PDF) -> int:
    pages = resolve1(pdf.doc.catalog.get("Pages"))
    count = resolve1(pages.get("Count")) if isinstance(pages, dict) else None
    return count if isinstance(count, int) else 0


def _check_page_count(page_count: int, max_pages: int) -> None:
    if page_count > max_pages:
        raise DocumentError(f"PDF has {page_count} pages, the limit is {max_pages}")


def _pdf_page_text(page: pdfplumber.page.Page) -> list[str]:
    try:
        return _pdf_page_lines(page.extract_text() or "")
    finally:
        page.close()  # frees the page's parsed layout objects: pages are visited once


def _pdf_page_lines(text: str) -> list[str]:
    lines = (line.strip() for line in _LINE_BREAKS_RE.sub("\n", text).split("\n"))
    return [line for line in lines if line]


def _pdf_metadata_title(metadata: dict[str, Any]) -> str:
    title = metadata.get("Title")
    if isinstance(title, bytes):
        title = title.decode("utf-8", errors="replace")
    return _clean_title(title) if isinstance(title, str) else ""


def _furniture_key(line: str) -> str:
    # Running headers often carry the page number ("Chapter 2 - page 14"): compare without digits.
    return _DIGITS_RE.sub("#", _WHITESPACE_RE.sub(" ", line).strip().lower())


def _drop_page_furniture(pages: list[list[str]]) -> list[list[str]]:
    """Remove running headers/footers (a line in a page's top or bottom margin lines that
    recurs on most pages) and bare page numbers in those margins."""
    margin_counts: Counter[str] = Counter()
    for lines in pages:
        margin_counts.update({_furniture_key(line) for line in _margin_lines(lines)})
    # Recurring on more than half the pages, and on at least three: two pages are too few to
    # tell a running header from a coincidence.
    threshold = max(3, len(pages) // 2 + 1)
    running = {key for key, count in margin_counts.items() if count >= threshold}
    cleaned = []
    for lines in pages:
        margin = set(range(min(_PDF_MARGIN_LINES, len(lines)))) | set(
            range(max(0, len(lines) - _PDF_MARGIN_LINES), len(lines))
        )
        cleaned.append(
            [
                line
                for i, line in enumerate(lines)
                if i not in margin or not (_PAGE_NUMBER_RE.match(line) or _furniture_key(line) in running)
            ]
        )
    return cleaned


def _margin_lines(lines: list[str]) -> list[str]:
    if len(lines) <= 2 * _PDF_MARGIN_LINES:
        return lines
    return lines[:_PDF_MARGIN_LINES] + lines[-_PDF_MARGIN_LINES:]
