"""Client-side balancing over a static list of replicas (meshkit.rpc.addresses.replica_targets):
least outstanding calls, outlier ejection, probes.

Each replica has its own channel. A call goes to the replica with the fewest calls in flight from
this client, ties taken in turn (round-robin among the least loaded): a replica that answers
slower holds its calls longer and so is sent fewer, where gRPC's round_robin would give it the
same share as the others and let calls queue behind it. A replica is left out:

- while its channel is not READY and another's is, as gRPC's round_robin does: a replica that is
  down, restarting or draining (GOAWAY) is skipped without a failed call. Every pick asks the
  channels to connect, so a replica is back as soon as its server is;
- for an ejection period after ``eject_after_failures`` UNAVAILABLE or DEADLINE_EXCEEDED answers in
  a row, or when its latency EWMA is ``latency_ratio`` times the median of the other replicas' and
  ``latency_min_excess_s`` above it (after ``min_samples`` calls). The period starts at
  ``base_ejection_s`` and doubles with each ejection that follows soon after the last one, up to
  ``max_ejection_s``. Then the replica is on probation: one call at a time (the probe) until one
  answers well; a probe that fails or is an outlier ejects it again.

At most ``max_ejected_fraction`` of the replicas are out at once, and never all of them: a problem
every replica shares (a short caller deadline, an overloaded tier) cannot empty the rotation.
Retries go to a replica the call has not tried yet when one can take it (see ``pick``).

Latency is what this client sees (queueing in the replica included), so the comparison is fair:
every replica gets the same mix of requests from it. Streams count as calls in flight and their
failures count, but their length (an answer being written) is not a latency sample.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from meshkit.rpc.metrics import (
    REPLICA_CALLS,
    REPLICA_EJECTED,
    REPLICA_EJECTIONS,
    REPLICA_IN_FLIGHT,
    REPLICA_LATENCY,
)

# Answers that say "this replica is unwell" (the others say something about the request).
EJECTING_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
READY = grpc.ChannelConnectivity.READY
_CONNECTING = frozenset({grpc.ChannelConnectivity.IDLE, grpc.ChannelConnectivity.CONNECTING})


@dataclass(frozen=True)
class BalancerConfig:
    # Weight of the newest latency sample in a replica's moving average.
    ewma_alpha: float = 0.3
    # Calls a replica answers before its latency is judged.
    min_samples: int = 5
    # An outlier's latency: this many times the median of the others', and this much above it.
    latency_ratio: float = 3.0
    latency_min_excess_s: float = 0.05
    # UNAVAILABLE / DEADLINE_EXCEEDED answers in a row that eject a replica.
    eject_after_failures: int = 3
    base_ejection_s: float = 2.0
    max_ejection_s: float = 30.0
    # Most replicas out at once, as a share of them (never all).
    max_ejected_fraction: float = 0.5


class Replica:
    """One replica: its channel and stub, the calls this client has in flight to it, its latency
    and health as this client sees them."""

    def __init__(self, target: str, index: int, address: str, channel: Any, stub: Any) -> None:
        self.target = target
        self.index = index
        self.address = address
        self.channel = channel
        self.stub = stub
        self.in_flight = 0
        self.ewma_s: float | None = None
        self.samples = 0
        self.failures = 0
        # > 0 while ejected: when the ejection ends; and why ("failures" or "latency").
        self.ejected_until = 0.0
        self.ejected_for = ""
        self.probing = False
        self.strikes = 0
        self.released_at = -math.inf
        self._methods: dict[bytes, Any] = {}
        self.in_flight_gauge = REPLICA_IN_FLIGHT.labels(target, address)
        self.ejected_gauge = REPLICA_EJECTED.labels(target, address)
        self._latency_gauge = REPLICA_LATENCY.labels(target, address)
        self.ejected_gauge.set(0)

    def __repr__(self) -> str:
        return f"Replica({self.address}, in_flight={self.in_flight}, ewma={self.ewma_s}, state={self.state})"

    @property
    def state(self) -> str:
        if self.ejected_until:
            return "ejected"
        return "probing" if self.probing else "healthy"

    def takes_calls(self) -> bool:
        """Not ejected; on probation only while its one probe is not out."""
        return not self.ejected_until and (not self.probing or self.in_flight == 0)

    def alive(self) -> bool:
        """Not ejected for failing: a slow replica, or one on probation, still answers."""
        return self.ejected_for != "failures"

    def connectivity(self) -> grpc.ChannelConnectivity:
        """The channel's state; asks an idle or failed channel to (re)connect."""
        state: grpc.ChannelConnectivity = self.channel.get_state(try_to_connect=True)
        return state

    def bind(self, method: Any) -> Any | None:
        """This replica's stub method for ``method`` (a stub attribute of any replica, known by its
        full name), or None when ``method`` is not one."""
        path = getattr(method, "_method", None)
        if not isinstance(path, bytes):
            return None
        bound = self._methods.get(path)
        if bound is None:
            candidate = getattr(self.stub, path.decode().rsplit("/", 1)[-1], None)
            if getattr(candidate, "_method", None) != path:
                return None
            bound = self._methods[path] = candidate
        return bound

    def observe(self, latency_s: float, alpha: float) -> None:
        self.ewma_s = latency_s if self.ewma_s is None else alpha * latency_s + (1 - alpha) * self.ewma_s
        self.samples += 1
        self._latency_gauge.set(self.ewma_s)


class Balancer:
    """Picks the replica of each call and learns from how it went (``started`` / ``finished``)."""

    def __init__(
        self,
        target: str,
        replicas: Sequence[Replica],
        config: BalancerConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not replicas:
            raise ValueError("a balancer needs at least one replica")
        self.target = target
        self.replicas = list(replicas)
        self.config = config or BalancerConfig()
        self._clock = clock
        self._next = 0

    def connect(self) -> None:
        """Ask every channel to connect now, so the first calls find them all ready."""
        for replica in self.replicas:
            replica.connectivity()

    # ------------------------------------------------------------------ picking

    def pick(self, tried: Collection[Replica] = ()) -> Replica:
        """The replica for the next attempt of a call that already tried ``tried``: among those
        that take calls, the ones not tried yet, connected first; then the tried ones; only when
        every replica is ejected or down, any of them."""
        now = self._clock()
        for replica in self.replicas:
            self._release(replica, now)
        usable = [r for r in self.replicas if r.takes_calls()]
        fresh = [r for r in usable if r not in tried]
        # A replica that is down is the last choice: a slow or probing one that is connected
        # answers, where a call to a dead one only fails.
        alive = [r for r in self.replicas if r.alive()]
        pool = (
            self._connected(fresh)
            or self._ready(usable)
            or self._ready([r for r in alive if r not in tried])
            or self._ready(alive)
            or self._connected(usable)
            or fresh
            or usable
            or self.replicas
        )
        chosen = min(pool, key=self._load)
        self._next = (chosen.index + 1) % len(self.replicas)
        return chosen

    def others_ready(self, replica: Replica) -> bool:
        """Whether a replica other than ``replica`` is connected and not ejected for failing."""
        return any(r is not replica and r.alive() and r.connectivity() == READY for r in self.replicas)

    @staticmethod
    def _ready(replicas: list[Replica]) -> list[Replica]:
        return [r for r in replicas if r.connectivity() == READY]

    def _load(self, replica: Replica) -> tuple[int, int]:
        # Fewest in flight; among equals, the next in turn after the last one picked.
        return replica.in_flight, (replica.index - self._next) % len(self.replicas)

    @staticmethod
    def _connected(replicas: list[Replica]) -> list[Replica]:
        """The READY ones; when none is, the ones connecting (not known to be down)."""
        states = [(r, r.connectivity()) for r in replicas]
        ready = [r for r, state in states if state == grpc.ChannelConnectivity.READY]
        return ready or [r for r, state in states if state in _CONNECTING]

    # ------------------------------------------------------------------ learning

    def started(self, replica: Replica) -> None:
        replica.in_flight += 1
        replica.in_flight_gauge.inc()

    def finished(self, replica: Replica, code: grpc.StatusCode, latency_s: float | None = None) -> None:
        """An attempt on ``replica`` ended with ``code`` (OK for a success) after ``latency_s``
        (None: no latency sample, e.g. a stream)."""
        replica.in_flight -= 1
        replica.in_flight_gauge.dec()
        config = self.config
        now = self._clock()
        if code == grpc.StatusCode.OK:
            outcome = "ok"
            replica.failures = 0
            if latency_s is not None:
                replica.observe(latency_s, config.ewma_alpha)
            if replica.probing:
                if latency_s is not None and self._is_outlier(replica, latency_s):
                    self._eject(replica, "latency", now)
                else:
                    replica.probing = False
            elif (
                replica.ewma_s is not None
                and replica.samples >= config.min_samples
                and self._is_outlier(replica, replica.ewma_s)
            ):
                self._eject(replica, "latency", now)
        elif code in EJECTING_CODES:
            outcome = "failed"
            if code == grpc.StatusCode.DEADLINE_EXCEEDED and latency_s is not None:
                replica.observe(latency_s, config.ewma_alpha)  # at least this long
            replica.failures += 1
            if replica.probing or replica.failures >= config.eject_after_failures:
                self._eject(replica, "failures", now)
        else:
            outcome = "other"
            if code != grpc.StatusCode.CANCELLED:
                # It answered (a refusal of the request says nothing against the replica); a call
                # its caller gave up on says nothing either way.
                replica.probing = False
        REPLICA_CALLS.labels(self.target, replica.address, outcome).inc()

    def _is_outlier(self, replica: Replica, latency_s: float) -> bool:
        others = [
            r.ewma_s
            for r in self.replicas
            if r is not replica and r.state == "healthy" and r.ewma_s is not None
        ]
        if not others:
            return False
        reference = statistics.median(others)
        return (
            latency_s > self.config.latency_ratio * reference
            and latency_s - reference > self.config.latency_min_excess_s
        )

    def _eject(self, replica: Replica, reason: str, now: float) -> None:
        config = self.config
        out = sum(1 for r in self.replicas if r.state != "healthy")
        allowed = min(len(self.replicas) - 1, math.floor(len(self.replicas) * config.max_ejected_fraction))
        if replica.state == "healthy" and out >= allowed:
            return  # enough are out already: it stays, shielded by its calls in flight
        if now - replica.released_at > config.max_ejection_s:
            replica.strikes = 0  # healthy for a while since its last ejection
        replica.strikes += 1
        period = min(config.base_ejection_s * 2 ** (replica.strikes - 1), config.max_ejection_s)
        replica.ejected_until = now + period
        replica.ejected_for = reason
        replica.probing = False
        replica.failures = 0
        replica.ejected_gauge.set(1)
        REPLICA_EJECTIONS.labels(self.target, replica.address, reason).inc()

    def _release(self, replica: Replica, now: float) -> None:
        """An ejection that is over: probation, with a fresh latency average."""
        if replica.ejected_until and now >= replica.ejected_until:
            replica.ejected_until = 0.0
            replica.ejected_for = ""
            replica.probing = True
            replica.released_at = now
            replica.ewma_s = None
            replica.samples = 0
            replica.ejected_gauge.set(0)
