"""The size bench's outputs: the JSON line of one size (every field it must have), the text
table, and docs/SCALE.md with its plots (matplotlib, optional: without it the plots are skipped
with a note)."""

from __future__ import annotations

import datetime
import json
import os
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.size_text import LACKS, METHOD
from ragmesh_cli.tables import format_table

# The fields every JSON line carries (tests/test_size_bench.py checks them; a comparison across
# changes reads them).
REQUIRED_FIELDS = (
    "chunks",
    "search_p50_ms_c1",
    "search_p99_ms_c1",
    "throughput_c8",
    "recall_at_10",
    "filtered_p50_ms",
    "index_rss_bytes_per_chunk",
    "sparse_rss_bytes_per_chunk",
    "index_disk_bytes_per_chunk",
    "sparse_disk_bytes_per_chunk",
    "checkpoint_bytes_ratio",
    "checkpoint_s",
    "restart_s",
    "fill_chunks_per_s",
    "fill_bound",
    "index_type",
    "index_params",
    "index_shards",
    "sparse_shards",
    "index_search_p50_ms",
)

DOC = Path("docs/SCALE.md")
PLOTS = Path("docs/scale")
# Hand-written sections (sizing formula, control plane, tiers) that the page carries over.
NOTES = Path("docs/scale/sizing.md")

# (field, column title) of the tables, in three groups.
LATENCY_COLUMNS = (
    ("chunks", "chunks"),
    ("search_p50_ms_c1", "gateway p50 c1 (ms)"),
    ("search_p99_ms_c1", "gateway p99 c1 (ms)"),
    ("throughput_c8", "gateway c8 (searches/s)"),
    ("gateway_dense_p50_ms_c1", "gateway dense-only p50 (ms)"),
    ("filtered_p50_ms", "gateway filtered p50 (ms)"),
    ("index_search_p50_ms", "index shard p50 (ms)"),
    ("recall_at_10", "recall@10 (shards)"),
    ("recall_at_10_filtered", "recall@10 filtered"),
    ("index_type", "index type"),
)
FOOTPRINT_COLUMNS = (
    ("chunks", "chunks"),
    ("index_rss_bytes_per_chunk", "index RSS B/chunk"),
    ("index_pss_bytes_per_chunk", "index PSS B/chunk"),
    ("sparse_rss_bytes_per_chunk", "sparse RSS B/chunk"),
    ("sparse_pss_bytes_per_chunk", "sparse PSS B/chunk"),
    ("index_disk_bytes_per_chunk", "index disk B/chunk"),
    ("sparse_disk_bytes_per_chunk", "sparse disk B/chunk"),
    ("log_disk_bytes_per_chunk", "NATS log disk B/chunk"),
    ("objectstore_disk_bytes_per_chunk", "S3 disk B/chunk"),
    ("index_peak_rss_mib", "index peak RSS MiB"),
    ("sparse_peak_rss_mib", "sparse peak RSS MiB"),
)
WRITE_COLUMNS = (
    ("chunks", "chunks"),
    ("fill_chunks_per_s", "fill chunks/s"),
    ("fill_bound", "fill bounded by"),
    ("checkpoint_changed_chunks", "changed chunks"),
    ("checkpoint_bytes", "checkpoint bytes"),
    ("checkpoint_bytes_ratio", "checkpoint / shard disk"),
    ("checkpoint_s", "checkpoint s"),
    ("restart_s", "restart s"),
)


def missing_fields(line: Mapping[str, Any]) -> list[str]:
    return [f for f in REQUIRED_FIELDS if f not in line]


def fill_bound(
    cores: Mapping[str, float], waits: Mapping[str, float], batches: int, cpu_count: int
) -> tuple[str, str]:
    """What bounded a fill, and why: the bench's own CPU when it kept a core busy (it generates,
    builds requests and waits, one Python thread), else the store whose calls the bench waited on
    longest (a batch waits for the slower of the index shards and sparse). The detail names the
    cores each part used and whether the machine's CPUs were all busy."""
    bench = cores.get("bench", 0.0)
    busy = sum(cores.values())
    index_wait, sparse_wait = waits.get("index", 0.0), waits.get("sparse", 0.0)
    if bench >= 0.85:
        bound = "bench"
    elif index_wait or sparse_wait:
        bound = "sparse" if sparse_wait >= index_wait else "index"
    else:
        bound = "unknown"
    used = ", ".join(f"{k} {v:.2f}" for k, v in sorted(cores.items(), key=lambda kv: -kv[1]) if v >= 0.005)
    per = {k: v / batches if batches else 0.0 for k, v in waits.items()}
    detail = (
        f"cores used: {used} (of {cpu_count}{', all busy' if busy >= 0.9 * cpu_count else ''}); "
        f"a batch's ReplaceDocuments took {per.get('index', 0.0):.2f} s on the index shards (slowest) "
        f"and {per.get('sparse', 0.0):.2f} s on sparse, on average"
    )
    return bound, detail


def _cell(value: Any) -> Any:
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:#.3g}" if value else "0"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return value


def text_table(lines: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    return format_table([t for _, t in columns], [[_cell(line.get(f)) for f, _ in columns] for line in lines])


def markdown_table(lines: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    head = "| " + " | ".join(t for _, t in columns) + " |"
    rule = "|" + "---|" * len(columns)
    rows = [
        "| " + " | ".join("" if (v := _cell(line.get(f))) is None else str(v) for f, _ in columns) + " |"
        for line in lines
    ]
    return "\n".join([head, rule, *rows])


def print_tables(lines: Sequence[Mapping[str, Any]]) -> None:
    for columns in (LATENCY_COLUMNS, FOOTPRINT_COLUMNS, WRITE_COLUMNS):
        print(text_table(lines, columns))
        print()
    for line in lines:
        print(f"{line['chunks']:,} chunks: fill bounded by {line['fill_bound']}: {line['fill_bound_detail']}")


def machine() -> dict[str, Any]:
    model = ""
    try:
        for row in Path("/proc/cpuinfo").read_text().splitlines():
            if row.startswith("model name"):
                model = row.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = 0
    try:
        for row in Path("/proc/meminfo").read_text().splitlines():
            if row.startswith("MemTotal:"):
                ram = int(row.split()[1]) * 1024
    except OSError:
        pass
    return {
        "cpus": os.cpu_count() or 0,
        "cpu_model": model or platform.processor() or "unknown",
        "ram_bytes": ram,
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def plot(lines: Sequence[Mapping[str, Any]], directory: Path) -> tuple[list[Path], str | None]:
    """The four plots against corpus size (log x); ([], why) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], "matplotlib is not installed (`make size-bench` installs the `scale` extra): plots skipped"
    directory.mkdir(parents=True, exist_ok=True)
    sizes = [line["chunks"] for line in lines]
    figures = (
        (
            "latency.png",
            "Search latency, concurrency 1",
            "ms",
            (
                ("search_p50_ms_c1", "gateway p50"),
                ("search_p99_ms_c1", "gateway p99"),
                ("filtered_p50_ms", "gateway filtered p50"),
                ("index_search_p50_ms", "index shard p50"),
                ("index_search_p99_ms", "index shard p99"),
            ),
        ),
        (
            "rss_per_chunk.png",
            "Resident memory per chunk (above the empty stack)",
            "bytes / chunk",
            (
                ("index_rss_bytes_per_chunk", "index RSS"),
                ("index_pss_bytes_per_chunk", "index PSS"),
                ("sparse_rss_bytes_per_chunk", "sparse RSS"),
                ("sparse_pss_bytes_per_chunk", "sparse PSS"),
            ),
        ),
        (
            "recall.png",
            "Dense recall@10 against exact search",
            "recall@10",
            (("recall_at_10", "index shards"), ("recall_at_10_filtered", "index shards, filtered")),
        ),
        (
            "checkpoint_ratio.png",
            "Checkpoint after 1,000 changed chunks: bytes written / shard bytes on disk",
            "ratio",
            (("checkpoint_bytes_ratio", "checkpoint ratio"),),
        ),
    )
    written = []
    for name, title, ylabel, series in figures:
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        for field, label in series:
            xs: list[float] = []
            ys: list[float] = []
            for size, line in zip(sizes, lines, strict=True):
                value = _num(line, field)
                if value is not None:
                    xs.append(float(size))
                    ys.append(value)
            if xs:
                ax.plot(xs, ys, marker="o", label=label)
        ax.set_xscale("log")
        ax.set_xlabel("chunks in the collection")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = directory / name
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written, None


def growth(lines: Sequence[Mapping[str, Any]], field: str) -> str | None:
    points = [
        (int(line["chunks"]), float(v))
        for line in lines
        if isinstance(v := line.get(field), int | float) and v
    ]
    if len(points) < 2:
        return None
    (c0, v0), (c1, v1) = points[0], points[-1]
    return f"{v1 / v0:.2f}x from {c0:,} to {c1:,} chunks ({c1 / c0:.0f}x the corpus)"


def _num(line: Mapping[str, Any], field: str) -> float | None:
    value = line.get(field)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def projection(last: Mapping[str, Any], target: int) -> list[str]:
    """What ``target`` chunks would take, from the per-chunk figures of the ``last`` size."""
    chunks = int(last["chunks"])
    more = target - chunks
    out: list[str] = []
    gib = 2**30
    for kind in ("index", "sparse"):
        rss, per = _num(last, f"{kind}_rss_bytes"), _num(last, f"{kind}_rss_bytes_per_chunk")
        peak = _num(last, f"{kind}_peak_rss_mib")
        if rss is not None and per is not None:
            total = rss + more * per
            text = f"{kind} RSS {total / gib:.1f} GiB"
            if peak and rss:
                factor = peak * 2**20 / rss
                text += (
                    f" (its peak was {factor:.1f}x its RSS at {chunks:,}: ~{total * factor / gib:.1f} GiB)"
                )
            out.append(text)
    disk = [
        (label, v * target)
        for field, label in (
            ("index_disk_bytes_per_chunk", "index"),
            ("sparse_disk_bytes_per_chunk", "sparse"),
            ("log_disk_bytes_per_chunk", "NATS log"),
            ("objectstore_disk_bytes_per_chunk", "S3"),
        )
        if (v := _num(last, field)) is not None
    ]
    if disk:
        out.append(
            f"disk {sum(b for _, b in disk) / gib:.0f} GiB ("
            + ", ".join(f"{label} {b / gib:.1f}" for label, b in disk)
            + ")"
        )
    ratio, index_disk = _num(last, "checkpoint_bytes_ratio"), _num(last, "index_disk_bytes_per_chunk")
    seconds = _num(last, "checkpoint_s")
    if ratio and index_disk:
        text = f"a checkpoint writes {ratio * index_disk * target / gib:.1f} GiB"
        if seconds:
            text += f" in ~{seconds * target / chunks:.0f} s"
        out.append(text)
    rate = _num(last, "fill_chunks_per_s")
    if rate:
        out.append(
            f"filling the {more:,} more chunks takes ~{more / rate / 60:.0f} min at {rate:,.0f} chunks/s"
        )
    return out


def reading(lines: Sequence[Mapping[str, Any]]) -> list[str]:
    """Plain statements the figures support (each only when its figures are there)."""
    out: list[str] = []
    if not lines:
        return out
    last = lines[-1]
    chunks = int(last["chunks"])
    ratios = [r for line in lines if (r := _num(line, "checkpoint_bytes_ratio")) is not None]
    if ratios:
        whole = min(ratios) >= 0.5
        out.append(
            "A checkpoint after ~1,000 changed chunks writes "
            + (
                f"{min(ratios):.2f}"
                if f"{min(ratios):.2f}" == f"{max(ratios):.2f}"
                else f"{min(ratios):.2f}-{max(ratios):.2f}"
            )
            + "x the shards' bytes on disk at every size"
            + (
                ": each shard rewrites its whole snapshot (and packs it again to upload it), so a "
                "checkpoint costs what the shard holds, not what changed."
                if whole
                else ", a share that falls as the shard grows: it writes what changed."
            )
        )
    rss, vector = _num(last, "index_rss_bytes_per_chunk"), 4 * 384
    if rss:
        out.append(
            f"At {chunks:,} chunks the index shards hold {rss:,.0f} bytes of RSS per chunk (smaller sizes "
            "include what the first writes allocate once), "
            f"{rss / vector:.1f}x the float32 vector itself ({vector:,} bytes; a shard also keeps each "
            "chunk's text, ~1.3 KB here, its ids and its document's metadata)."
        )
    recalls = [
        (line["chunks"], r, line.get("index_type")) for line in lines if (r := _num(line, "recall_at_10"))
    ]
    if recalls:
        low = min(recalls, key=lambda x: x[1])
        out.append(
            f"Dense recall@10 of the shards is at least {low[1]:.3f} (lowest at {low[0]:,} chunks, "
            f"index {low[2]}); exact (flat) shards score 1.0 by construction."
        )
    files, sparse_chunks = _num(last, "sparse_disk_files"), chunks
    if files and sparse_chunks and files / sparse_chunks >= 0.5:
        out.append(
            f"The sparse store keeps {files / sparse_chunks:.2f} files per chunk on disk (a text file per "
            "chunk for the ripgrep exact mode, beside the tantivy index), so its disk bytes per chunk "
            "are at least a filesystem block's."
        )
    elif files and sparse_chunks:
        out.append(
            f"The sparse shards keep {int(files):,} files in all at {sparse_chunks:,} chunks (tantivy "
            "segments and their state; the phrase exact mode writes no file per chunk)."
        )
    bounds = {str(line.get("fill_bound")) for line in lines}
    if bounds:
        out.append(f"The fill was bounded by {', '.join(sorted(bounds))} (details per size above).")
    return out


def write_doc(
    lines: Sequence[Mapping[str, Any]],
    meta: Mapping[str, Any],
    doc: Path = DOC,
    plots: Path = PLOTS,
) -> list[str]:
    """(Re)write docs/SCALE.md and its plots; returns notes (plots skipped...)."""
    notes: list[str] = []
    images, why = plot(lines, plots)
    if why:
        notes.append(why)
    host = meta["machine"]
    date = meta.get("date") or datetime.date.today().isoformat()
    parts = [
        "# Cost against corpus size",
        "",
        "Every figure elsewhere in the docs comes from one corpus of ~10,880 chunks. This page measures "
        "what a search, a chunk's memory and disk, a checkpoint and a restart cost as the collection "
        "grows, on a synthetic corpus (`bench/size_bench.py`). Regenerate it with the command below "
        "(`--write-doc` rewrites this page and `docs/scale/*.png`).",
        "",
        "```bash",
        meta["command"],
        "```",
        "",
        f"Run {date} on {host['cpus']} CPU cores ({host['cpu_model']}), "
        f"{host['ram_bytes'] / 2**30:.0f} GiB RAM, Python {host['python']}, Linux {host['kernel']}; "
        f"load average {meta.get('loadavg_start')} at the start, {meta.get('loadavg_end')} at the end "
        f"(a machine shared with other work); {meta['index_shards']} index shards, "
        f"{meta['sparse_shards']} sparse shard(s), `{meta['vectors']}` vectors, seed {meta['seed']}, "
        f"{meta['wall_s'] / 60:.0f} minutes in all; code: {meta.get('revision', 'unknown')}.",
        "",
    ]
    if meta.get("stopped"):
        parts += [f"**Stopped early**: {meta['stopped']}", ""]
        for target in [t for t in meta.get("sizes", []) if lines and t > lines[-1]["chunks"]]:
            guesses = projection(lines[-1], int(target))
            if guesses:
                parts += [
                    f"Projected at {int(target):,} chunks, linearly in the chunks from the "
                    f"{int(lines[-1]['chunks']):,}-chunk figures (not measured):",
                    "",
                    *[f"- {g}" for g in guesses],
                    "",
                ]
    parts += [
        "## Search and recall",
        "",
        markdown_table(lines, LATENCY_COLUMNS),
        "",
        "## Memory and disk per chunk",
        "",
        markdown_table(lines, FOOTPRINT_COLUMNS),
        "",
        "## Fill, checkpoint, restart",
        "",
        markdown_table(lines, WRITE_COLUMNS),
        "",
    ]
    parts += [f"- {line['chunks']:,} chunks: {line['fill_bound_detail']}" for line in lines]
    parts.append("")
    summary = [
        (label, growth(lines, field))
        for field, label in (
            ("search_p50_ms_c1", "gateway search p50"),
            ("index_search_p50_ms", "index shard search p50"),
            ("filtered_p50_ms", "filtered gateway search p50"),
            ("throughput_c8", "gateway throughput at concurrency 8"),
            ("checkpoint_s", "checkpoint time"),
            ("restart_s", "restart time"),
        )
    ]
    if any(g for _, g in summary):
        parts += ["Growth:", ""]
        parts += [f"- {label}: {g}" for label, g in summary if g]
        parts.append("")
    read = reading(lines)
    if read:
        parts += ["## Reading it", ""]
        parts += [f"- {statement}" for statement in read]
        parts.append("")
    index_lines = [
        f"- {line['chunks']:,} chunks: "
        + "; ".join(
            f"shard {s.get('shard', i)}: {s.get('indexType', '?')}, {int(s.get('chunks', 0)):,} chunks"
            for i, s in enumerate(line.get("index_shard_stats", []))
        )
        for line in lines
    ]
    parts += ["Index per shard (GetStats):", "", *index_lines, ""]
    if lines:
        configured = json.dumps(lines[-1]["index_params"].get("configured", {}), sort_keys=True)
        parts += [f"Index settings (`RAGMESH_INDEX_*` as the shards read them): `{configured}`", ""]
    if images:
        parts += ["## Plots", ""]
        parts += [f"![{p.stem}](scale/{p.name})" for p in images]
        parts.append("")
    else:
        parts += [f"_{n}_" for n in notes] + [""]
    parts.append(
        METHOD.format(
            index_shards=meta["index_shards"],
            sparse_shards=meta["sparse_shards"],
            clusters=meta["clusters"],
            queries=meta["queries"],
            throughput_calls=meta["throughput_calls"],
            changed=meta["changed_chunks"],
        )
    )
    if NOTES.exists():
        parts.append(NOTES.read_text())
    parts.append(LACKS)
    parts += [
        "## Raw lines",
        "",
        "One JSON line per size, as `--json` prints them:",
        "",
        "```json",
        *(json.dumps(line, sort_keys=True) for line in lines),
        "```",
        "",
    ]
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text("\n".join(parts))
    return notes
