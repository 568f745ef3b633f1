"""Header-aware chunking of normalised Markdown, sized with the embedding model's tokenizer.

The document is cut into sections at ATX headings (ignoring '#' lines inside fenced code);
each section's paragraphs are packed into chunks of up to ``chunk_tokens`` tokens. A paragraph
too big for one chunk is cut into overlapping windows, preferably at sentence ends. Nothing
is ever truncated: every character of every paragraph lies in some chunk's
``[char_start, char_end)`` span (heading lines travel in the chunk's heading path instead).

Chunk text = "<title> > <heading> > <sub-heading>\\n\\n<body>", where body is exactly
``markdown[char_start:char_end]``. The heading path is prefixed because a chunk is embedded
and keyword-indexed on its own: the third chunk of "Installation > Linux" says neither
word, yet a query for "install on linux" should find it. The prefix costs at most a quarter
of the token budget, is included in ``token_count``, and drops the title when the first
heading already repeats it.

Sizing uses one tokenizer pass per section and cuts by the token offsets. Chunks whose
count is not exact (cut inside a word, giant [UNK] words) or near the model's hard limit
are re-encoded and split until they fit, special tokens included, whatever the input.
"""

from __future__ import annotations

import operator
import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field

from tokenizers import Tokenizer

from meshkit.settings import IngestionSettings

# WordPiece maps any word longer than 100 chars to a single [UNK]: such a "token" is cut
# into pseudo-tokens of this many chars so that chunk boundaries can fall inside it.
_MAX_UNIT_CHARS = 100
# A heading line longer than this is treated as body text: it is prose that happens to
# start with '#', and carrying it in every chunk's heading path would be absurd.
_MAX_HEADING_CHARS = 300
# Headroom under the model limit for trusting a computed count without re-encoding: covers
# tokenizers whose output at a span's edges differs slightly from inside the section.
_TRUST_MARGIN_TOKENS = 8
# Sections longer than this are encoded in pieces of at most this many chars (see _units).
_TOKENIZE_PIECE_CHARS = 65_536
_PATH_SEPARATOR = " > "
_PREFIX_SEPARATOR = "\n\n"

_FENCE_OPEN_RE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_WHITESPACE_RE = re.compile(r"\s+")
# Where a new sentence (or line) starts: after terminal punctuation plus optional closing
# quotes/brackets and whitespace, after CJK full stops, and after a line break.
_SENTENCE_START_RE = re.compile(r"[.!?\u2026][\"'\u201d\u2019)\]]*\s+|[\u3002\uff01\uff1f]\s*|\n\s*")


@dataclass(frozen=True)
class ChunkDraft:
    text: str
    heading_path: list[str]
    ordinal: int
    char_start: int
    char_end: int
    # Tokens of ``text`` without the model's special tokens ([CLS]/[SEP]).
    token_count: int


@dataclass
class _Section:
    path: tuple[str, ...]
    start: int  # of the heading line (of the body for the text before the first heading)
    body_start: int
    end: int
    paragraphs: list[tuple[int, int]] = field(default_factory=list)


@dataclass(frozen=True)
class _Piece:
    start: int
    end: int
    tokens: int
    # Whether ``tokens`` is the span's true count: the tokenizer splits words at whitespace
    # and punctuation and normalises char by char, so a span cut at word boundaries re-encodes
    # to exactly the section pass's tokens; a cut inside a word may not.
    exact: bool


@dataclass
class _Span:
    """A chunk in the making: its heading path, prefix and body span."""

    path: tuple[str, ...]
    prefix: str
    prefix_tokens: int
    start: int
    end: int
    body_tokens: int
    exact: bool


class _Units:
    """Token start/end offsets (absolute, into the markdown) of one section, with giant
    [UNK] tokens split into cuttable pseudo-tokens."""

    def __init__(
        self, offsets: list[tuple[int, int]], tokens: list[str], base: int, *, estimated: bool = False
    ) -> None:
        self.starts = [base + a for a, _ in offsets]
        self.ends = [base + b for _, b in offsets]
        self.tokens = tokens
        giants = bool(offsets) and max(map(operator.sub, self.ends, self.starts)) > _MAX_UNIT_CHARS
        if giants:
            self._split_giants()
        # Pseudo-tokens (or a section encoded in pieces) make unit counts estimates, not token
        # counts: the chunks are then re-encoded before they are trusted.
        self.has_giants = giants or estimated

    def _split_giants(self) -> None:
        starts: list[int] = []
        ends: list[int] = []
        tokens: list[str] = []
        for a, b, token in zip(self.starts, self.ends, self.tokens, strict=True):
            if b - a <= _MAX_UNIT_CHARS:
                starts.append(a)
                ends.append(b)
                tokens.append(token)
                continue
            for piece_start in range(a, b, _MAX_UNIT_CHARS):
                starts.append(piece_start)
                ends.append(min(b, piece_start + _MAX_UNIT_CHARS))
                # Marked as a word continuation: cutting there splits the word.
                tokens.append(token if piece_start == a else "##")
        self.starts, self.ends, self.tokens = starts, ends, tokens

    def word_start(self, k: int) -> bool:
        return not self.tokens[k].startswith("##")

    def count(self, start: int, end: int) -> int:
        """Units that start within [start, end)."""
        return bisect_left(self.starts, end) - bisect_left(self.starts, start)

    def gap_before(self, k: int) -> bool:
        return k > 0 and self.starts[k] > self.ends[k - 1]


class Chunker:
    """Deterministic: the same markdown and title always give the same chunks (chunk ids
    downstream are content hashes). Thread-safe: chunk() keeps no state between calls."""

    def __init__(
        self,
        tokenizer_path: str,
        chunk_tokens: int,
        overlap_tokens: int,
        model_max_tokens: int,
        *,
        max_chunk_chars: int | None = None,
    ) -> None:
        self._tokenizer = Tokenizer.from_file(tokenizer_path)
        # tokenizer.json files often ship with truncation/padding on: both would falsify counts.
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        self._special_tokens = self._tokenizer.num_special_tokens_to_add(False)
        if chunk_tokens < 16:
            raise ValueError(f"chunk_tokens must be at least 16, got {chunk_tokens}")
        if chunk_tokens + self._special_tokens > model_max_tokens:
            raise ValueError(
                f"chunk_tokens {chunk_tokens} plus {self._special_tokens} special tokens exceeds "
                f"model_max_tokens {model_max_tokens}"
            )
        if not 0 <= overlap_tokens <= chunk_tokens // 2:
            raise ValueError(f"overlap_tokens must be in [0, {chunk_tokens // 2}], got {overlap_tokens}")
        self.chunk_tokens = chunk_tokens
        self.overlap_tokens = overlap_tokens
        self.model_max_tokens = model_max_tokens
        # Tokens bound the embedding input; this bounds the chunk's size for keyword search
        # and display when tokens are few but long (URLs, base64, [UNK] runs).
        self.max_chunk_chars = max_chunk_chars or max(chunk_tokens * 12, 4 * _MAX_UNIT_CHARS)
        if self.max_chunk_chars < 4 * _MAX_UNIT_CHARS:
            raise ValueError(f"max_chunk_chars must be at least {4 * _MAX_UNIT_CHARS}")
        self._prefix_cap = chunk_tokens // 4

    @classmethod
    def from_settings(cls, settings: IngestionSettings) -> Chunker:
        """The chunker the ingestion workers use: anything that must see the same chunks (the
        reranker build, benchmarks) builds it here."""
        return cls(
            settings.ingest_tokenizer_path,
            settings.ingest_chunk_tokens,
            settings.ingest_chunk_overlap_tokens,
            settings.ingest_model_max_tokens,
        )

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` without special tokens."""
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def chunk(self, markdown: str, title: str) -> list[ChunkDraft]:
        title = _WHITESPACE_RE.sub(" ", title).strip()
        prefixes: dict[tuple[str, ...], tuple[str, int]] = {}
        spans: list[_Span] = []
        pending: _Span | None = None  # a one-chunk section that later small sections may join
        for section in _sections(markdown):
            if not section.paragraphs:
                continue
            if section.path not in prefixes:
                prefixes[section.path] = self._prefix(title, section.path)
            prefix, prefix_tokens = prefixes[section.path]
            units = self._units(markdown, section)
            pieces = self._pack(markdown, section, units, self.chunk_tokens - prefix_tokens)
            if len(pieces) == 1:
                piece = pieces[0]
                if pending is not None and self._merged(markdown, pending, piece):
                    continue
                if pending is not None:
                    spans.append(pending)
                pending = _Span(
                    section.path, prefix, prefix_tokens, piece.start, piece.end, piece.tokens, piece.exact
                )
                continue
            if pending is not None:
                spans.append(pending)
                pending = None
            spans.extend(
                _Span(section.path, prefix, prefix_tokens, p.start, p.end, p.tokens, p.exact) for p in pieces
            )
        if pending is not None:
            spans.append(pending)
        return self._finish(markdown, spans)

    def _merged(self, markdown: str, pending: _Span, piece: _Piece) -> bool:
        """Join a one-chunk section onto the previous one-chunk section(s) when either is
        small, so that a run of tiny sections does not become a run of tiny chunks (which
        embed poorly). The merged chunk keeps the first section's heading path; the later
        heading lines (and those of empty sections between) become body text."""
        small = self.chunk_tokens // 4
        if pending.body_tokens >= small and piece.tokens >= small:
            return False
        if piece.end - pending.start > self.max_chunk_chars:
            return False
        joined = self.count_tokens(markdown[pending.end : piece.start]) + piece.tokens
        if pending.prefix_tokens + pending.body_tokens + joined > self.chunk_tokens:
            return False
        pending.end = piece.end
        pending.body_tokens += joined
        pending.exact = pending.exact and piece.exact
        return True

    def _prefix(self, title: str, path: tuple[str, ...]) -> tuple[str, int]:
        """The heading-path prefix and its token count, at most a quarter of the budget: the
        outermost parts go first, then the rest is cut at a token boundary."""
        parts = list(path)
        if title and not (parts and parts[0].casefold() == title.casefold()):
            parts.insert(0, title)
        while parts:
            prefix = _PATH_SEPARATOR.join(parts)
            encoding = self._tokenizer.encode(prefix, add_special_tokens=False)
            if len(encoding.ids) <= self._prefix_cap:
                return prefix, len(encoding.ids)
            if len(parts) == 1:
                cut = encoding.offsets[self._prefix_cap - 1][1]
                prefix = prefix[:cut].rstrip()
                return prefix, self.count_tokens(prefix)
            parts.pop(0)
        return "", 0

    def _units(self, markdown: str, section: _Section) -> _Units:
        text = markdown[section.start : section.end]
        if len(text) <= _TOKENIZE_PIECE_CHARS:
            encoding = self._tokenizer.encode(text, add_special_tokens=False)
            return _Units(encoding.offsets, encoding.tokens, section.start)
        # One encode of a huge section costs the tokenizer more than linear time (a 16 MB line:
        # 23 s; in 64k pieces: 5 s). Pieces end at whitespace, where the tokenizer starts a new
        # word anyway; the counts are still only trusted after the chunks are re-encoded.
        pieces = _tokenize_pieces(text)
        encodings = self._tokenizer.encode_batch([text[a:b] for a, b in pieces], add_special_tokens=False)
        offsets = [(a + x, a + y) for (a, _b), e in zip(pieces, encodings, strict=True) for x, y in e.offsets]
        tokens = [token for e in encodings for token in e.tokens]
        return _Units(offsets, tokens, section.start, estimated=True)

    def _pack(self, markdown: str, section: _Section, units: _Units, budget: int) -> list[_Piece]:
        """Consecutive paragraphs packed up to the budget; oversized ones cut into windows."""
        pieces: list[_Piece] = []
        current: _Piece | None = None
        for start, end in section.paragraphs:
            tokens = units.count(start, end)
            if tokens > budget or end - start > self.max_chunk_chars:
                if current is not None:
                    pieces.append(current)
                    current = None
                pieces.extend(self._windows(markdown, units, start, end, budget))
            elif (
                current is not None
                and current.tokens + tokens <= budget
                and end - current.start <= self.max_chunk_chars
            ):
                current = _Piece(current.start, end, current.tokens + tokens, current.exact)
            else:
                if current is not None:
                    pieces.append(current)
                current = _Piece(start, end, tokens, not units.has_giants)
        if current is not None:
            pieces.append(current)
        return pieces

    def _windows(self, markdown: str, units: _Units, start: int, end: int, budget: int) -> list[_Piece]:
        """Cut one paragraph into windows of at most ``budget`` units, consecutive windows
        sharing up to ``overlap_tokens`` units; cuts fall on sentence starts when one lies in
        the window's second half, else between words, else anywhere."""
        lo = bisect_left(units.starts, start)
        hi = bisect_left(units.starts, end)
        if lo == hi:  # nothing the tokenizer sees (zero-width chars): size is no concern
            return [_Piece(start, end, 0, True)]
        sentence_starts = _sentence_starts(markdown, units, start, end, lo, hi)
        overlap = min(self.overlap_tokens, budget // 2)
        windows: list[_Piece] = []
        i = lo
        while True:
            limit = self._window_limit(units, i, hi, budget)
            if limit >= hi:
                windows.append(_window_piece(markdown, units, i, hi, lo, start, end))
                return windows
            j = _cut_before(units, i, limit, hi, sentence_starts)
            windows.append(_window_piece(markdown, units, i, j, lo, start, end))
            if j >= hi:
                return windows
            i = _next_window_start(units, i, j, overlap, sentence_starts)

    def _window_limit(self, units: _Units, i: int, hi: int, budget: int) -> int:
        """The furthest unit index j such that units [i, j) fit the token and char budgets."""
        token_limit = min(hi, i + budget)
        char_limit = bisect_right(units.ends, units.starts[i] + self.max_chunk_chars, i + 1, token_limit)
        return max(i + 1, min(token_limit, char_limit))

    def _finish(self, markdown: str, spans: list[_Span]) -> list[ChunkDraft]:
        """Enforce the model's hard limit and number the chunks. Spans with an exact count
        comfortably under the limit are trusted (re-encoding every chunk would double the
        tokenizer time); the rest are re-encoded and halved until they fit."""
        limit = self.model_max_tokens - self._special_tokens
        finished: list[tuple[tuple[str, ...], str, int, int, int]] = []
        todo: list[tuple[tuple[str, ...], str, int, int]] = []
        for span in spans:
            tokens = span.prefix_tokens + span.body_tokens
            fits_chars = span.end - span.start <= self.max_chunk_chars
            if span.exact and fits_chars and tokens + _TRUST_MARGIN_TOKENS <= limit:
                finished.append((span.path, span.prefix, span.start, span.end, tokens))
            else:
                todo.append((span.path, span.prefix, span.start, span.end))
        while todo:
            texts = [_chunk_text(prefix, markdown[a:b]) for _, prefix, a, b in todo]
            encodings = self._tokenizer.encode_batch(texts, add_special_tokens=False)
            retry: list[tuple[tuple[str, ...], str, int, int]] = []
            for (path, prefix, a, b), encoding in zip(todo, encodings, strict=True):
                if len(encoding.ids) <= limit and b - a <= self.max_chunk_chars:
                    finished.append((path, prefix, a, b, len(encoding.ids)))
                else:
                    # Re-tokenising a cut inside a word can cost more than the section pass
                    # counted, and chars the tokenizer drops are not bounded by the windows:
                    # halve until it fits (a single char always does).
                    retry.extend((path, prefix, x, y) for x, y in _halve(markdown, a, b))
            todo = retry
        finished.sort(key=lambda item: (item[2], item[3]))
        chunks = []
        for ordinal, (path, prefix, a, b, tokens) in enumerate(finished):
            text = _chunk_text(prefix, markdown[a:b])
            assert tokens + self._special_tokens <= self.model_max_tokens, "chunk over the model limit"
            chunks.append(ChunkDraft(text, list(path), ordinal, a, b, tokens))
        return chunks


def _tokenize_pieces(text: str) -> list[tuple[int, int]]:
    """``text`` cut into spans of at most _TOKENIZE_PIECE_CHARS, each ending after the last
    whitespace in its second half when there is one."""
    pieces = []
    start = 0
    while start < len(text):
        end = start + _TOKENIZE_PIECE_CHARS
        if end < len(text):
            blank = max(text.rfind(c, start + _TOKENIZE_PIECE_CHARS // 2, end) for c in " \n\t")
            end = blank + 1 if blank >= 0 else end
        pieces.append((start, min(end, len(text))))
        start = end
    return pieces


def _chunk_text(prefix: str, body: str) -> str:
    return f"{prefix}{_PREFIX_SEPARATOR}{body}" if prefix else body


def _sections(markdown: str) -> list[_Section]:
    """Split at ATX headings outside fenced code blocks; paragraphs are runs of non-blank
    lines (a fenced block, blank lines and all, stays in one paragraph)."""
    sections = [_Section((), 0, 0, len(markdown))]
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
            sections[-1].paragraphs.append(_strip_span(markdown, paragraph_start, paragraph_end))
            paragraph_start = None
        if heading is not None:
            level, text = heading
            while stack and stack[-1][0] >= level:
                stack.pop()
            stack.append((level, text))
            sections[-1].end = pos
            sections.append(_Section(tuple(t for _, t in stack), pos, line_end, len(markdown)))
        elif not blank:
            if paragraph_start is None:
                paragraph_start = pos
            paragraph_end = line_end
            fence = _next_fence_state(fence, line)
        pos = line_end + 1
    if paragraph_start is not None:
        sections[-1].paragraphs.append(_strip_span(markdown, paragraph_start, paragraph_end))
    return sections


def _heading(line: str) -> tuple[int, str] | None:
    if len(line) > _MAX_HEADING_CHARS:
        return None
    found = _atx_heading(line)
    if found is None:
        return None
    level, raw = found
    text = _WHITESPACE_RE.sub(" ", raw).strip()
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


def _strip_span(text: str, start: int, end: int) -> tuple[int, int]:
    """``[start, end)`` without leading and trailing whitespace (str.isspace's)."""
    span = text[start:end]
    left = span.lstrip()
    start += len(span) - len(left)
    return start, start + len(left.rstrip())


def _sentence_starts(markdown: str, units: _Units, start: int, end: int, lo: int, hi: int) -> list[int]:
    """Unit indices in (lo, hi) at which a sentence or line begins, ascending."""
    found: list[int] = []
    for match in _SENTENCE_START_RE.finditer(markdown, start, end):
        k = bisect_left(units.starts, match.end(), lo, hi)
        if lo < k < hi and (not found or found[-1] != k):
            found.append(k)
    return found


def _cut_before(units: _Units, i: int, limit: int, hi: int, sentence_starts: list[int]) -> int:
    """Where window [i, ...) ends: at most ``limit``, not before its midpoint if avoidable."""
    floor = i + (limit - i) // 2
    s = bisect_right(sentence_starts, limit) - 1
    if s >= 0 and sentence_starts[s] > floor:
        return sentence_starts[s]
    for k in range(limit, floor, -1):
        if units.gap_before(k):
            return k
    for k in range(limit, floor, -1):
        if units.word_start(k) and units.starts[k] > units.starts[i]:
            return k
    # Several units can share a start offset (Hangul syllables decompose into jamo tokens):
    # never end a window before it has covered a character.
    k = limit
    while k < hi and units.starts[k] <= units.starts[i]:
        k += 1
    return k


def _next_window_start(units: _Units, i: int, j: int, overlap: int, sentence_starts: list[int]) -> int:
    """Where the window after [i, j) starts: ``overlap`` units back from j (at most half the
    window, so that windows shortened by the char cap still advance), moved forward to a
    sentence start or word start; never at or before i."""
    target = max(i + 1, j - min(overlap, (j - i) // 2))
    if overlap == 0 or target >= j:
        return j
    s = bisect_left(sentence_starts, target)
    if s < len(sentence_starts) and sentence_starts[s] < j:
        return _advancing(units, i, sentence_starts[s], j)
    for k in range(target, j):
        if units.gap_before(k):
            return _advancing(units, i, k, j)
    for k in range(target, j):
        if units.word_start(k):
            return _advancing(units, i, k, j)
    return _advancing(units, i, target, j)


def _advancing(units: _Units, i: int, k: int, j: int) -> int:
    # A start at the same char as the previous window's would repeat it: no overlap then.
    return k if units.starts[k] > units.starts[i] else j


def _window_piece(markdown: str, units: _Units, i: int, j: int, lo: int, start: int, end: int) -> _Piece:
    """Windows span from their first unit to the next window's first unit, so the chars
    between units (spaces, zero-width chars the tokenizer drops) are kept too."""
    a = start if i == lo else units.starts[i]
    b = end if j >= len(units.starts) or units.starts[j] >= end else units.starts[j]
    a, b = _strip_span(markdown, a, b)
    clean_start = i == lo or units.word_start(i)
    clean_end = j >= len(units.starts) or units.starts[j] >= end or units.word_start(j)
    return _Piece(a, b, j - i, clean_start and clean_end and not units.has_giants)


def _halve(markdown: str, start: int, end: int) -> list[tuple[int, int]]:
    """Split a span at the whitespace nearest its middle (or the middle itself)."""
    mid = (start + end) // 2
    candidates = [max(markdown.rfind(c, start + 1, mid + 1) for c in " \n\t")]
    after = _WHITESPACE_RE.search(markdown, mid, end - 1)
    if after is not None:
        candidates.append(after.start())
    inside = [c for c in candidates if start < c < end]
    cut = min(inside, key=lambda c: abs(c - mid)) if inside else max(start + 1, mid)
    halves = [_strip_span(markdown, start, cut), _strip_span(markdown, cut, end)]
    return [(a, b) for a, b in halves if a < b]
