"""The replicated log against a real nats-server: every replica applies every entry in the same
order, a writer gets its own entry's result, big entries travel as atomic multi-part batches,
gaps and a recreated log are noticed, and a replica that was away catches up."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest

from meshkit.replication.jetstream import JetStreamTransport
from meshkit.replication.log import Entry, ReplicatedLog
from meshkit.replication.memory import MemoryTransport
from meshkit.replication.positions import Positions, load_positions
from meshkit.replication.transport import LogUnavailable
from meshkit.settings import StoreSettings
from tests.support.natsserver import NatsServer, nats_server_binary

STREAM = "RAGMESH_LOG_TEST"


class Refused(Exception):
    pass


@dataclass
class Replica:
    """One replica's log and what its (deterministic) apply saw."""

    log: ReplicatedLog
    applied: list[tuple[int, bytes]] = field(default_factory=list)
    gaps: list[tuple[int, int]] = field(default_factory=list)
    resets: list[str] = field(default_factory=list)

    async def apply(self, entry: Entry) -> Any:
        if entry.data.startswith(b"boom"):
            raise Refused(entry.data.decode())
        self.applied.append((entry.seq, entry.data))
        return entry.data.upper()

    async def on_gap(self, after: int, prev: int) -> None:
        self.gaps.append((after, prev))

    async def on_reset(self, log_id: str) -> None:
        self.resets.append(log_id)


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    if nats_server_binary() is None:
        pytest.skip("nats-server not installed")
    server = NatsServer(tmp_path_factory.mktemp("nats"))
    server.start()
    yield server
    server.stop()


def store_settings(server: NatsServer, **overrides: Any) -> StoreSettings:
    base: dict[str, Any] = {"nats_url": server.url, "store_log_poll_s": 0.2, "store_write_timeout_s": 10}
    base.update(overrides)
    return StoreSettings(**base)


_shards = iter(range(1000))


@pytest.fixture
def shard() -> int:
    """A fresh subject (shard number) per test: tests share the stream."""
    return next(_shards)


@pytest.fixture
async def replicas(nats_server: NatsServer, shard: int) -> AsyncIterator[list[Replica]]:
    made: list[Replica] = []
    yield made
    for replica in made:
        await replica.log.stop()
        await replica.log.transport.close()


async def make_replica(
    made: list[Replica], server: NatsServer, shard: int, cursor: int = 0, **overrides: Any
) -> Replica:
    settings = store_settings(server, **overrides)
    transport = JetStreamTransport(settings, STREAM, "test", shard, client_name=f"replica-{len(made)}")
    replica: Replica
    holder: dict[str, Replica] = {}

    async def apply(entry: Entry) -> Any:
        return await holder["r"].apply(entry)

    async def on_gap(after: int, prev: int) -> None:
        await holder["r"].on_gap(after, prev)

    async def on_reset(log_id: str) -> None:
        await holder["r"].on_reset(log_id)

    log = ReplicatedLog(transport, apply, poll_s=settings.store_log_poll_s, on_gap=on_gap, on_reset=on_reset)
    replica = Replica(log)
    holder["r"] = replica
    made.append(replica)
    await transport.open()
    log.positions.cursor = cursor
    await log.start()
    assert await log.wait_caught_up(10)
    return replica


async def settled(replicas: list[Replica], count: int, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while any(len(r.applied) < count for r in replicas):
        assert asyncio.get_running_loop().time() < deadline, [len(r.applied) for r in replicas]
        await asyncio.sleep(0.02)


async def test_every_replica_applies_every_entry_in_one_order(
    nats_server: NatsServer, shard: int, replicas: list[Replica]
) -> None:
    a = await make_replica(replicas, nats_server, shard)
    b = await make_replica(replicas, nats_server, shard)
    c = await make_replica(replicas, nats_server, shard)
    # Both replicas take writes at once: the appends race for the same subject.
    writes = [(a if i % 2 else b).log.submit(f"w{i}".encode(), 10) for i in range(40)]
    results = await asyncio.gather(*writes)
    # Each writer got the result of its own entry, applied on its own replica.
    assert results == [f"W{i}".encode() for i in range(40)]
    await settled([a, b, c], 40)
    assert a.applied == b.applied == c.applied
    assert sorted(d for _s, d in a.applied) == sorted(f"w{i}".encode() for i in range(40))
    seqs = [s for s, _d in a.applied]
    assert seqs == sorted(seqs) and len(set(seqs)) == 40
    assert not a.gaps and not b.gaps and not c.gaps


async def test_a_refusal_reaches_its_writer_and_the_log_goes_on(
    nats_server: NatsServer, shard: int, replicas: list[Replica]
) -> None:
    a = await make_replica(replicas, nats_server, shard)
    b = await make_replica(replicas, nats_server, shard)
    with pytest.raises(Refused, match="boom-1"):
        await a.log.submit(b"boom-1", 10)
    assert await b.log.submit(b"after", 10) == b"AFTER"
    await settled([a, b], 1)
    assert [d for _s, d in a.applied] == [d for _s, d in b.applied] == [b"after"]


async def test_a_big_entry_travels_in_parts_and_applies_whole(
    nats_server: NatsServer, shard: int, replicas: list[Replica]
) -> None:
    a = await make_replica(replicas, nats_server, shard, store_log_entry_bytes=64 * 1024)
    b = await make_replica(replicas, nats_server, shard, store_log_entry_bytes=64 * 1024)
    big = bytes(range(256)) * (3 * 1024 * 1024 // 256 + 7)
    small = b"small"
    await asyncio.gather(a.log.submit(big, 20), b.log.submit(small, 20), a.log.submit(small + b"2", 20))
    await settled([a, b], 3)
    assert a.applied == b.applied
    assert [d for _s, d in a.applied if len(d) > 100] == [big]
    nc = await nats.connect(nats_server.url)
    try:
        state = (await nc.jetstream().stream_info(STREAM)).state
        assert state.last_seq - 3 >= len(big) // (64 * 1024 - 8 * 1024)  # it did take many messages
    finally:
        await nc.close()


async def test_a_replica_that_was_away_catches_up_from_its_position(
    nats_server: NatsServer, shard: int, replicas: list[Replica]
) -> None:
    a = await make_replica(replicas, nats_server, shard)
    for i in range(5):
        await a.log.submit(f"x{i}".encode(), 10)
    position = a.log.positions.cursor
    for i in range(5, 9):
        await a.log.submit(f"x{i}".encode(), 10)
    # A replica that held the first five resumes after them and applies exactly the rest.
    b = await make_replica(replicas, nats_server, shard, cursor=position)
    await settled([b], 4)
    assert [d for _s, d in b.applied] == [f"x{i}".encode() for i in range(5, 9)]
    assert b.applied == a.applied[5:]


async def test_entries_removed_before_a_replica_read_them_are_a_gap(
    nats_server: NatsServer, shard: int, replicas: list[Replica]
) -> None:
    a = await make_replica(replicas, nats_server, shard)
    for i in range(4):
        await a.log.submit(f"g{i}".encode(), 10)
    seqs = [s for s, _d in a.applied]
    nc = await nats.connect(nats_server.url)
    try:
        await nc.jetstream().delete_msg(STREAM, seqs[1])  # as retention would, before b read it
    finally:
        await nc.close()
    b = await make_replica(replicas, nats_server, shard, cursor=seqs[0])
    await settled([b], 2)
    assert b.gaps == [(seqs[0], seqs[1])]
    assert [d for _s, d in b.applied] == [b"g2", b"g3"]
    # A replica past the removed entry sees no gap.
    c = await make_replica(replicas, nats_server, shard, cursor=seqs[1])
    await settled([c], 2)
    assert not c.gaps


async def test_nats_down_refuses_writes_and_the_reader_resumes(
    tmp_path: Path, shard: int, replicas: list[Replica]
) -> None:
    server = NatsServer(tmp_path / "nats")
    server.start()
    try:
        a = await make_replica(replicas, server, shard)
        b = await make_replica(replicas, server, shard)
        await a.log.submit(b"before", 10)
        server.kill()
        with pytest.raises(LogUnavailable):
            await a.log.submit(b"while-down", 10)
        server.start()  # same port, same data
        deadline = asyncio.get_running_loop().time() + 20
        while True:
            with contextlib.suppress(LogUnavailable):
                assert await b.log.submit(b"after", 10) == b"AFTER"
                break
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.2)
        await settled([a, b], 2)
        assert [d for _s, d in a.applied] == [d for _s, d in b.applied] == [b"before", b"after"]
    finally:
        for replica in replicas:
            await replica.log.stop()
            await replica.log.transport.close()
        replicas.clear()
        server.stop()


async def test_an_append_nobody_acknowledges_fails_soon_and_holds_no_other_write(
    tmp_path: Path, shard: int, replicas: list[Replica]
) -> None:
    # A hung server (or an append written to a connection that died) never acks: the writer
    # must give up after the ack timeout, not after its whole write timeout, since the append
    # lock it holds meanwhile stops every other write of the shard.
    server = NatsServer(tmp_path / "nats")
    server.start()
    try:
        a = await make_replica(replicas, server, shard, store_write_timeout_s=60)
        await a.log.submit(b"before", 10)
        server.pause()
        started = asyncio.get_running_loop().time()
        outcomes = await asyncio.gather(
            a.log.submit(b"first", 60), a.log.submit(b"second", 60), return_exceptions=True
        )
        waited = asyncio.get_running_loop().time() - started
        assert all(isinstance(o, LogUnavailable) for o in outcomes), outcomes
        assert waited < 45, f"the appends held the shard for {waited:.0f}s (the write timeout is 60 s)"
        server.resume()
        deadline = asyncio.get_running_loop().time() + 40
        while True:
            with contextlib.suppress(LogUnavailable):
                assert await a.log.submit(b"after", 10) == b"AFTER"
                break
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.2)
    finally:
        server.resume()
        for replica in replicas:
            await replica.log.stop()
            await replica.log.transport.close()
        replicas.clear()
        server.stop()


async def test_a_recreated_log_restarts_positions(
    tmp_path: Path, shard: int, replicas: list[Replica]
) -> None:
    server = NatsServer(tmp_path / "nats")
    server.start()
    try:
        a = await make_replica(replicas, server, shard)
        for i in range(3):
            await a.log.submit(f"old{i}".encode(), 10)
        first_id = a.log.positions.log_id
        assert first_id
        await a.log.stop()
        nc = await nats.connect(server.url)
        try:
            await nc.jetstream().delete_stream(STREAM)
        finally:
            await nc.close()
        # The new log numbers its entries from 1 again: a replica at the old position would
        # skip them, so positions restart.
        writer = await make_replica(replicas, server, shard)
        await writer.log.submit(b"new0", 10)
        log = ReplicatedLog(
            a.log.transport,
            a.apply,
            poll_s=0.2,
            on_gap=a.on_gap,
            on_reset=a.on_reset,
            positions=a.log.positions,
        )
        a.log = log
        await log.start()
        await settled([a], 4)
        assert a.resets and a.resets[0] != first_id
        assert a.applied[-1][1] == b"new0" and log.positions.log_id == a.resets[0]
    finally:
        for replica in replicas:
            await replica.log.stop()
            await replica.log.transport.close()
        replicas.clear()
        server.stop()


async def test_rewind_reads_again_and_collections_ahead_skip_what_they_hold() -> None:
    transport = MemoryTransport()
    seen: list[tuple[str, int]] = []
    holder: dict[str, ReplicatedLog] = {}

    async def apply(entry: Entry) -> Any:
        name = entry.data.decode().split(":")[0]
        if holder["log"].positions.needs(name, entry.seq):
            seen.append((name, entry.seq))
        return None

    async def nothing(*_args: Any) -> None:
        return None

    log = ReplicatedLog(transport, apply, poll_s=0.05, on_gap=nothing, on_reset=nothing)
    holder["log"] = log
    await log.start()
    for i in range(6):
        await log.submit(f"{'ab'[i % 2]}:{i}".encode(), 5)
    assert [s for _n, s in seen] == [1, 2, 3, 4, 5, 6]

    async def restore_a_at_2() -> None:
        log.rewind_now(2, ["b"])

    seen.clear()
    await log.between_entries(restore_a_at_2)
    await log.submit(b"a:new", 5)
    # 'a' (restored at 2) gets 3 and 5 again plus the new entry; 'b' skips what it holds.
    assert seen == [("a", 3), ("a", 5), ("a", 7)]
    await log.stop()


def test_positions_bookkeeping(tmp_path: Path) -> None:
    p = Positions(cursor=10, ahead={"x": 15}, log_id="L")
    assert (p.of("x"), p.of("y")) == (15, 10)
    assert p.needs("y", 11) and not p.needs("x", 12) and p.needs("x", 16)
    p.advance(12)
    assert p.of("x") == 15 and p.of("y") == 12
    assert not p.place("z", 20) and p.of("z") == 20
    assert p.place("w", 3)  # behind the reader: needs a rewind
    p.rewind(3, ["x", "y", "z"])
    assert (p.cursor, p.of("x"), p.of("y"), p.of("z"), p.of("w")) == (3, 15, 12, 20, 3)
    p.advance(20)
    assert p.ahead == {} and p.of("x") == 20
    path = tmp_path / "positions.json"
    p.save(path, ["x", "w"], {"quarantined": {"q": "why"}})
    saved = load_positions(path)
    assert saved == {"log": "L", "cursor": 20, "collections": {"w": 20, "x": 20}, "quarantined": {"q": "why"}}
    p.restart("M")
    assert (p.cursor, p.ahead, p.log_id) == (0, {}, "M")


async def test_a_log_that_lost_acknowledged_entries_refuses_appends() -> None:
    """A log whose newest entries are gone (a lone server crashed inside its sync interval) would
    hand their positions to new entries, which replicas past them never read: refuse instead."""
    transport = MemoryTransport()
    applied: list[int] = []

    async def apply(entry: Entry) -> Any:
        applied.append(entry.seq)
        return None

    async def nothing(*_args: Any) -> None:
        return None

    log = ReplicatedLog(transport, apply, poll_s=0.05, on_gap=nothing, on_reset=nothing)
    await log.start()
    for i in range(3):
        await log.submit(f"e{i}".encode(), 5)
    assert applied == [1, 2, 3]
    transport._messages.pop()  # the newest entry is lost...
    transport._last = 2  # ...and its position will be handed out again
    with pytest.raises(LogUnavailable, match="lost entries"):
        await log.submit(b"next", 5)
    await log.stop()
