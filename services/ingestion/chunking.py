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

The Markdown sections come from services/ingestion/markdown_sections.py, the token units and
the windows of an oversized paragraph from services/ingestion/token_windows.py.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass

from tokenizers import Tokenizer

from meshkit.settings import IngestionSettings
from services.ingestion.markdown_sections import WHITESPACE_RE, Section, split_sections
from services.ingestion.token_windows import (
    MAX_UNIT_CHARS,
    TOKENIZE_PIECE_CHARS,
    Piece,
    Units,
    cut_before,
    find_sentence_starts,
    halve,
    next_window_start,
    tokenize_pieces,
    window_piece,
)

# Headroom under the model limit for trusting a computed count without re-encoding: covers
# tokenizers whose output at a span's edges differs slightly from inside the section.
_TRUST_MARGIN_TOKENS = 8
_PATH_SEPARATOR = " > "
_PREFIX_SEPARATOR = "\n\n"


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
class _Span:
    """A chunk in the making: its heading path, prefix and body span."""

    path: tuple[str, ...]
    prefix: str
    prefix_tokens: int
    start: int
    end: int
    body_tokens: int
    exact: bool


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
        self.max_chunk_chars = max_chunk_chars or max(chunk_tokens * 12, 4 * MAX_UNIT_CHARS)
        if self.max_chunk_chars < 4 * MAX_UNIT_CHARS:
            raise ValueError(f"max_chunk_chars must be at least {4 * MAX_UNIT_CHARS}")
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
        title = WHITESPACE_RE.sub(" ", title).strip()
        prefixes: dict[tuple[str, ...], tuple[str, int]] = {}
        spans: list[_Span] = []
        pending: _Span | None = None  # a one-chunk section that later small sections may join
        for section in split_sections(markdown):
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

    def _merged(self, markdown: str, pending: _Span, piece: Piece) -> bool:
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

    def _units(self, markdown: str, section: Section) -> Units:
        text = markdown[section.start : section.end]
        if len(text) <= TOKENIZE_PIECE_CHARS:
            encoding = self._tokenizer.encode(text, add_special_tokens=False)
            return Units(encoding.offsets, encoding.tokens, section.start)
        # One encode of a huge section costs the tokenizer more than linear time (a 16 MB line:
        # 23 s; in 64k pieces: 5 s). Pieces end at whitespace, where the tokenizer starts a new
        # word anyway; the counts are still only trusted after the chunks are re-encoded.
        pieces = tokenize_pieces(text)
        encodings = self._tokenizer.encode_batch([text[a:b] for a, b in pieces], add_special_tokens=False)
        offsets = [(a + x, a + y) for (a, _b), e in zip(pieces, encodings, strict=True) for x, y in e.offsets]
        tokens = [token for e in encodings for token in e.tokens]
        return Units(offsets, tokens, section.start, estimated=True)

    def _pack(self, markdown: str, section: Section, units: Units, budget: int) -> list[Piece]:
        """Consecutive paragraphs packed up to the budget; oversized ones cut into windows."""
        pieces: list[Piece] = []
        current: Piece | None = None
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
                current = Piece(current.start, end, current.tokens + tokens, current.exact)
            else:
                if current is not None:
                    pieces.append(current)
                current = Piece(start, end, tokens, not units.has_giants)
        if current is not None:
            pieces.append(current)
        return pieces

    def _windows(self, markdown: str, units: Units, start: int, end: int, budget: int) -> list[Piece]:
        """Cut one paragraph into windows of at most ``budget`` units, consecutive windows
        sharing up to ``overlap_tokens`` units; cuts fall on sentence starts when one lies in
        the window's second half, else between words, else anywhere."""
        lo = bisect_left(units.starts, start)
        hi = bisect_left(units.starts, end)
        if lo == hi:  # nothing the tokenizer sees (zero-width chars): size is no concern
            return [Piece(start, end, 0, True)]
        sentence_starts = find_sentence_starts(markdown, units, start, end, lo, hi)
        overlap = min(self.overlap_tokens, budget // 2)
        windows: list[Piece] = []
        i = lo
        while True:
            limit = self._window_limit(units, i, hi, budget)
            if limit >= hi:
                windows.append(window_piece(markdown, units, i, hi, lo, start, end))
                return windows
            j = cut_before(units, i, limit, hi, sentence_starts)
            windows.append(window_piece(markdown, units, i, j, lo, start, end))
            if j >= hi:
                return windows
            i = next_window_start(units, i, j, overlap, sentence_starts)

    def _window_limit(self, units: Units, i: int, hi: int, budget: int) -> int:
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
                    retry.extend((path, prefix, x, y) for x, y in halve(markdown, a, b))
            todo = retry
        finished.sort(key=lambda item: (item[2], item[3]))
        chunks = []
        for ordinal, (path, prefix, a, b, tokens) in enumerate(finished):
            text = _chunk_text(prefix, markdown[a:b])
            assert tokens + self._special_tokens <= self.model_max_tokens, "chunk over the model limit"
            chunks.append(ChunkDraft(text, list(path), ordinal, a, b, tokens))
        return chunks


def _chunk_text(prefix: str, body: str) -> str:
    return f"{prefix}{_PREFIX_SEPARATOR}{body}" if prefix else body
