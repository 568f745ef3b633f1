"""The local stack's nats-server configuration file (plain and secure stacks alike).

Durability is explicit: JetStream fsyncs every write before it acknowledges it
(``sync_interval: always``), so an event, status or log entry the mesh was told is stored
survives a crash of the machine, not only of the process. That costs throughput (a 2-core box
measured about 1,800 acknowledged publishes/s in a row against 4,000 with the server's default
2-minute interval), far above what ingestion needs; a Kubernetes cluster instead replicates each
stream on three servers.

A secure stack adds TLS (the server's certificate from the mesh CA) and one user per service
that talks to NATS, each allowed only the subjects and streams it uses (``USER_GRANTS``), with its
own reply-inbox prefix (meshkit.storage.natsconn). No user, no connection: there is no anonymous access.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshkit.domain.collections import COLLECTIONS_BUCKET
from meshkit.rpc.identity import GATEWAY, INDEX, INGESTION, INGESTION_WORKER, OPS, SPARSE
from meshkit.storage.natsconn import inbox_prefix
from ragmesh_cli import procutil

SYNC_INTERVAL = "always"
INGEST_STREAM = "RAGMESH_INGEST"
DLQ_STREAM = "RAGMESH_INGEST_DLQ"
KV_BUCKETS = ("ragmesh_doc_status", "ragmesh_doc_records", COLLECTIONS_BUCKET)
INDEX_LOG_STREAM = "RAGMESH_LOG_INDEX"
SPARSE_LOG_STREAM = "RAGMESH_LOG_SPARSE"
# Every JetStream client may ask for its account's limits and look up a stream by subject.
JETSTREAM_BASICS = ("$JS.API.INFO", "$JS.API.STREAM.NAMES")


@dataclass(frozen=True)
class Grant:
    """What one NATS user may do: use these streams (create, read, write, consume; never delete or
    purge them), publish to these subjects, subscribe to these (besides its own inbox)."""

    streams: tuple[str, ...] = ()
    publish: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()
    admin: bool = False


def stream_api(stream: str) -> list[str]:
    """The JetStream API subjects that work one stream and its consumers, without the ones that
    delete or purge the stream itself."""
    return [
        f"$JS.API.STREAM.INFO.{stream}",
        f"$JS.API.STREAM.CREATE.{stream}",
        f"$JS.API.STREAM.UPDATE.{stream}",
        f"$JS.API.STREAM.MSG.GET.{stream}",
        f"$JS.API.STREAM.MSG.DELETE.{stream}",
        f"$JS.API.DIRECT.GET.{stream}",
        f"$JS.API.DIRECT.GET.{stream}.>",
        # CREATE (ephemeral and ordered consumers), NAMES, LIST ...
        f"$JS.API.CONSUMER.*.{stream}",
        # ... CREATE/INFO/DELETE of a named consumer.
        f"$JS.API.CONSUMER.*.{stream}.>",
        f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.>",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.>",
        # Acks, naks, in-progress and terms of its messages; flow control of push consumers.
        f"$JS.ACK.{stream}.>",
        f"$JS.FC.{stream}.>",
    ]


_KV_STREAMS = tuple(f"KV_{bucket}" for bucket in KV_BUCKETS)
_KV_SUBJECTS = tuple(f"$KV.{bucket}.>" for bucket in KV_BUCKETS)

# Who uses NATS and for what (docs/SECURITY.md): the ingestion API queues events and reads and
# writes document state; the workers consume events and write state and dead letters; index and
# sparse each append to and apply their own replicated log; operators do anything.
USER_GRANTS: dict[str, Grant] = {
    INGESTION: Grant(
        streams=(INGEST_STREAM, DLQ_STREAM, *_KV_STREAMS),
        publish=("ragmesh.ingest.>", "ragmesh.dlq.>", *_KV_SUBJECTS),
    ),
    # The workers' reconciler republishes a request whose event was lost (services/ingestion).
    INGESTION_WORKER: Grant(
        streams=(INGEST_STREAM, DLQ_STREAM, *_KV_STREAMS),
        publish=("ragmesh.ingest.>", "ragmesh.dlq.>", *_KV_SUBJECTS),
    ),
    # The gateway reads collection records (embedder, generation) and nothing else: no stream
    # API that changes or deletes, no KV publish (meshkit.domain.collections).
    GATEWAY: Grant(
        publish=(
            f"$JS.API.STREAM.INFO.KV_{COLLECTIONS_BUCKET}",
            f"$JS.API.STREAM.MSG.GET.KV_{COLLECTIONS_BUCKET}",
            f"$JS.API.DIRECT.GET.KV_{COLLECTIONS_BUCKET}.>",
        )
    ),
    # A store appends to its log and wakes its replicas on its tick subject (meshkit.replication.log).
    INDEX: Grant(
        streams=(INDEX_LOG_STREAM,),
        publish=("ragmesh.log.index.>", "ragmesh.logtick.index.>"),
        subscribe=("ragmesh.log.index.>", "ragmesh.logtick.index.>"),
    ),
    SPARSE: Grant(
        streams=(SPARSE_LOG_STREAM,),
        publish=("ragmesh.log.sparse.>", "ragmesh.logtick.sparse.>"),
        subscribe=("ragmesh.log.sparse.>", "ragmesh.logtick.sparse.>"),
    ),
    OPS: Grant(admin=True),
}


def permissions(user: str, grant: Grant) -> dict[str, Any]:
    if grant.admin:
        return {"publish": {"allow": [">"]}, "subscribe": {"allow": [">"]}}
    streams = [subject for stream in grant.streams for subject in stream_api(stream)]
    publish = [*JETSTREAM_BASICS, *streams, *grant.publish]
    return {
        "publish": {"allow": publish},
        "subscribe": {"allow": [f"{inbox_prefix(user)}.>", *grant.subscribe]},
    }


@dataclass(frozen=True)
class ServerTLS:
    cert_file: Path
    key_file: Path
    ca_file: Path


def nats_config(
    port: int,
    monitor_port: int | None,
    store_dir: Path,
    *,
    tls: ServerTLS | None = None,
    passwords: Mapping[str, str] | None = None,
    grants: Mapping[str, Grant] = USER_GRANTS,
) -> dict[str, Any]:
    """The server's configuration; with ``passwords`` (user -> password), only those users get in;
    without ``monitor_port``, no HTTP monitoring port."""
    config: dict[str, Any] = {
        "listen": f"{procutil.LOOPBACK}:{port}",
        "jetstream": {"store_dir": str(store_dir), "sync_interval": SYNC_INTERVAL},
    }
    if monitor_port is not None:
        config["http"] = f"{procutil.LOOPBACK}:{monitor_port}"
    if tls is not None:
        config["tls"] = {
            "cert_file": str(tls.cert_file),
            "key_file": str(tls.key_file),
            "ca_file": str(tls.ca_file),
            "timeout": 2,
        }
    if passwords is not None:
        config["authorization"] = {
            "users": [
                {"user": user, "password": passwords[user], "permissions": permissions(user, grants[user])}
                for user in sorted(passwords)
            ]
        }
    return config


def write_nats_config(path: Path, config: Mapping[str, Any]) -> Path:
    """Write the file nats-server -c reads (JSON is valid NATS configuration); 0600, since a
    secure stack's holds the users' passwords."""
    procutil.write_json_atomic(path, dict(config), mode=0o600)
    return path
