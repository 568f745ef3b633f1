"""When to try again. Compare-and-set conflicts on the lifecycle's buckets and the one policy
that retries them (``RetryPolicy``: jittered exponential backoff up to a deadline, then
``Contended``), with the errors of the state store a caller treats as transient
(``STATE_STORE_ERRORS``); and the delays after which an event comes back: a busy document
(``busy_delay``), a counted failure (``counted_delay``), a transient one (``transient_delay``).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import nats.errors
import nats.js.errors

from meshkit.settings import IngestionSettings

T = TypeVar("T")


class Conflict(Exception):
    """Another writer changed the entry since it was read."""


class Contended(Exception):
    """Compare-and-set kept conflicting for the whole retry policy: try again later."""


# Infrastructure failures of the state store: the caller retries later, it costs no attempt.
STATE_STORE_ERRORS: tuple[type[BaseException], ...] = (nats.errors.Error, Contended)


@dataclass(frozen=True)
class RetryPolicy:
    """The one policy of every compare-and-set: conflicts are retried with jittered
    exponential backoff for up to ``deadline_s``, then Contended (a transient failure: the
    caller leaves its event unacknowledged, so nothing is lost)."""

    deadline_s: float = 10.0
    first_backoff_s: float = 0.005
    max_backoff_s: float = 0.25

    async def run(self, attempt: Callable[[], Awaitable[T]]) -> T:
        deadline = time.monotonic() + self.deadline_s
        delay = self.first_backoff_s
        while True:
            try:
                return await attempt()
            except Conflict as exc:
                if time.monotonic() >= deadline:
                    raise Contended(str(exc)) from exc
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(self.max_backoff_s, delay * 2)


CAS_POLICY = RetryPolicy()


# --- redelivery delays ------------------------------------------------------------------------


def busy_delay(settings: IngestionSettings, lease_left_s: float) -> float:
    """How long an event waits for a document another live worker holds: until its lease
    could have expired, at most ``ingest_busy_delay_s``."""
    return max(0.5, min(settings.ingest_busy_delay_s, lease_left_s + 0.5))


def counted_delay(settings: IngestionSettings, charged: int) -> float:
    """The delay before the next attempt after ``charged`` counted ones."""
    delays = settings.retry_backoffs() or [1.0]
    return delays[min(max(1, charged), len(delays)) - 1]


def transient_delay(settings: IngestionSettings, retries: int) -> float:
    """Capped exponential backoff with jitter for infrastructure failures."""
    first = (settings.retry_backoffs() or [1.0])[0]
    delay = min(settings.ingest_transient_backoff_max_s, first * 2 ** max(0, retries - 1))
    return float(delay * random.uniform(0.8, 1.2))
