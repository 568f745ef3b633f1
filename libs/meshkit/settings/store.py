"""What the two replicated stores share (the index and the sparse store)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from meshkit.settings.mesh import MeshSettings


class StoreSettings(MeshSettings):
    """What the stateful stores (index shards, sparse) share: the replicated log their replicas
    apply (meshkit.replication.log, docs/ARCHITECTURE.md "Replication and durability")."""

    store_log: Literal["jetstream", "local"] = Field(
        "jetstream",
        description="jetstream: every write goes through the shard's log in NATS JetStream and every "
        "replica applies it in order (replicas stay identical; a replica with an empty disk restores "
        "snapshot + log). local: entries stay in this process (one replica only, no NATS; tests and "
        "single-node development).",
    )
    store_log_max_age_s: float = Field(
        7 * 24 * 3600.0,
        gt=0,
        description="How long the log keeps an entry (JetStream max_age). A replica down for longer, or "
        "restored from a snapshot older than this, cannot be completed from the log: its collections are "
        "quarantined instead of served incomplete. Keep it far above the snapshot interval.",
    )
    store_log_entry_bytes: int = Field(
        768 * 1024,
        ge=4096,
        description="Largest log message; a bigger write is split into parts published as one atomic "
        "batch (capped below the NATS server's max_payload).",
    )
    store_log_catchup_timeout_s: float = Field(
        30.0,
        ge=0,
        description="At start, how long a replica waits for an unreachable log before it serves its local "
        "state (it catches up once the log is back). A reachable log is always caught up first.",
    )
    store_log_poll_s: float = Field(
        1.0,
        gt=0,
        description="Idle replicas look for new entries at least this often (writers also notify them).",
    )
    store_write_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Longest a write waits for this replica to apply its entry when the caller set no "
        "deadline.",
    )
