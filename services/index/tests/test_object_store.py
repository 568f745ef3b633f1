"""Snapshots in the object store: failures never fail writes; a real SeaweedFS round trip
(upload, then restore into an empty data dir) when the ``weed`` binary is at hand."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshkit.storage.objectstore import ObjectStore
from ragmesh.index.v1 import index_pb2
from tests.support.natsserver import NatsServer, nats_server_binary

from .conftest import cid, random_vectors
from .test_service import chunk, make_settings, serve, shutdown, vec

ACCESS_KEY = "indextest"
SECRET_KEY = "index-test-secret-key"
BUCKET = "index-test-snapshots"


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_unreachable_object_store_fails_neither_start_nor_writes(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, index_upload_snapshots=True, s3_endpoint=f"127.0.0.1:{closed_port()}")
    served = await serve(settings)
    try:
        vector = random_vectors(1)[0]
        upserted = await served.stub.Upsert(
            index_pb2.UpsertRequest(collection="docs", chunks=[chunk("a", cid("a", 0), vector)])
        )
        assert upserted.upserted == 1
        snap = await served.stub.Snapshot(index_pb2.SnapshotRequest(collection="docs"))
        assert snap.sequence == 1 and not snap.uploaded
        assert (tmp_path / "index-0" / "docs" / "CURRENT").exists()
    finally:
        await shutdown(served)


# ----- real SeaweedFS -----

WEED = Path(sys.executable).parent / "weed"


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def port_pairs(count: int) -> list[int]:
    """Ports P with P+10000 free too (SeaweedFS derives gRPC ports that way)."""
    found: list[int] = []
    port = 21000 + (os.getpid() * 37) % 8000
    while len(found) < count:
        port += 1
        if _free(port) and _free(port + 10000):
            found.append(port)
    return found


@pytest.fixture
def seaweed(tmp_path: Path) -> Iterator[str]:
    if not WEED.exists():
        pytest.skip("weed binary not installed")
    data = tmp_path / "weed"
    data.mkdir()
    config = tmp_path / "s3.json"
    identity = {
        "name": "index-test",
        "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }
    config.write_text(json.dumps({"identities": [identity]}))
    s3, master, volume, filer, admin = port_pairs(5)
    argv = [
        str(WEED), "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        f"-s3.port={s3}", f"-s3.port.grpc={s3 + 10000}", f"-s3.config={config}",
        "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
        "-master.telemetry=false", f"-master.port={master}", f"-master.port.grpc={master + 10000}",
        f"-volume.port={volume}", f"-volume.port.grpc={volume + 10000}", f"-filer.port={filer}",
        f"-filer.port.grpc={filer + 10000}", f"-admin.port={admin}", f"-admin.port.grpc={admin + 10000}",
    ]  # fmt: skip
    log_path = tmp_path / "weed.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        _wait_for_s3(f"127.0.0.1:{s3}", proc, log_path)
        yield f"127.0.0.1:{s3}"
    finally:
        proc.terminate()
        try:
            proc.wait(2)  # its data is thrown away: no need for a slow, clean shutdown
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(data, ignore_errors=True)


def _wait_for_s3(endpoint: str, proc: subprocess.Popen[bytes], log_path: Path) -> None:
    client = ObjectStore(endpoint, ACCESS_KEY, SECRET_KEY, timeout_s=2.0).client
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"weed exited: {log_path.read_text()[-2000:]}")
        try:
            client.list_buckets()
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.integration
async def test_upload_then_restore_into_an_empty_data_dir(tmp_path: Path, seaweed: str) -> None:
    s3 = {
        "index_upload_snapshots": True,
        "s3_endpoint": seaweed,
        "s3_access_key": ACCESS_KEY,
        "s3_secret_key": SECRET_KEY,
        "snapshots_bucket": BUCKET,
        "index_type": "hnsw",
    }
    first = await serve(make_settings(tmp_path / "a", **s3))
    vectors = random_vectors(60, seed=8)
    chunks = [chunk(f"d{i % 6}", cid(f"d{i % 6}", i), vectors[i]) for i in range(60)]
    try:
        await first.stub.Upsert(index_pb2.UpsertRequest(collection="docs", chunks=chunks[:40]))
        snap = await first.stub.Snapshot(index_pb2.SnapshotRequest(collection="docs"))
        assert snap.uploaded and snap.sequence == 1
        # Written after the explicit snapshot: reaches the store through the shutdown snapshot.
        await first.stub.Upsert(index_pb2.UpsertRequest(collection="docs", chunks=chunks[40:]))
        await first.stub.Delete(index_pb2.DeleteRequest(collection="docs", doc_ids=["d0"]))
        expected = await first.stub.Search(
            index_pb2.SearchRequest(collection="docs", vector=vec(vectors[1]), top_k=5)
        )
    finally:
        await shutdown(first)

    store = ObjectStore(seaweed, ACCESS_KEY, SECRET_KEY)
    keys = await store.list_keys(BUCKET, "index/shard-0-of-1/docs/")
    assert "index/shard-0-of-1/docs/latest" in keys
    assert json.loads(await store.get(BUCKET, "index/shard-0-of-1/docs/latest"))["log_pos"] == 3

    empty = tmp_path / "b"
    second = await serve(make_settings(empty, **s3))
    try:
        stats = await second.stub.GetStats(index_pb2.GetStatsRequest(collection="docs"))
        assert (stats.chunks, stats.documents, stats.index_type, stats.pending_wal_records) == (
            50,
            5,
            "hnsw",
            0,
        )
        got = await second.stub.Search(
            index_pb2.SearchRequest(collection="docs", vector=vec(vectors[1]), top_k=5)
        )
        assert [h.chunk_id for h in got.hits] == [h.chunk_id for h in expected.hits]
        # The restored replica keeps writing on top of the restored sequence.
        more = chunk("d9", cid("d9", 0), vectors[0])
        await second.stub.Upsert(index_pb2.UpsertRequest(collection="docs", chunks=[more]))
        snap = await second.stub.Snapshot(index_pb2.SnapshotRequest(collection="docs"))
        assert snap.uploaded and snap.sequence == 4
    finally:
        await shutdown(second)


@pytest.fixture
def nats_url(tmp_path: Path) -> Iterator[str]:
    if nats_server_binary() is None:
        pytest.skip("nats-server not installed")
    server = NatsServer(tmp_path / "nats")
    server.start()
    yield server.url
    server.stop()


@pytest.mark.integration
async def test_a_lost_disk_comes_back_with_the_writes_made_after_the_last_snapshot(
    tmp_path: Path, seaweed: str, nats_url: str
) -> None:
    """Disk loss after a crash (no shutdown snapshot): the snapshot in the object store plus the
    replicated log give back every acknowledged write, not only what the snapshot held."""
    settings = {
        "index_upload_snapshots": True,
        "s3_endpoint": seaweed,
        "s3_access_key": ACCESS_KEY,
        "s3_secret_key": SECRET_KEY,
        "snapshots_bucket": BUCKET,
        "store_log": "jetstream",
        "nats_url": nats_url,
        "store_log_poll_s": 0.2,
    }
    first = await serve(make_settings(tmp_path / "a", **settings))
    vectors = random_vectors(60, seed=11)
    chunks = [chunk(f"d{i % 6}", cid(f"d{i % 6}", i), vectors[i]) for i in range(60)]
    await first.stub.Upsert(index_pb2.UpsertRequest(collection="docs", chunks=chunks[:40]))
    snap = await first.stub.Snapshot(index_pb2.SnapshotRequest(collection="docs"))
    assert snap.uploaded
    # Acknowledged after the snapshot: in the local WAL and in the log, not in the object store.
    await first.stub.Upsert(index_pb2.UpsertRequest(collection="docs", chunks=chunks[40:]))
    await first.stub.Delete(index_pb2.DeleteRequest(collection="docs", doc_ids=["d0"]))
    expected = await first.stub.Search(
        index_pb2.SearchRequest(collection="docs", vector=vec(vectors[1]), top_k=5)
    )
    # The replica dies with its disk: no shutdown snapshot. A new one starts on an empty disk.
    second = await serve(make_settings(tmp_path / "b", **settings))
    try:
        stats = await second.stub.GetStats(index_pb2.GetStatsRequest(collection="docs"))
        assert (stats.chunks, stats.documents) == (50, 5)
        got = await second.stub.Search(
            index_pb2.SearchRequest(collection="docs", vector=vec(vectors[1]), top_k=5)
        )
        assert [h.chunk_id for h in got.hits] == [h.chunk_id for h in expected.hits]
    finally:
        await shutdown(second)
        await shutdown(first)
