"""The NATS configuration that Kubernetes runs (deploy/k8s/base/nats.conf), run for real: three
nats-server processes form the JetStream cluster on 127.0.0.1, with the shipped file changed
only where a host, port or path must differ from a pod's (the route hosts become `localhost`,
which the test certificate names as the pods' certificate names theirs).

Checked over the wire: TLS and a user are required; each service's user can do what that
service does against JetStream (the real topology and bucket code of ingestion, a replicated log
like index/sparse use) and is refused outside its streams; streams and KV buckets are kept on
3 servers and survive one being killed."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.js.api import ConsumerConfig, StreamConfig

from meshkit.domain.collections import (
    COLLECTIONS_BUCKET,
    CollectionRegistry,
    EmbedderIdentity,
    open_collections_bucket,
)
from services.ingestion.lifecycle.buckets import STATUS_BUCKET, open_buckets
from services.ingestion.topology import ensure_topology

from .nats_cluster import (
    CONF,
    NATS_SERVER,
    PASSWORDS,
    SERVERS,
    Client,
    Server,
    connect,
    free_port,
    ingestion_settings,
    local_conf,
    placed_on_every_server,
    running_cluster,
)
from .pki import TestCA

pytestmark = pytest.mark.skipif(NATS_SERVER is None, reason="nats-server not installed (make setup)")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, pki: TestCA) -> Iterator[list[Server]]:
    with running_cluster(tmp_path_factory.mktemp("nats"), pki) as servers:
        yield servers


@pytest.fixture
async def as_user(cluster: list[Server], pki: TestCA) -> AsyncIterator[Callable[[str], Awaitable[Client]]]:
    opened: list[Client] = []

    async def _open(user: str) -> Client:
        client = await connect(cluster, pki, user)
        opened.append(client)
        return client

    yield _open
    for client in opened:
        if not client.nc.is_closed:
            await client.nc.close()


async def test_no_credentials_or_plaintext_is_refused(cluster: list[Server], pki: TestCA) -> None:
    with pytest.raises(Exception, match=r"(?i)authorization"):
        await connect(cluster, pki, None)
    with pytest.raises(Exception, match=r"(?i)authorization"):
        await connect(cluster, pki, "ingestion", password="wrong")
    # Plaintext: the server insists on TLS, so the client never gets a session.
    with pytest.raises(Exception):  # noqa: B017 - nats-py's error type varies with the failure
        await nats.connect(
            servers=[f"nats://127.0.0.1:{cluster[0].client}"],
            user="ingestion",
            password=PASSWORDS["ingestion"],
            allow_reconnect=False,
            connect_timeout=3,
        )


def test_a_client_set_up_only_by_the_pod_environment_connects(cluster: list[Server], pki: TestCA) -> None:
    """What the pods have: a tls:// URL, SSL_CERT_FILE (the mesh CA, base/mesh-tls.env) and the
    user from the Secret; nats-py then verifies the server against the mesh CA by itself."""
    code = (
        "import asyncio, os, nats\n"
        "async def main():\n"
        "    nc = await nats.connect(servers=[os.environ['URL']], user='index', inbox_prefix='_INBOX_index',"
        " password=os.environ['PW'], allow_reconnect=False, connect_timeout=5)\n"
        "    await nc.jetstream(timeout=5).account_info()\n"
        "    await nc.close()\n"
        "asyncio.run(main())\n"
    )
    env = {**os.environ, "URL": f"tls://localhost:{cluster[1].client}", "PW": PASSWORDS["index"]}
    ok = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "SSL_CERT_FILE": str(pki.ca_file)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr[-2000:]
    # Without the mesh CA the server's certificate is not trusted.
    env.pop("SSL_CERT_FILE", None)
    refused = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert refused.returncode != 0 and "CERTIFICATE_VERIFY_FAILED" in refused.stderr


async def test_bootstrap_declares_the_ingestion_topology_replicated(
    as_user: Callable[[str], Awaitable[Client]],
) -> None:
    boot = await as_user("bootstrap")
    settings = ingestion_settings()
    # The real declarations of ingestion (what the bootstrap Job runs).
    await ensure_topology(boot.js, settings)
    await open_buckets(boot.js, replicas=SERVERS)
    for name in (settings.ingest_stream, settings.ingest_dlq_stream):
        info = await boot.js.stream_info(name)
        # Streams take RAGMESH_NATS_STREAM_REPLICAS once the lifecycle work passes it to every
        # stream; the bootstrap user may raise a stream to R3 either way.
        if info.config.num_replicas != SERVERS:
            info.config.num_replicas = SERVERS
            await boot.js.update_stream(info.config)
    for stream in ("RAGMESH_INGEST", "RAGMESH_INGEST_DLQ", "KV_ragmesh_doc_status", "KV_ragmesh_doc_records"):
        await placed_on_every_server(boot.js, stream)
    # It declares only: no message in or out, no deletion.
    assert await boot.refused(
        boot.quick.publish("ragmesh.ingest.docs", b"{}", timeout=2), "ragmesh.ingest.docs"
    )
    assert await boot.refused(boot.quick.delete_stream("RAGMESH_INGEST"), "STREAM.DELETE.RAGMESH_INGEST")


async def test_ingestion_api_and_worker_do_their_jobs(as_user: Callable[[str], Awaitable[Client]]) -> None:
    settings = ingestion_settings()
    api = await as_user("ingestion")
    worker = await as_user("ingestion-worker")
    # Both declare at start (idempotent).
    await ensure_topology(api.js, settings)
    await ensure_topology(worker.js, settings)
    status, _records = await open_buckets(api.js, replicas=SERVERS)
    w_status, w_records = await open_buckets(worker.js, replicas=SERVERS)

    # The API: a status write (compare-and-set), the event, a watch of the status bucket.
    revision = await status.create("docs.doc-1", b"QUEUED")
    ack = await api.js.publish("ragmesh.ingest.docs.doc-1", b'{"doc": 1}', stream=settings.ingest_stream)
    assert ack.stream == settings.ingest_stream
    watcher = await status.watchall()
    seen = []
    for _ in range(5):  # None marks the end of the initial values; it may come first
        entry = await watcher.updates(timeout=5)
        if entry is not None:
            seen.append(entry.key)
            break
    assert seen == ["docs.doc-1"]
    await watcher.stop()

    # The worker: pull from the shared durable consumer, CAS the status, write a record, ack.
    sub = await worker.js.pull_subscribe_bind(settings.ingest_consumer, stream=settings.ingest_stream)
    msgs = await sub.fetch(1, timeout=5)
    assert msgs[0].data == b'{"doc": 1}'
    await msgs[0].in_progress()
    await w_status.update("docs.doc-1", b"PROCESSING", last=revision)
    await w_records.put("docs.doc-1", b"record")
    await msgs[0].ack_sync(timeout=5)
    await w_records.purge("docs.doc-1")
    # The reconciler's "is an event pending for this document" lookup (none: it was acked). The
    # removal reaches the stream's other servers a moment after the ack.
    for _ in range(50):
        try:
            await worker.js.get_last_msg(settings.ingest_stream, "ragmesh.ingest.docs.doc-1")
        except nats.js.errors.NotFoundError:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the acknowledged event is still in the work queue")
    # Dead letters: the worker writes one, the API lists and forgets it.
    dead = await worker.js.publish("ragmesh.dlq.docs", b"poison", stream=settings.ingest_dlq_stream)
    letter = await api.js.get_msg(settings.ingest_dlq_stream, dead.seq)
    assert letter.data == b"poison"
    await api.js.delete_msg(settings.ingest_dlq_stream, dead.seq)

    # Refused: reading the replies of other users (the shared inbox, or another user's);
    await api.nc.subscribe("_INBOX.>")
    await api.nc.subscribe("_INBOX_ingestion-worker.>")
    await api.nc.flush()
    for _ in range(50):
        if sum("subscription" in v for v in api.violations) >= 2:
            break
        await asyncio.sleep(0.05)
    assert sum("subscription" in v for v in api.violations) >= 2, api.violations
    # the API taking work from the workers' queue; either touching a store's log;
    # deleting a stream, a bucket or the shared consumer.
    api_sub = await api.js.pull_subscribe_bind(settings.ingest_consumer, stream=settings.ingest_stream)
    assert await api.refused(api_sub.fetch(1, timeout=2), "MSG.NEXT.RAGMESH_INGEST")
    assert await api.refused(api.quick.publish("ragmesh.log.index.0", b"x", timeout=2), "ragmesh.log.index.0")
    assert await worker.refused(
        worker.quick.publish("ragmesh.log.sparse.0", b"x", timeout=2), "ragmesh.log.sparse"
    )
    assert await worker.refused(worker.quick.delete_stream("RAGMESH_INGEST"), "STREAM.DELETE.RAGMESH_INGEST")
    assert await worker.refused(worker.quick.delete_stream("KV_ragmesh_doc_status"), "STREAM.DELETE.KV_")
    assert await api.refused(
        api.quick.delete_consumer(settings.ingest_stream, settings.ingest_consumer),
        "CONSUMER.DELETE.RAGMESH_INGEST",
    )


async def test_collection_records_are_written_by_ingestion_and_only_read_by_the_gateway(
    as_user: Callable[[str], Awaitable[Client]],
) -> None:
    boot = await as_user("bootstrap")
    await open_collections_bucket(boot.js, replicas=SERVERS)
    await placed_on_every_server(boot.js, f"KV_{COLLECTIONS_BUCKET}")
    worker = await as_user("ingestion-worker")
    identity = EmbedderIdentity("all-MiniLM-L6-v2-int8", 384, "8199be6f")
    # The worker's first write records the embedder; the API reads it (both: the real code).
    await CollectionRegistry(await open_collections_bucket(worker.js)).admit("docs", identity)
    api = await as_user("ingestion")
    record, _ = await CollectionRegistry(await open_collections_bucket(api.js)).get("docs")
    assert record is not None and record.embedder == identity
    # The gateway reads it the way it does in production, and can change nothing.
    gateway = await as_user("gateway")
    kv = await gateway.js.key_value(COLLECTIONS_BUCKET)
    assert (await CollectionRegistry(kv).get("docs"))[0] == record
    assert await gateway.refused(
        gateway.quick.publish("$KV.ragmesh_collections.docs", b"{}", timeout=2), "$KV."
    )
    assert await gateway.refused(gateway.quick.key_value(STATUS_BUCKET), "KV_ragmesh_doc_status")


async def test_store_users_keep_to_their_own_log(as_user: Callable[[str], Awaitable[Client]]) -> None:
    index = await as_user("index")
    sparse = await as_user("sparse")
    for client, store in ((index, "index"), (sparse, "sparse")):
        js = client.js
        stream = f"RAGMESH_LOG_{store.upper()}"
        try:
            await js.stream_info(stream)
        except nats.js.errors.NotFoundError:
            await js.add_stream(
                StreamConfig(name=stream, subjects=[f"ragmesh.log.{store}.>"], num_replicas=SERVERS)
            )
        wake = await client.nc.subscribe(f"ragmesh.log.{store}.>")
        tick = await client.nc.subscribe(f"ragmesh.logtick.{store}.0")  # the appliers' wake-up
        await client.nc.publish(f"ragmesh.logtick.{store}.0", b"")
        assert (await tick.next_msg(timeout=5)).data == b""
        await tick.unsubscribe()
        first = await js.publish(f"ragmesh.log.{store}.0", b"entry-1", stream=stream)
        await js.publish(f"ragmesh.log.{store}.0", b"entry-2", stream=stream)
        assert (await wake.next_msg(timeout=5)).data == b"entry-1"
        await wake.unsubscribe()
        # Read back in order, by sequence and with an ordered consumer (an applier's two ways).
        got = await js.get_msg(stream, first.seq + 1, subject=f"ragmesh.log.{store}.0", next=True)
        assert got.data == b"entry-2"
        ordered = await js.subscribe(f"ragmesh.log.{store}.0", ordered_consumer=True, stream=stream)
        entries = [(await ordered.next_msg(timeout=5)).data for _ in range(2)]
        assert entries == [b"entry-1", b"entry-2"]
        await ordered.unsubscribe()
        durable = await js.add_consumer(stream, ConsumerConfig(durable_name=f"{store}-0-applier"))
        assert durable.name == f"{store}-0-applier"
        await placed_on_every_server(js, stream)
    # Each keeps to its own log, and has no access to the ingestion state.
    assert await index.refused(
        index.quick.publish("ragmesh.log.sparse.0", b"x", timeout=2), "ragmesh.log.sparse"
    )
    assert await sparse.refused(sparse.quick.get_msg("RAGMESH_LOG_INDEX", 1), "MSG.GET.RAGMESH_LOG_INDEX")
    assert await index.refused(
        index.quick.publish("ragmesh.ingest.docs.x", b"x", timeout=2), "ragmesh.ingest"
    )
    assert await sparse.refused(sparse.quick.key_value("ragmesh_doc_status"), "KV_ragmesh_doc_status")
    assert await index.refused(
        index.quick.delete_stream("RAGMESH_LOG_INDEX"), "STREAM.DELETE.RAGMESH_LOG_INDEX"
    )


def _route_peers(server: Server) -> set[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.monitor}/routez", timeout=2) as reply:
        routes = json.loads(reply.read())["routes"] or []
    return {r.get("remote_name", "") for r in routes}


def test_a_mesh_certificate_cannot_join_as_a_route(
    cluster: list[Server], pki: TestCA, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Every mesh service holds a certificate from the same CA: a server presenting one that does
    not name a route host (here the embedder's) is refused by the cluster."""
    base = tmp_path_factory.mktemp("intruder")
    tls_dir = base / "tls"
    tls_dir.mkdir()
    stolen = pki.issue("embedder", ["embedder"])
    shutil.copy(stolen.cert, tls_dir / "tls.crt")
    shutil.copy(stolen.key, tls_dir / "tls.key")
    shutil.copy(pki.ca_file, tls_dir / "ca.crt")
    intruder = Server(
        "intruder", free_port(), free_port(), free_port(), base / "data", base / "intruder.conf"
    )
    intruder.conf.write_text(local_conf(CONF.read_text(), intruder, cluster, tls_dir))
    env = {**os.environ, **{f"NATS_PASSWORD_{u.upper().replace('-', '_')}": p for u, p in PASSWORDS.items()}}
    log = base / "intruder.log"
    proc = subprocess.Popen(
        [str(NATS_SERVER), "--config", str(intruder.conf)],
        env={**env, "POD_NAME": "intruder"},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        time.sleep(4)  # several route attempts (the intruder dials the cluster's route ports)
        assert proc.poll() is None, log.read_text()[-2000:]
        for server in cluster:
            assert "intruder" not in _route_peers(server)
        assert _route_peers(cluster[1]) >= {"nats-0", "nats-2"}  # the real peers are routed
    finally:
        proc.terminate()
        proc.wait(timeout=15)


async def test_replicated_streams_survive_a_killed_server(cluster: list[Server], pki: TestCA) -> None:
    settings = ingestion_settings()
    client = await connect(cluster, pki, "ingestion")
    await ensure_topology(client.js, settings)
    status, _ = await open_buckets(client.js, replicas=SERVERS)
    await status.put("docs.survivor", b"INDEXED")
    ack = await client.js.publish("ragmesh.ingest.docs.survivor", b"event", stream=settings.ingest_stream)
    await client.nc.close()
    victim = cluster[0]
    assert victim.proc is not None
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(timeout=10)
    victim.proc = None  # gone; the fixture stops the others
    client = await connect(cluster, pki, "ingestion")
    try:
        deadline = time.monotonic() + 30
        while True:  # the killed server's streams elect a new leader first
            try:
                entry = await (await client.js.key_value("ragmesh_doc_status")).get("docs.survivor")
                event = await client.js.get_msg(settings.ingest_stream, ack.seq)
                break
            except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
        assert entry.value == b"INDEXED"
        assert event.data == b"event"
        # Still writable on 2 of 3 servers (a quorum).
        await (await client.js.key_value("ragmesh_doc_status")).put("docs.after", b"QUEUED")
    finally:
        await client.nc.close()
