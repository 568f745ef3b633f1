"""The sentences of a passage that can serve as evidence: prose, not markup.

Passages are chunks of real documents (Markdown with front matter, template shortcodes, tables,
code, HTML). An extractive answer or an extracted fact quoted from a table's pipe row, a code
line or a ``{% endhint %}`` tag reads as noise and supports nothing, so every "sentences of a
passage" call of the answering stages goes through ``evidence_sentences``:

- prose sentences, split with ``meshkit.answering.split_sentences``, inline markup removed
  (links keep their text, images their alt text, inline code its content);
- each Markdown table row under a header as ONE self-contained line, "Header1: value1; Header2:
  value2", so a row that holds the answer keeps the header that says what its cells mean (a
  row whose header is not in the passage, as when a chunk starts inside a table, is its cell
  values joined the same way: "value1; value2");
- nothing from fenced or indented code blocks, YAML/TOML front matter, template tags and
  shortcodes (``{{< >}}``, ``{{% %}}``, ``{% %}``, ``{{ }}``; the prose between a paired
  shortcode's tags stays), HTML tags and comments, link reference definitions, heading lines
  and other one-line labels that are not sentences, list markers.

Passage text is untrusted: every step is a scan with ``str.find`` or a regex that cannot
backtrack over a run, so a megabyte of pipes, backticks or braces costs linear time. Some
helpers are public because ingestion (``services.ingestion.normalize``) strips front matter and
Hugo shortcodes with the same code.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Generator, Iterator
from dataclasses import dataclass

from meshkit.answering import content_words, split_sentences

# (opener, closer) of template tags: Hugo shortcodes, Jinja/GitBook/Liquid tags, then Jinja/Go
# template expressions. Longer openers first: "{{<" must not be read as "{{".
HUGO_SHORTCODES: tuple[tuple[str, str], ...] = (("{{<", ">}}"), ("{{%", "%}}"))
TEMPLATE_TAGS: tuple[tuple[str, str], ...] = (*HUGO_SHORTCODES, ("{%", "%}"), ("{{", "}}"))
_HTML_COMMENT = ("<!--", "-->")

# Front matter: the first line is exactly the delimiter, and a later line closes it.
_FRONT_MATTER_DELIMITERS = ("---", "+++")
# Past this many lines an unclosed "---" is a thematic break, not front matter.
_MAX_FRONT_MATTER_LINES = 200

# A tag: "<" then a letter, "/" or "!" and anything up to ">" that is not "<", ">" or a line
# break. Each failed attempt stops at the next "<", so attempts never rescan a run.
_HTML_TAG = re.compile(r"<[A-Za-z/!][^<>\n]*>")
# ![alt](target) -> alt; [text](target) -> text. The bracket and parenthesis contents exclude
# their own delimiters, so a failed attempt stops at the next "[" or "(" (no rescan).
_IMAGE = re.compile(r"!\[([^\[\]\n]*)\]\([^()\n]*\)")
_LINK = re.compile(r"\[([^\[\]\n]*)\]\([^()\n]*\)")
# [text][ref] and [text][] reference links -> text.
_REF_LINK = re.compile(r"\[([^\[\]\n]*)\]\[[^\[\]\n]*\]")
# "[label]: target" on a line of its own defines a link target: no prose.
_LINK_DEFINITION = re.compile(r" {0,3}\[[^\[\]\n]+\]:")
_LIST_MARKER = re.compile(r"(?:[-*+]|\d{1,9}[.)])(?:[ \t]+|$)")
_FENCE_OPEN = re.compile(r"(`{3,}|~{3,})")
_TABLE_DELIMITER_CELL = re.compile(r":?-+:?")
_THEMATIC_BREAK_CHARS = frozenset("-*_= \t")
_WORD = re.compile(r"[^\W\d_]{2,}")
_WHITESPACE = re.compile(r"\s+")
# Characters that are common in code and rare in prose.
# (Not brackets, parentheses or comparisons: statistics in prose are full of them.)
_CODE_CHARS = frozenset("{};=$\\|`")
# A sentence with a larger share of code characters is a code fragment that escaped a block
# (a chunk can start inside a fence whose opening line is in the previous chunk).
_MAX_CODE_CHAR_SHARE = 0.12
# ... or a larger share of code-like tokens.
_MAX_CODE_TOKEN_SHARE = 0.4
_CODE_TOKEN = re.compile(r"[{}$\\|`]|//|::|->|==|!=|&&|[A-Za-z_]\(|\);")
# Two or more letters each side: "grpc.Dial", not "e.g." or "U.S.".
_DOTTED_NAME = re.compile(r"[A-Za-z_]{2}\.[A-Za-z_]{2}")
# A prose sentence has at least this many words of two or more letters.
_MIN_WORDS = 3
# A one-line paragraph without a sentence end is a heading or label unless it is this long.
_MIN_UNPUNCTUATED_WORDS = 8
_STATEMENT_END_CHARS = ".!\"')\u201d\u2019"
# Chunk text starts with the heading path "Title > Section > Sub" (services/ingestion/chunking).
_HEADING_PATH_SEPARATOR = " > "
# *emphasis* -> emphasis; a star inside a word or a number ("HLA-B*27", "(*2*2)") stays. The
# content cannot hold a star, so an attempt never scans past the next one.
_EMPHASIS = re.compile(r"(?<!\w)\*([^*\s][^*\n]*?)\*(?!\w)")
# What is left in brackets after links: a shortcut reference link ("[PING frame]") keeps its
# text; brackets holding an abbreviation or a statistic ("[RR]", "[n = 83]", "[1]") stay.
_BRACKETED = re.compile(r"\[([A-Za-z][\w .&/+#'\-]*)\]")
_CELL_SPLIT = re.compile(r"(\\\||\|)")


def strip_tags(text: str, pairs: tuple[tuple[str, str], ...] = TEMPLATE_TAGS) -> str:
    """``text`` without the template tags delimited by ``pairs`` (each (opener, closer); the
    text between a paired shortcode's opening and closing tags stays, only the tags go). A tag
    does not span a blank line: an opener whose closer lies past the next paragraph break (or
    nowhere) is left as text, so one stray "{{" cannot swallow the rest of a document.

    Linear: the next closer and the next blank line after a position are looked up with
    cursors that only move forward, so no stretch of text is searched twice."""
    closers = [_NextOccurrence(text, closer) for _, closer in pairs]
    breaks = _NextOccurrence(text, "\n\n")
    out: list[str] = []
    pos = scan = 0
    while True:
        brace = text.find("{", scan)
        if brace < 0:
            break
        end = _tag_end(text, brace, pairs, closers, breaks)
        if end is None:
            scan = brace + 1
            continue
        out.append(text[pos:brace])
        pos = scan = end
    out.append(text[pos:])
    return "".join(out)


class _NextOccurrence:
    """The first occurrence of ``needle`` at or after a position, for non-decreasing positions."""

    def __init__(self, text: str, needle: str) -> None:
        self._text = text
        self._needle = needle
        self._found = -1  # the last answer; -1: none yet
        self._none_after = len(text) + 1  # no occurrence at or after this position

    def at_or_after(self, position: int) -> int | None:
        if position <= self._found:
            return self._found
        if position >= self._none_after:
            return None
        found = self._text.find(self._needle, position)
        if found < 0:
            self._none_after = position
            return None
        self._found = found
        return found


def _tag_end(
    text: str,
    start: int,
    pairs: tuple[tuple[str, str], ...],
    closers: list[_NextOccurrence],
    breaks: _NextOccurrence,
) -> int | None:
    """Where the tag opening at ``start`` ends (past its closer), or None: no tag there."""
    for (opener, closer), closers_of_kind in zip(pairs, closers, strict=True):
        if not text.startswith(opener, start):
            continue
        close = closers_of_kind.at_or_after(start + len(opener))
        if close is None:
            continue
        blank = breaks.at_or_after(start)
        if blank is not None and blank < close:
            continue
        return close + len(closer)
    return None


def strip_html_comments(text: str) -> str:
    """``text`` without ``<!-- ... -->`` comments; an unclosed one runs to the end."""
    opener, closer = _HTML_COMMENT
    out: list[str] = []
    pos = 0
    while True:
        start = text.find(opener, pos)
        if start < 0:
            break
        out.append(text[pos:start])
        close = text.find(closer, start + len(opener))
        if close < 0:
            return "".join(out)
        pos = close + len(closer)
    out.append(text[pos:])
    return "".join(out)


@dataclass(frozen=True)
class FrontMatter:
    """A document's front matter block, split off its body."""

    # The block's lines between the delimiters, unparsed.
    lines: tuple[str, ...]
    body: str

    def field(self, name: str) -> str:
        """A top-level scalar field (``title: X``, ``title = "X"``, or a YAML block scalar
        ``description: >-`` with indented lines), whitespace-collapsed; '' when absent."""
        for i, line in enumerate(self.lines):
            value = _field_value(line, name)
            if value is None:
                continue
            if value in (">", ">-", ">+", "|", "|-", "|+", ""):
                value = " ".join(_indented_run(self.lines, i + 1))
            return _WHITESPACE.sub(" ", _unquote(value.strip())).strip()
        return ""


def split_front_matter(text: str) -> FrontMatter | None:
    """The YAML (``---``) or TOML (``+++``) front matter at the very start of ``text`` and the
    body after it, or None when there is none (no closing delimiter within
    _MAX_FRONT_MATTER_LINES lines: a leading "---" is then a thematic break)."""
    first_end = text.find("\n")
    first = text if first_end < 0 else text[:first_end]
    delimiter = first.rstrip()
    if delimiter not in _FRONT_MATTER_DELIMITERS or first_end < 0:
        return None
    lines: list[str] = []
    pos = first_end + 1
    while len(lines) <= _MAX_FRONT_MATTER_LINES:
        end = text.find("\n", pos)
        line = text[pos:] if end < 0 else text[pos:end]
        if line.rstrip() == delimiter:
            body = "" if end < 0 else text[end + 1 :]
            return FrontMatter(tuple(lines), body)
        if end < 0:
            return None
        lines.append(line)
        pos = end + 1
    return None


def _field_value(line: str, name: str) -> str | None:
    if not line.startswith(name):
        return None
    rest = line[len(name) :].lstrip(" \t")
    if rest[:1] not in (":", "="):
        return None
    return rest[1:].strip()


def _indented_run(lines: tuple[str, ...], start: int) -> Iterator[str]:
    for line in lines[start:]:
        if line.strip() and not line[:1].isspace():
            return
        yield line.strip()


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


# --- blocks ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Block:
    """Lines that read as one unit: a paragraph, a list item, a heading, a rendered table row."""

    text: str
    # A heading, or a paragraph of one line: a title or label unless it reads as a sentence.
    label_like: bool
    # A rendered table row: one sentence whatever full stops its cells hold.
    row: bool = False


def evidence_sentences(text: str) -> list[str]:
    """The sentences of a passage usable as evidence, in order (see the module docstring)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    front = split_front_matter(text)
    if front is not None:
        text = front.body
    sentences: list[str] = []
    for block in _blocks(text.split("\n")):
        if block.row:
            if len(_WORD.findall(block.text)) >= _MIN_WORDS:
                sentences.append(block.text)
            continue
        plain = _inline_text(block.text)
        if block.label_like and not _reads_as_sentence(plain):
            continue
        sentences.extend(s for s in split_sentences(plain) if _is_prose(s))
    return sentences


class _Paragraph:
    """The lines of the block being read."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.list_item = False

    def flush(self) -> Iterator[_Block]:
        if self.lines:
            label_like = len(self.lines) == 1 and not self.list_item
            yield _Block(" ".join(self.lines), label_like)
        self.lines = []
        self.list_item = False


def _blocks(lines: list[str]) -> Generator[_Block, None, None]:
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
                yield _Block(heading, label_like=True)
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
                yield _Block(row, label_like=False, row=True)
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


def _table(lines: list[str], i: int) -> Generator[_Block, None, int]:
    """Yield one block per body row ("Header: value; ..."); return the index after the table."""
    header = [_inline_text(cell) for cell in _cells(lines[i])]
    i += 2
    while i < len(lines) and "|" in lines[i] and lines[i].strip():
        row = _row_line(header, _cells(lines[i]))
        if row:
            yield _Block(row, label_like=False, row=True)
        i += 1
    return i


def _row_line(header: list[str], cells: list[str]) -> str:
    parts = []
    # Cells past the header's (or all, without a header) have no name.
    names = [*header, *[""] * (len(cells) - len(header))]
    for name, cell in zip(names, cells, strict=False):
        value = _inline_text(cell)
        if not value:
            continue
        parts.append(f"{name}: {value}" if name else value)
    line = _WHITESPACE.sub(" ", "; ".join(parts))
    return line if not line or line[-1] in ".!?" else line + "."


# --- inline markup and the prose test ----------------------------------------------------------


def _inline_text(text: str) -> str:
    """Text without inline markup: images -> alt text, links -> their text, HTML tags out,
    inline code and emphasis markers dropped (their content stays)."""
    # Each pass only runs when its opening character is there: most prose has none of them.
    if "<" in text:
        text = _HTML_TAG.sub("", strip_html_comments(text))
    if "{" in text:
        text = strip_tags(text)
    if "[" in text:
        text = _IMAGE.sub(r"\1", text)
        text = _LINK.sub(r"\1", text)
        text = _REF_LINK.sub(r"\1", text)
        text = _BRACKETED.sub(_unbracket_label, text)
    text = _EMPHASIS.sub(r"\1", text.replace("`", "").replace("**", ""))
    return _WHITESPACE.sub(" ", text).strip()


def _unbracket_label(match: re.Match[str]) -> str:
    label = match.group(1)
    return label if any(c.islower() for c in label) else match.group(0)


def _reads_as_sentence(plain: str) -> bool:
    """A heading or one-line paragraph is a sentence when it ends like a statement, or is long
    enough to be one; never when it is a chunk's heading path ("Title > Section")."""
    if _HEADING_PATH_SEPARATOR in plain and not plain.endswith((".", "!")):
        return False
    return plain[-1:] in _STATEMENT_END_CHARS or len(_WORD.findall(plain)) >= _MIN_UNPUNCTUATED_WORDS


def _is_prose(sentence: str) -> bool:
    """Enough words, not a question (it asserts nothing), not mostly code characters."""
    if sentence.endswith("?") or len(_WORD.findall(sentence)) < _MIN_WORDS:
        return False
    code_chars = sum(1 for c in sentence if c in _CODE_CHARS)
    if code_chars > _MAX_CODE_CHAR_SHARE * len(sentence):
        return False
    tokens = sentence.split()
    code_tokens = sum(1 for token in tokens if _is_code_token(token))
    # An assignment ("feature = stub.GetFeature(point)"), not a statistic ("n = 84", "p = .01").
    code_tokens += sum(
        1 for token, after in itertools.pairwise(tokens) if token == "=" and after[:1].isalpha()
    )
    return code_tokens <= _MAX_CODE_TOKEN_SHARE * len(tokens)


def _is_code_token(token: str) -> bool:
    """An operator, a call, or a dotted/snake_case identifier ("stub.GetFeature(point)")."""
    word = token.rstrip(".,:;!")
    return bool(_CODE_TOKEN.search(word)) or "_" in word.strip("_") or _DOTTED_NAME.search(word) is not None


def passage_sentences(text: str, title: str = "") -> list[str]:
    """The evidence sentences of a passage (facts, extractive answers, support checks), in
    order, without the title line chunks start with (it restates what the citation shows).
    Every "sentences of a passage" question of the answering stages goes through here."""
    title_words = content_words(title) if title else set()
    return [s for s in evidence_sentences(text) if content_words(s) and content_words(s) != title_words]
