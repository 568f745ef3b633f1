"""A document's lifecycle states and the state machine between them: ``TRANSITIONS`` (rendered
in docs/ARCHITECTURE.md) and ``check_transition``, which every write of the lifecycle
(services/ingestion/lifecycle.py) passes before its compare-and-set.
"""

from __future__ import annotations

from dataclasses import dataclass

NEW = "new"  # no status entry yet (only as the source of a transition)
QUEUED = "queued"
PROCESSING = "processing"
INDEXED = "indexed"
FAILED = "failed"
DELETING = "deleting"
DELETED = "deleted"
STATES = (QUEUED, PROCESSING, INDEXED, FAILED, DELETING, DELETED)
FINAL_STATES = frozenset({INDEXED, FAILED, DELETED})
# States in which the document's current request still has to be processed: an event for it
# must be on the stream (the reconciler sees to it).
PENDING_STATES = frozenset({QUEUED, PROCESSING, DELETING})


@dataclass(frozen=True)
class Transition:
    sources: tuple[str, ...]
    event: str
    guard: str
    target: str
    who: str


_WAITING = (QUEUED, DELETING)
_ANY_REQUESTABLE = (NEW, QUEUED, DELETING, INDEXED, FAILED, DELETED)
_HOLDS = "holds the claim (owner and fence)"
TRANSITIONS: tuple[Transition, ...] = (
    Transition(
        _ANY_REQUESTABLE, "submit", "the bytes differ from the indexed and the pending version", QUEUED, "API"
    ),
    Transition((QUEUED, INDEXED, FAILED), "delete", "not deleted, no delete pending", DELETING, "API"),
    Transition(
        (PROCESSING,),
        "submit / delete",
        "a worker holds the claim: kept, only the request changes",
        PROCESSING,
        "API",
    ),
    Transition(
        (*_WAITING, PROCESSING),
        "claim",
        "event is the current request; lease expired or own claim; charged < max",
        PROCESSING,
        "worker",
    ),
    Transition(
        (*_WAITING, PROCESSING), "give up", "event is the current request; charged >= max", FAILED, "worker"
    ),
    Transition((PROCESSING,), "renew", _HOLDS, PROCESSING, "worker (heartbeat)"),
    Transition((PROCESSING,), "succeed", f"{_HOLDS}; request still current", INDEXED, "worker"),
    Transition((PROCESSING,), "succeed (delete)", f"{_HOLDS}; request still current", DELETED, "worker"),
    Transition(
        (PROCESSING,), "finish (superseded)", f"{_HOLDS}; a newer request was recorded", QUEUED, "worker"
    ),
    Transition(
        (PROCESSING,),
        "finish (superseded by a delete)",
        f"{_HOLDS}; a newer delete was recorded",
        DELETING,
        "worker",
    ),
    Transition(
        (PROCESSING,), "fail permanently", f"{_HOLDS}; the document cannot be processed", FAILED, "worker"
    ),
    Transition(
        (PROCESSING,),
        "fail transiently",
        f"{_HOLDS}; within the retry window; charge given back",
        QUEUED,
        "worker",
    ),
    Transition(
        (PROCESSING,), "fail transiently (delete)", f"{_HOLDS}; as above, for a delete", DELETING, "worker"
    ),
    Transition(
        (PROCESSING,),
        "fail transiently past the window",
        f"{_HOLDS}; failing longer than the window",
        FAILED,
        "worker",
    ),
    Transition((PROCESSING,), "fail (counted)", f"{_HOLDS}; charged < max", QUEUED, "worker"),
    Transition((PROCESSING,), "fail (counted, delete)", f"{_HOLDS}; charged < max", DELETING, "worker"),
    Transition((PROCESSING,), "fail (counted, last)", f"{_HOLDS}; charged >= max", FAILED, "worker"),
    Transition((FAILED,), "replay", "the dead letter's request is the current one", QUEUED, "API (operator)"),
    Transition(
        (FAILED,),
        "replay (delete)",
        "the dead letter's request is the current one",
        DELETING,
        "API (operator)",
    ),
)
# Not a transition: the reconciler republishes the current request's event of a document in
# a pending state that has no event on the stream (whatever crashed between a status write and
# its publish); the status is left as it is.


class IllegalTransition(AssertionError):
    """A write that does not follow TRANSITIONS: a bug, never a runtime condition."""


def check_transition(source: str, event: str, target: str) -> None:
    for t in TRANSITIONS:
        if t.event == event and source in t.sources and t.target == target:
            return
    raise IllegalTransition(f"{source} --{event}--> {target} is not in the lifecycle's transition table")


def transition_table() -> str:
    """TRANSITIONS as the Markdown table docs/ARCHITECTURE.md carries (a test keeps them equal)."""
    rows = ["| From | Event | Guard | To | Who |", "|---|---|---|---|---|"]
    for t in TRANSITIONS:
        rows.append(f"| {', '.join(t.sources)} | {t.event} | {t.guard} | {t.target} | {t.who} |")
    return "\n".join(rows)
