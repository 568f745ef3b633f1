"""The block structure of a Markdown passage, as the evidence sentences read it: paragraphs,
list items (one block each), headings, and table rows rendered as one line with their header
("Header1: value1; Header2: value2"); fenced and indented code blocks, link reference
definitions, thematic breaks and heading markers out. A chunk may start inside a code block or a
table; both are recognised from the inside too."""

from __future__ import annotations

import re
from collections.abc import Generator, Iterator
from dataclasses import dataclass

from meshkit.text.markup import WHITESPACE, inline_text

# "[label]: target" on a line of its own defines a link target: no prose.
_LINK_DEFINITION = re.compile(r" {0,3}\[[^\[\]\n]+\]:")
_LIST_MARKER = re.compile(r"(?:[-*+]|\d{1,9}[.)])(?:[ \t]+|$)")
_FENCE_OPEN = re.compile(r"(`{3,}|~{3,})")
_TABLE_DELIMITER_CELL = re.compile(r":?-+:?")
_THEMATIC_BREAK_CHARS = frozenset("-*_= \t")
_CELL_SPLIT = re.compile(r"(\\\||\|)")


@dataclass(frozen=True)
class Block:
    """Lines that read as one unit: a paragraph, a list item, a heading, a rendered table row."""

    text: str
    # A heading, or a paragraph of one line: a title or label unless it reads as a sentence.
    label_like: bool
    # A rendered table row: one sentence whatever full stops its cells hold.
    row: bool = False


class _Paragraph:
    """The lines of the block being read."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.list_item = False

    def flush(self) -> Iterator[Block]:
        if self.lines:
            label_like = len(self.lines) == 1 and not self.list_item
            yield Block(" ".join(self.lines), label_like)
        self.lines = []
        self.list_item = False


def blocks(lines: list[str]) -> Generator[Block, None, None]:
    """Prose blocks of Markdown ``lines``: code blocks, link definitions, thematic breaks and
    heading markers out, list items one block each, table rows rendered with their header."""
    paragraph = _Paragraph()
    fence = _fence_open_at_start(lines)
    after_blank = True
    in_list = False
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        i += 1
        if fence is not None:
            if stripped.startswith(fence) and not stripped.lstrip(fence[0]).strip():
                fence = None
            continue
        fence_open = _FENCE_OPEN.match(stripped)
        if fence_open:
            yield from paragraph.flush()
            fence = fence_open.group(1)
            continue
        if not stripped:
            yield from paragraph.flush()
            after_blank = True
            continue
        indent = len(line) - len(line.lstrip(" \t"))
        if after_blank and not in_list and (indent >= 4 or line[:1] == "\t"):
            # An indented code block: it only starts after a blank line, outside a list.
            continue
        after_blank = False
        if _is_table_start(lines, i - 1):
            yield from paragraph.flush()
            i = yield from _table(lines, i - 1)
            continue
        heading = heading_text(stripped)
        if heading is not None:
            yield from paragraph.flush()
            in_list = False
            if heading:
                yield Block(heading, label_like=True)
            continue
        if _LINK_DEFINITION.match(line) or _is_thematic_break(stripped):
            yield from paragraph.flush()
            continue
        if stripped.startswith("|") or stripped.endswith("|") or stripped.count("|") >= 2:
            # A row whose header is not in this passage (a chunk that starts inside a table, or
            # a row cut by a chunk boundary): its cell values, as one line.
            yield from paragraph.flush()
            row = _row_line([], _cells(stripped)) if not _is_delimiter_row(stripped) else ""
            if row:
                yield Block(row, label_like=False, row=True)
            continue
        marker = _LIST_MARKER.match(stripped)
        if marker:
            yield from paragraph.flush()
            in_list = paragraph.list_item = True
            stripped = stripped[marker.end() :]
        elif indent == 0 and not paragraph.list_item:
            in_list = False
        paragraph.lines.append(stripped.lstrip(">").strip())
    yield from paragraph.flush()


def _fence_open_at_start(lines: list[str]) -> str | None:
    """The fence of a code block the passage starts inside, or None.

    A chunk can begin in the middle of a fenced block whose opening line lies in the previous
    chunk. Openers usually name a language and closers never do, so when the first fence line
    is bare and the next one (if any) names a language, the first one is a closer."""
    found: list[tuple[str, bool]] = []
    for line in lines:
        match = _FENCE_OPEN.match(line.strip())
        if match:
            found.append((match.group(1), bool(line.strip()[len(match.group(1)) :].strip())))
            if len(found) == 2:
                break
    if not found or found[0][1]:
        return None
    return found[0][0] if len(found) == 1 or found[1][1] else None


def heading_text(stripped: str) -> str | None:
    """The text of an ATX heading line ('' for a bare marker), or None: not a heading."""
    marks = len(stripped) - len(stripped.lstrip("#"))
    if not 1 <= marks <= 6:
        return None
    rest = stripped[marks:]
    if rest and rest[0] not in " \t":
        return None
    text = rest.strip().rstrip("#").strip()
    # A heading attribute block ("## Why gRPC? {#why-grpc}") names an anchor, it is no text.
    attributes = text.rfind(" {#")
    if attributes >= 0 and text.endswith("}"):
        text = text[:attributes].rstrip()
    return text


def _is_thematic_break(stripped: str) -> bool:
    return len(stripped) >= 3 and stripped[0] in "-*_=" and set(stripped) <= _THEMATIC_BREAK_CHARS


# --- tables ------------------------------------------------------------------------------------


def _cells(line: str) -> list[str]:
    """The cells of a table row: split at each '|' not escaped with a backslash, the outer
    pipes dropped."""
    row = line.strip()
    cells: list[str] = []
    current: list[str] = []
    for piece in _CELL_SPLIT.split(row):
        if piece == "|":
            cells.append("".join(current))
            current = []
        else:
            current.append("|" if piece == "\\|" else piece)
    cells.append("".join(current))
    if row.startswith("|"):
        cells = cells[1:]
    if row.endswith("|") and not row.endswith("\\|"):
        cells = cells[:-1]
    return [cell.strip() for cell in cells]


def _is_delimiter_row(line: str) -> bool:
    stripped = line.strip()
    if "|" not in stripped and "-" not in stripped:
        return False
    cells = _cells(stripped)
    return bool(cells) and all(_TABLE_DELIMITER_CELL.fullmatch(cell) for cell in cells)


def _is_table_start(lines: list[str], i: int) -> bool:
    """A header row (a line with a pipe) directly followed by a delimiter row."""
    return "|" in lines[i] and i + 1 < len(lines) and "|" in lines[i + 1] and _is_delimiter_row(lines[i + 1])


def _table(lines: list[str], i: int) -> Generator[Block, None, int]:
    """Yield one block per body row ("Header: value; ..."); return the index after the table."""
    header = [inline_text(cell) for cell in _cells(lines[i])]
    i += 2
    while i < len(lines) and "|" in lines[i] and lines[i].strip():
        row = _row_line(header, _cells(lines[i]))
        if row:
            yield Block(row, label_like=False, row=True)
        i += 1
    return i


def _row_line(header: list[str], cells: list[str]) -> str:
    parts = []
    # Cells past the header's (or all, without a header) have no name.
    names = [*header, *[""] * (len(cells) - len(header))]
    for name, cell in zip(names, cells, strict=False):
        value = inline_text(cell)
        if not value:
            continue
        parts.append(f"{name}: {value}" if name else value)
    line = WHITESPACE.sub(" ", "; ".join(parts))
    return line if not line or line[-1] in ".!?" else line + "."
