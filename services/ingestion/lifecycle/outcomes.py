"""What the workers' side of the lifecycle answers: a claim (``Claim`` or why not: ``Skip``,
``Busy``, ``GiveUp``), the outcome a worker reports (``Success``, ``Failure`` and its kinds) and
what recording it did (``Done``, ``Superseded``, ``Retry``, ``Lost``), and ``ClaimLost``, raised
when a write finds its claim taken over.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from services.ingestion.events import IngestEvent
from services.ingestion.lifecycle.entries import DocStatus


class ClaimLost(Exception):
    """The claim was taken over (its lease expired and another worker claimed the document):
    nothing may be written under it any more."""


PERMANENT: Final = "permanent"
TRANSIENT: Final = "transient"
COUNTED: Final = "counted"
FailureKind = Literal["permanent", "transient", "counted"]


@dataclass(frozen=True)
class Failure:
    """Why processing failed. permanent: retrying cannot help (dead-letter now); transient:
    infrastructure, retried for a window without counting; counted: anything else."""

    reason: str
    kind: FailureKind


@dataclass(frozen=True)
class Success:
    indexed_sha256: str
    chunks: int
    deleted: bool


@dataclass
class Claim:
    """A worker's hold on a document's current request."""

    event: IngestEvent
    owner: str
    fence: int
    status: DocStatus
    lost: bool = False

    @property
    def key(self) -> str:
        return self.event.key


@dataclass(frozen=True)
class Skip:
    """Nothing to do for this event (superseded, already done): ack it. ``superseded``: its
    request was replaced, so its bytes may be dropped."""

    why: str
    superseded: bool = False


@dataclass(frozen=True)
class Busy:
    """Another live worker holds the document: look again after ``delay_s`` (costs nothing)."""

    delay_s: float


@dataclass(frozen=True)
class GiveUp:
    """The document is FAILED: dead-letter the event with this reason and terminate it."""

    reason: str
    attempts: int


@dataclass(frozen=True)
class Retry:
    delay_s: float


@dataclass(frozen=True)
class Done:
    pass


@dataclass(frozen=True)
class Superseded:
    """A newer request was recorded while the claim ran; it waits for its own event."""


@dataclass(frozen=True)
class Lost:
    pass


ClaimResult = Claim | Skip | Busy | GiveUp
FinishResult = Done | Superseded | Retry | GiveUp | Lost
