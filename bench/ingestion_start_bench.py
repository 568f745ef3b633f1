"""The ingestion API with a million documents recorded, end to end: its start, its memory, a
status page and the sync of an unchanged folder, against the real NATS server and object store.

    .venv/bin/python -m bench.ingestion_start_bench --docs 1000000 --folders 10000,100000 [--json]
    .venv/bin/python -m bench.ingestion_start_bench --quick          # 20,000 docs, folders 1000,5000

``bench.control_plane_bench`` drives the status index alone; this one starts a stack (NATS,
SeaweedFS, the ingestion API; no workers, so nothing is embedded) and:

1. writes the folders (``--folders``: one folder of that many small text files each) and submits
   one file through ``ragmesh ingest``, whose status entry is the template of every other;
2. records ``--docs`` documents in the status bucket straight over NATS (the folders' files,
   each as indexed with its file's bytes and ``file://`` source, then synthetic documents up to
   the count), with the API stopped;
3. starts the API with no status index (it rebuilds the index from the bucket: the first start
   after an upgrade or a lost volume), then restarts it with its index: the time until it is
   healthy, until it answers ``ListDocuments`` (it says UNAVAILABLE while its index catches up),
   and its RSS;
4. times 100-document pages of ``ListDocuments`` at the start, middle and end of the collection,
   a folder's first page in source order and ``GetCollectionStatus``;
5. runs ``ragmesh ingest FOLDER --sync`` on each unchanged folder (every file read, hashed and
   submitted; the API answers "unchanged" for each; the folder listed by its source prefix)
   and reports its time per file.

Progress goes to stderr; a table (and with ``--json`` one JSON object first) to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import nats
from grpc import aio

from bench.size_procs import name_pids, usage_of
from meshkit.domain.ids import doc_key
from ragmesh.ingestion.v1 import ingestion_pb2, ingestion_pb2_grpc
from ragmesh_cli.stack import Stack
from services.ingestion.lifecycle.buckets import STATUS_BUCKET
from services.ingestion.lifecycle.index import INDEX_FILE
from services.ingestion.lifecycle.machine import INDEXED
from services.ingestion.lifecycle.requests import PREPARATION_VERSION

COLLECTION = "startbench"
SERVICES = ("ingestion",)  # NATS and the object store always run
PAGE = 100
PUBLISH_IN_FLIGHT = 512
PROGRESS_EVERY_S = 10.0
READY_TIMEOUT_S = 900.0


def folder_file(root: Path, i: int) -> tuple[Path, bytes]:
    """The i-th file of a bench folder and its bytes (distinct per file: distinct hashes). Doc
    ids are relative to the folder synced, so each folder's start with its own name."""
    path = root / root.name / f"part-{i // 1000:04d}" / f"note-{i:07d}.txt"
    return path, f"Note {i} of {root.name}.\n".encode()


def write_folder(root: Path, files: int) -> None:
    for i in range(files):
        path, content = folder_file(root, i)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)


def indexed_entry(template: dict[str, Any], doc_id: str, content: bytes, source_uri: str) -> dict[str, Any]:
    """A status entry for ``doc_id`` as the template document's, indexed with ``content``'s hash:
    what a worker leaves once the document is in both stores."""
    digest = hashlib.sha256(content).hexdigest()
    request = dict(template["request"])
    request.update(
        doc_id=doc_id,
        content_sha256=digest,
        source_uri=source_uri,
        object_key=f"{COLLECTION}/{hashlib.sha256(doc_id.encode()).hexdigest()[:16]}/{digest}",
        request_id=f"bench-{hashlib.sha256(doc_id.encode()).hexdigest()[:12]}",
    )
    entry = dict(template)
    entry.update(
        doc_id=doc_id,
        state=INDEXED,
        request=request,
        target_sha256=digest,
        indexed_sha256=digest,
        indexed_version=PREPARATION_VERSION,
        chunks=1,
        owner="",
        lease_until=0.0,
        reason="",
    )
    return entry


def entries(
    template: dict[str, Any], folders: Sequence[Path], counts: Sequence[int], total: int
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(doc_id, entry) of every document to record: the folders' files, then synthetic ones."""
    n = 0
    for root, count in zip(folders, counts, strict=True):
        for i in range(count):
            path, content = folder_file(root, i)
            doc_id = path.relative_to(root).as_posix()
            yield doc_id, indexed_entry(template, doc_id, content, path.absolute().as_uri())
            n += 1
    for i in range(n, total):
        doc_id = f"synthetic/{i // 1000:04d}/doc-{i:07d}.md"
        yield (
            doc_id,
            indexed_entry(template, doc_id, f"synthetic {i}".encode(), f"https://example.com/{doc_id}"),
        )


async def record(stack: Stack, items: Iterable[tuple[str, dict[str, Any]]], total: int) -> float:
    """Publish every entry to the status bucket; the rate in entries per second."""
    nc = await nats.connect(f"nats://{stack.address('nats')}")
    js = nc.jetstream()
    started = last = time.perf_counter()
    done = 0
    pending: set[asyncio.Future[Any]] = set()
    try:
        for doc_id, entry in items:
            subject = f"$KV.{STATUS_BUCKET}.{doc_key(COLLECTION, doc_id)}"
            data = json.dumps(entry, separators=(",", ":")).encode()
            pending.add(asyncio.ensure_future(js.publish(subject, data)))
            if len(pending) >= PUBLISH_IN_FLIGHT:
                finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for f in finished:
                    f.result()
                done += len(finished)
            if time.perf_counter() - last > PROGRESS_EVERY_S:
                last = time.perf_counter()
                rate = done / (last - started)
                print(f"recorded {done:,}/{total:,} statuses, {rate:,.0f}/s", file=sys.stderr, flush=True)
        for f in asyncio.as_completed(pending):
            await f
    finally:
        await nc.close()
    return total / (time.perf_counter() - started)


async def _until_ready(stub: ingestion_pb2_grpc.IngestionServiceStub) -> None:
    request = ingestion_pb2.ListDocumentsRequest(collection=COLLECTION, limit=1)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            await stub.ListDocuments(request, timeout=10)
            return
        except aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.2)


async def start_api(stack: Stack, channel: aio.Channel) -> dict[str, float]:
    """Start the stopped API: seconds until healthy, until it answers from its index; its RSS."""
    started = time.perf_counter()
    await stack.start_async("ingestion")
    healthy = time.perf_counter() - started
    await _until_ready(ingestion_pb2_grpc.IngestionServiceStub(channel))
    ready = time.perf_counter() - started
    usage = usage_of(name_pids(stack, "ingestion"))
    return {
        "healthy_s": round(healthy, 2),
        "ready_s": round(ready, 2),
        "rss_mib": round(usage.rss_bytes / 2**20, 1),
        "peak_rss_mib": round(usage.peak_rss_bytes / 2**20, 1),
    }


async def _median_ms(call: Callable[[], Awaitable[Any]], times: int = 15) -> float:
    laps = []
    for _ in range(times):
        t = time.perf_counter()
        await call()
        laps.append(time.perf_counter() - t)
    return round(sorted(laps)[len(laps) // 2] * 1000, 2)


async def pages(channel: aio.Channel, total: int, folder_uri: str) -> dict[str, float]:
    stub = ingestion_pb2_grpc.IngestionServiceStub(channel)

    def page_after(after: str) -> Callable[[], Awaitable[Any]]:
        request = ingestion_pb2.ListDocumentsRequest(collection=COLLECTION, limit=PAGE, after_doc_id=after)
        return lambda: stub.ListDocuments(request, timeout=30)

    # Doc ids sort as "folder-..." (folders) < "synthetic/...": the middle and end are synthetic.
    middle = f"synthetic/{total // 2 // 1000:04d}/doc-{total // 2:07d}.md"
    end = f"synthetic/{(total - 150) // 1000:04d}/doc-{total - 150:07d}.md"
    by_source = ingestion_pb2.ListDocumentsRequest(
        collection=COLLECTION,
        limit=PAGE,
        by_source_uri=True,
        source_uri_prefix=folder_uri + "/",
    )
    status = ingestion_pb2.GetCollectionStatusRequest(collection=COLLECTION)
    return {
        "page_start_ms": await _median_ms(page_after("")),
        "page_middle_ms": await _median_ms(page_after(middle)),
        "page_end_ms": await _median_ms(page_after(end)),
        "folder_page_ms": await _median_ms(lambda: stub.ListDocuments(by_source, timeout=30)),
        "collection_status_ms": await _median_ms(lambda: stub.GetCollectionStatus(status, timeout=30)),
    }


def ragmesh_ingest(stack: Stack, *args: str) -> tuple[float, str]:
    """Run the CLI against the stack; its seconds and its output (raises on a non-zero exit)."""
    command = [sys.executable, "-m", "ragmesh_cli.main", "ingest", "--state-dir", str(stack.state_dir)]
    started = time.perf_counter()
    done = subprocess.run(
        [*command, "--collection", COLLECTION, *args], capture_output=True, text=True, check=False
    )
    elapsed = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(f"ragmesh ingest {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return elapsed, done.stdout + done.stderr


def unchanged_summary(output: str) -> str:
    """The CLI's "N queued, M unchanged, K rejected" line: every file of the folder must be
    unchanged, or the bench measured a submission instead of a sync."""
    return next((line.strip() for line in output.splitlines() if " unchanged, " in line), "")


async def template_entry(stack: Stack, scratch: Path) -> dict[str, Any]:
    """The status entry the API writes for a submitted text file (the other entries' shape)."""
    sample = scratch / "template" / "sample.txt"
    sample.parent.mkdir(parents=True)
    sample.write_bytes(b"A template document.\n")
    ragmesh_ingest(stack, str(sample.parent))
    nc = await nats.connect(f"nats://{stack.address('nats')}")
    try:
        kv = await nc.jetstream().key_value(STATUS_BUCKET)
        entry = await kv.get(doc_key(COLLECTION, "sample.txt"))
        assert entry.value is not None
        await kv.delete(doc_key(COLLECTION, "sample.txt"))
        template: dict[str, Any] = json.loads(entry.value)
        return template
    finally:
        await nc.close()


async def run(args: argparse.Namespace, stack: Stack, scratch: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"docs": args.docs, "folders": list(args.folders)}
    template = await template_entry(stack, scratch)
    roots = [scratch / f"folder-{n}" for n in args.folders]
    for root, n in zip(roots, args.folders, strict=True):
        write_folder(root, n)
    stack.stop("ingestion")
    print(f"recording {args.docs:,} statuses", file=sys.stderr, flush=True)
    out["record_per_s"] = round(
        await record(stack, entries(template, roots, args.folders, args.docs), args.docs)
    )
    # No status index: the API rebuilds it from the bucket (as after an upgrade or a lost disk).
    for index_file in stack.state_dir.rglob(f"{INDEX_FILE}*"):  # with its -wal and -shm
        index_file.unlink()
    channel = aio.insecure_channel(stack.address("ingestion"))
    try:
        print("starting the API without a status index (a rebuild)", file=sys.stderr, flush=True)
        out["rebuild"] = await start_api(stack, channel)
        stack.stop("ingestion")
        print("restarting the API with its index", file=sys.stderr, flush=True)
        out["restart"] = await start_api(stack, channel)
        out.update(await pages(channel, args.docs, roots[-1].absolute().as_uri()))
    finally:
        await channel.close(None)
    out["sync"] = []
    for root, n in zip(roots, args.folders, strict=True):
        print(f"ragmesh ingest --sync on an unchanged folder of {n:,} files", file=sys.stderr, flush=True)
        seconds, output = await asyncio.to_thread(ragmesh_ingest, stack, str(root), "--sync")
        out["sync"].append(
            {
                "files": n,
                "s": round(seconds, 2),
                "ms_per_file": round(seconds * 1000 / n, 3),
                "summary": unchanged_summary(output),
            }
        )
    return out


def table(out: dict[str, Any]) -> str:
    lines = [
        f"ingestion API with {out['docs']:,} documents recorded "
        f"(statuses recorded at {out['record_per_s']:,}/s)",
        "| start | healthy s | answers s | RSS MiB | peak RSS MiB |",
        "|---|---|---|---|---|",
    ]
    for name in ("rebuild", "restart"):
        r = out[name]
        lines.append(f"| {name} | {r['healthy_s']} | {r['ready_s']} | {r['rss_mib']} | {r['peak_rss_mib']} |")
    lines += [
        "",
        f"ListDocuments page of {PAGE}: start {out['page_start_ms']} ms, middle {out['page_middle_ms']} ms, "
        f"end {out['page_end_ms']} ms; a folder's first page by source {out['folder_page_ms']} ms; "
        f"GetCollectionStatus {out['collection_status_ms']} ms",
        "",
        "| unchanged folder | ragmesh ingest --sync s | ms per file | the CLI's summary |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {s['files']:,} files | {s['s']} | {s['ms_per_file']} | {s['summary']} |" for s in out["sync"]
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=1_000_000, help="documents recorded in all")
    parser.add_argument("--folders", default="10000,100000", help="file counts of the folders synced")
    parser.add_argument("--quick", action="store_true", help="20,000 documents, folders of 1,000 and 5,000")
    parser.add_argument("--json", action="store_true", help="a JSON line before the table")
    args = parser.parse_args(argv)
    if args.quick:
        args.docs, args.folders = 20_000, "1000,5000"
    args.folders = [int(n) for n in args.folders.split(",") if n]
    if sum(args.folders) > args.docs:
        parser.error("the folders hold more files than --docs")
    scratch = Path(tempfile.mkdtemp(prefix="ragmesh-start-bench-"))
    stack = Stack(scratch / "stack", workers=0, services=SERVICES, health_timeout_s=READY_TIMEOUT_S)
    try:
        stack.up()
        out = asyncio.run(run(args, stack, scratch))
    finally:
        stack.down()
        shutil.rmtree(scratch, ignore_errors=True)
    out["command"] = "python -m bench.ingestion_start_bench " + " ".join(argv or sys.argv[1:])
    out["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        print(json.dumps(out))
    print(table(out))


if __name__ == "__main__":
    main()
