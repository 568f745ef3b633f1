"""Markdown cut into sections for the chunker (services/ingestion/chunking.py): ATX headings
(found with string methods, linear in the line) outside fenced code blocks open sections with
their heading path; each section's paragraphs are runs of non-blank lines, as spans of the text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# A heading line longer than this is treated as body text: it is prose that happens to
# start with '#', and carrying it in every chunk's heading path would be absurd.
_MAX_HEADING_CHARS = 300
_FENCE_OPEN_RE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
WHITESPACE_RE = re.compile(r"\s+")


@dataclass
class Section:
    path: tuple[str, ...]
    start: int  # of the heading line (of the body for the text before the first heading)
    body_start: int
    end: int
    paragraphs: list[tuple[int, int]] = field(default_factory=list)


def split_sections(markdown: str) -> list[Section]:
    """Split at ATX headings outside fenced code blocks; paragraphs are runs of non-blank
    lines (a fenced block, blank lines and all, stays in one paragraph)."""
    sections = [Section((), 0, 0, len(markdown))]
    stack: list[tuple[int, str]] = []
    fence: str | None = None
    paragraph_start: int | None = None
    paragraph_end = 0
    pos = 0
    for line in markdown.split("\n"):
        line_end = pos + len(line)
        heading = None if fence is not None else _heading(line)
        blank = not line.strip()
        paragraph_over = heading is not None or (blank and fence is None)
        if paragraph_over and paragraph_start is not None:
            sections[-1].paragraphs.append(strip_span(markdown, paragraph_start, paragraph_end))
            paragraph_start = None
        if heading is not None:
            level, text = heading
            while stack and stack[-1][0] >= level:
                stack.pop()
            stack.append((level, text))
            sections[-1].end = pos
            sections.append(Section(tuple(t for _, t in stack), pos, line_end, len(markdown)))
        elif not blank:
            if paragraph_start is None:
                paragraph_start = pos
            paragraph_end = line_end
            fence = _next_fence_state(fence, line)
        pos = line_end + 1
    if paragraph_start is not None:
        sections[-1].paragraphs.append(strip_span(markdown, paragraph_start, paragraph_end))
    return sections


def _heading(line: str) -> tuple[int, str] | None:
    if len(line) > _MAX_HEADING_CHARS:
        return None
    found = _atx_heading(line)
    if found is None:
        return None
    level, raw = found
    text = WHITESPACE_RE.sub(" ", raw).strip()
    return (level, text) if text else None


def _atx_heading(line: str) -> tuple[int, str] | None:
    """(level, raw text) of an ATX heading line, as ``^ {0,3}(#{1,6})(?:[ \\t]+(.*?))?(?:[ \\t]+#+)?
    [ \\t]*$`` would capture them (None: no match), found with string methods: that regex's lazy
    group before optional blank runs backtracks quadratically on a long run of blanks."""
    indent = len(line) - len(line.lstrip(" "))
    if indent > 3:
        return None
    rest = line[indent:]
    after_marks = rest.lstrip("#")
    level = len(rest) - len(after_marks)
    if not 1 <= level <= 6:
        return None
    if not after_marks:
        return level, ""
    if after_marks[0] not in " \t":
        return None
    body = after_marks.lstrip(" \t")
    text = body.rstrip(" \t")
    # A closing sequence (" ##") is not part of the text, unless the text would then be empty.
    before_closer = text.rstrip("#")
    if before_closer != text and before_closer[-1:] in (" ", "\t") and before_closer.rstrip(" \t"):
        return level, before_closer.rstrip(" \t")
    return level, text


def _next_fence_state(fence: str | None, line: str) -> str | None:
    """The open fence's marker after ``line``, or None outside a fenced code block."""
    stripped = line.strip()
    if fence is None:
        match = _FENCE_OPEN_RE.match(line)
        return match.group(1) if match else None
    closes = stripped.startswith(fence) and not stripped.lstrip(fence[0])
    return None if closes and len(line) - len(line.lstrip(" ")) <= 3 else fence


def strip_span(text: str, start: int, end: int) -> tuple[int, int]:
    """``[start, end)`` without leading and trailing whitespace (str.isspace's)."""
    span = text[start:end]
    left = span.lstrip()
    start += len(span) - len(left)
    return start, start + len(left.rstrip())
