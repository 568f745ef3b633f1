"""The control plane's cost against document count: the ingestion API's status index
(``services.ingestion.lifecycle.index.StatusIndex``) driven directly, no stack.

    .venv/bin/python -m bench.control_plane_bench --sizes 10000,100000,1000000 [--json]
    .venv/bin/python -m bench.control_plane_bench --quick        # 1000,10000, fewer repetitions

For each size N: an index in a temporary directory is filled with N synthetic document rows of
one collection (batches of ``follow.BATCH`` rows, one transaction each, with the applied
sequence, as the status bucket's follower writes them; doc ids in hashed order, so inserts land
all over the key; a folder per ~1000 documents), then measured:

- fill: rows per second, and the file's bytes per document once closed;
- count: one collection count (``counts``), first call and the median of repeated calls;
- pages: p50/p99 of a 100-row page of ``documents`` at the start, middle and end of the
  collection (keyset: after the doc id at that rank);
- folders: the first 100-row page of one folder's documents (the folder in the middle of the
  collection's source order) in source order (``documents_by_source``, a range of the source
  index) and in doc id order (``documents`` with a source prefix, a scan of the primary key
  filtered by prefix), median of a few calls;
- removal: one ``Removal`` applied (a delete by status key);
- the process's RSS before the index is opened and after the measurements, and the time to
  reopen the file and answer a first count.

Progress lines go to stderr; the table to stdout after every size, and with ``--json`` one JSON
object per size on its own line before it.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from meshkit.domain.ids import doc_key
from services.ingestion.lifecycle.follow import BATCH
from services.ingestion.lifecycle.index import INDEX_FILE, Removal, StatusIndex
from services.ingestion.lifecycle.machine import DELETED, FAILED, INDEXED, QUEUED
from services.ingestion.lifecycle.rows import Row

COLLECTION = "bench"
PAGE = 100
DOCS_PER_FOLDER = 1000
DEFAULT_SIZES = (10_000, 100_000, 1_000_000)
QUICK_SIZES = (1_000, 10_000)
# An odd multiplier: i -> i * MIX mod 2**64 is a permutation, so doc ids are unique and their
# order is unrelated to the insertion order.
MIX = 0x9E3779B97F4A7C15


@dataclass
class Result:
    docs: int
    fill_s: float
    fill_rows_per_s: float
    file_bytes: int
    bytes_per_doc: float
    count_first_ms: float
    count_ms: float
    page_start_p50_ms: float
    page_start_p99_ms: float
    page_middle_p50_ms: float
    page_middle_p99_ms: float
    page_end_p50_ms: float
    page_end_p99_ms: float
    folder_by_source_ms: float
    folder_by_doc_id_ms: float
    removal_ms: float
    rss_before_mib: float
    rss_after_mib: float
    max_rss_mib: float
    reopen_ms: float


def doc_id(i: int) -> str:
    return f"doc-{(i * MIX) % (1 << 64):016x}"


def folder(i: int, folders: int) -> str:
    return f"vault/folder-{i % folders:05d}/"


def synthetic_row(i: int, folders: int) -> Row:
    """Document i: mostly indexed, some queued, failed and deleted."""
    kind = i % 100
    state = QUEUED if kind < 5 else FAILED if kind < 8 else DELETED if kind < 10 else INDEXED
    name = doc_id(i)
    digest = f"{(i * MIX * 3) % (1 << 64):016x}" * 4
    return Row(
        collection=COLLECTION,
        doc_id=name,
        key=doc_key(COLLECTION, name),
        revision=i + 1,
        state=state,
        chunks=i % 40 if state == INDEXED else 0,
        source_uri=f"{folder(i, folders)}note-{i:08d}.md",
        op="upsert",
        target_sha256=digest,
        indexed_sha256=digest if state == INDEXED else "",
        indexed_version=1,
        source_digest=digest[:32],
    )


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def max_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    at = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[at]


def timed_ms(call: Callable[[], object], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return times


def fill(index: StatusIndex, docs: int, folders: int) -> float:
    started = time.perf_counter()
    step = max(1, docs // 10)
    next_report = step
    for first in range(0, docs, BATCH):
        last = min(docs, first + BATCH)
        index.apply([synthetic_row(i, folders) for i in range(first, last)], applied_sequence=last)
        if last >= next_report or last == docs:
            elapsed = time.perf_counter() - started
            print(
                f"  filled {last:>10,} of {docs:,} ({100 * last // docs:3d}%) in {elapsed:6.1f} s",
                file=sys.stderr,
                flush=True,
            )
            while next_report <= last:
                next_report += step
    return time.perf_counter() - started


def doc_id_at(index: StatusIndex, rank: int) -> str:
    """The doc id at ``rank`` in doc id order ('' before the first): where a keyset page starts."""
    if rank <= 0:
        return ""
    found = index.db.execute(
        "SELECT doc_id FROM docs WHERE collection = ? ORDER BY doc_id LIMIT 1 OFFSET ?",
        (COLLECTION, rank - 1),
    ).fetchone()
    return str(found[0]) if found else ""


def file_bytes(directory: Path) -> int:
    return sum(
        path.stat().st_size
        for path in (directory / f"{INDEX_FILE}{suffix}" for suffix in ("", "-wal", "-shm"))
        if path.exists()
    )


def measure(docs: int, repeat: int, base: Path) -> Result:
    folders = max(1, docs // DOCS_PER_FOLDER)
    directory = base / f"index-{docs}"
    print(f"size {docs:,}: {folders:,} folders, in {directory}", file=sys.stderr, flush=True)
    rss_before = rss_mib()
    index = StatusIndex(directory)
    index.reset("bench")
    fill_s = fill(index, docs, folders)

    count_first = timed_ms(lambda: index.counts(COLLECTION), 1)[0]
    counts = index.counts(COLLECTION)
    assert counts is not None and sum(counts.by_state.values()) == docs, counts
    count_ms = percentile(timed_ms(lambda: index.counts(COLLECTION), repeat), 50)

    pages: dict[str, list[float]] = {}
    for name, rank in (("start", 0), ("middle", docs // 2), ("end", max(0, docs - PAGE - PAGE // 2))):
        after = doc_id_at(index, rank)

        def page(after: str = after) -> None:
            rows, _more = index.documents(COLLECTION, "", after, PAGE)
            assert rows, "an empty page"

        pages[name] = timed_ms(page, repeat)

    prefix = folder(folders // 2, folders)

    def by_source() -> None:
        rows, _more = index.documents_by_source(COLLECTION, prefix, "", "", PAGE)
        assert rows and all(r.source_uri.startswith(prefix) for r in rows)

    def by_doc_id() -> None:
        rows, _more = index.documents(COLLECTION, prefix, "", PAGE)
        assert rows and all(r.source_uri.startswith(prefix) for r in rows)

    # Fewer calls: these may scan far more than their page.
    folder_repeat = max(3, repeat // 20)
    folder_by_source = percentile(timed_ms(by_source, folder_repeat), 50)
    folder_by_doc_id = percentile(timed_ms(by_doc_id, folder_repeat), 50)

    removals = [synthetic_row(i, folders) for i in range(10, 10 + max(3, repeat // 40))]
    removal_times = []
    for n, row in enumerate(removals):
        started = time.perf_counter()
        index.apply([Removal(row.key, docs + 1 + n)])
        removal_times.append((time.perf_counter() - started) * 1000)
    rss_after = rss_mib()
    index.close()
    size = file_bytes(directory)

    started = time.perf_counter()
    reopened = StatusIndex(directory)
    assert reopened.counts(COLLECTION) is not None
    reopen_ms = (time.perf_counter() - started) * 1000
    assert reopened.applied_sequence == docs
    reopened.close()
    for path in directory.iterdir():
        path.unlink()
    directory.rmdir()

    return Result(
        docs=docs,
        fill_s=round(fill_s, 2),
        fill_rows_per_s=round(docs / fill_s),
        file_bytes=size,
        bytes_per_doc=round(size / docs, 1),
        count_first_ms=round(count_first, 3),
        count_ms=round(count_ms, 3),
        page_start_p50_ms=round(percentile(pages["start"], 50), 3),
        page_start_p99_ms=round(percentile(pages["start"], 99), 3),
        page_middle_p50_ms=round(percentile(pages["middle"], 50), 3),
        page_middle_p99_ms=round(percentile(pages["middle"], 99), 3),
        page_end_p50_ms=round(percentile(pages["end"], 50), 3),
        page_end_p99_ms=round(percentile(pages["end"], 99), 3),
        folder_by_source_ms=round(folder_by_source, 3),
        folder_by_doc_id_ms=round(folder_by_doc_id, 3),
        removal_ms=round(percentile(removal_times, 50), 3),
        rss_before_mib=round(rss_before, 1),
        rss_after_mib=round(rss_after, 1),
        max_rss_mib=round(max_rss_mib(), 1),
        reopen_ms=round(reopen_ms, 2),
    )


COLUMNS: tuple[tuple[str, str, Callable[[Result], Any]], ...] = (
    ("docs", "{:>10,}", lambda r: r.docs),
    ("fill rows/s", "{:>11,}", lambda r: r.fill_rows_per_s),
    ("B/doc", "{:>6.0f}", lambda r: r.bytes_per_doc),
    ("count ms", "{:>8.3f}", lambda r: r.count_ms),
    ("start p50/p99", "{:>13}", lambda r: f"{r.page_start_p50_ms:.2f}/{r.page_start_p99_ms:.2f}"),
    ("mid p50/p99", "{:>13}", lambda r: f"{r.page_middle_p50_ms:.2f}/{r.page_middle_p99_ms:.2f}"),
    ("end p50/p99", "{:>13}", lambda r: f"{r.page_end_p50_ms:.2f}/{r.page_end_p99_ms:.2f}"),
    ("folder src ms", "{:>13.3f}", lambda r: r.folder_by_source_ms),
    ("folder id ms", "{:>12.2f}", lambda r: r.folder_by_doc_id_ms),
    ("removal ms", "{:>10.2f}", lambda r: r.removal_ms),
    ("RSS MiB before/after", "{:>20}", lambda r: f"{r.rss_before_mib:.0f}/{r.rss_after_mib:.0f}"),
    ("reopen ms", "{:>9.1f}", lambda r: r.reopen_ms),
)


def table(results: list[Result]) -> str:
    header = "  ".join(f"{name:>{len(fmt.format(get(results[0])))}}" for name, fmt, get in COLUMNS)
    lines = [header, "-" * len(header)]
    lines += ["  ".join(fmt.format(get(r)) for _name, fmt, get in COLUMNS) for r in results]
    return "\n".join(lines)


def parse_sizes(text: str) -> list[int]:
    sizes = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    if not sizes or any(n <= 0 for n in sizes):
        raise argparse.ArgumentTypeError("sizes are positive integers, comma separated")
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--sizes", type=parse_sizes, default=None, help="document counts, e.g. 10000,100000")
    parser.add_argument("--quick", action="store_true", help=f"sizes {QUICK_SIZES}, fewer repetitions")
    parser.add_argument("--repeat", type=int, default=None, help="calls per timed measurement")
    parser.add_argument("--json", action="store_true", help="one JSON line per size")
    parser.add_argument("--dir", type=Path, default=None, help="where the indexes go (a temp dir)")
    args = parser.parse_args(argv)
    sizes: list[int] = args.sizes or list(QUICK_SIZES if args.quick else DEFAULT_SIZES)
    repeat: int = args.repeat or (40 if args.quick else 200)

    results = []
    with tempfile.TemporaryDirectory(prefix="control-plane-bench-", dir=args.dir) as base:
        for docs in sizes:
            result = measure(docs, repeat, Path(base))
            results.append(result)
            if args.json:
                print(json.dumps(asdict(result), separators=(",", ":")), flush=True)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
