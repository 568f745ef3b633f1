"""The document lifecycle's state machine: its states (``State``), the events that move a
document between them (``Event``), the transition table (``TRANSITIONS``: from, event, guard,
to, who; rendered in docs/ARCHITECTURE.md by ``transition_table``) and ``check_transition``,
which refuses a change the table does not allow.

Every state change of a document goes through ``check_transition``: the status bucket is
written in one place only (``buckets.update_status``), and that write names its event and is
checked against the table before its compare-and-set. A write outside the table raises
``IllegalTransition``, a bug, never a runtime condition. The guards are the conditions the
deciding code (``requests``, ``claims``) tests before it names an event; here they are the
text that says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final


class State(StrEnum):
    """A document's state, as its status entry stores it (the value is the stored text)."""

    NEW = "new"  # no status entry yet (only as the source of a transition)
    QUEUED = "queued"
    PROCESSING = "processing"
    INDEXED = "indexed"
    FAILED = "failed"
    DELETING = "deleting"
    DELETED = "deleted"


NEW: Final = State.NEW
QUEUED: Final = State.QUEUED
PROCESSING: Final = State.PROCESSING
INDEXED: Final = State.INDEXED
FAILED: Final = State.FAILED
DELETING: Final = State.DELETING
DELETED: Final = State.DELETED
# The states a status entry can hold (NEW is the absence of one).
STATES = (QUEUED, PROCESSING, INDEXED, FAILED, DELETING, DELETED)
FINAL_STATES = frozenset({INDEXED, FAILED, DELETED})
# States in which the document's current request still has to be processed: an event for it
# must be on the stream (the reconciler sees to it).
PENDING_STATES = frozenset({QUEUED, PROCESSING, DELETING})


class Event(StrEnum):
    """What happens to a document; the value is the name the table shows."""

    SUBMIT = "submit"
    DELETE = "delete"
    REQUEST_WHILE_CLAIMED = "submit / delete"
    CLAIM = "claim"
    GIVE_UP = "give up"
    RENEW = "renew"
    SUCCEED = "succeed"
    SUCCEED_DELETE = "succeed (delete)"
    FINISH_SUPERSEDED = "finish (superseded)"
    FINISH_SUPERSEDED_BY_DELETE = "finish (superseded by a delete)"
    FAIL_PERMANENTLY = "fail permanently"
    FAIL_TRANSIENTLY = "fail transiently"
    FAIL_TRANSIENTLY_DELETE = "fail transiently (delete)"
    FAIL_TRANSIENTLY_PAST_WINDOW = "fail transiently past the window"
    FAIL_COUNTED = "fail (counted)"
    FAIL_COUNTED_DELETE = "fail (counted, delete)"
    FAIL_COUNTED_LAST = "fail (counted, last)"
    REPLAY = "replay"
    REPLAY_DELETE = "replay (delete)"


@dataclass(frozen=True)
class Transition:
    sources: tuple[State, ...]
    event: Event
    guard: str
    target: State
    who: str


_WAITING = (QUEUED, DELETING)
_ANY_REQUESTABLE = (NEW, QUEUED, DELETING, INDEXED, FAILED, DELETED)
_HOLDS = "holds the claim (owner and fence)"
TRANSITIONS: tuple[Transition, ...] = (
    Transition(
        _ANY_REQUESTABLE,
        Event.SUBMIT,
        "the bytes differ from the indexed and the pending version",
        QUEUED,
        "API",
    ),
    Transition((QUEUED, INDEXED, FAILED), Event.DELETE, "not deleted, no delete pending", DELETING, "API"),
    Transition(
        (PROCESSING,),
        Event.REQUEST_WHILE_CLAIMED,
        "a worker holds the claim: kept, only the request changes",
        PROCESSING,
        "API",
    ),
    Transition(
        (*_WAITING, PROCESSING),
        Event.CLAIM,
        "event is the current request; lease expired or own claim; charged < max",
        PROCESSING,
        "worker",
    ),
    Transition(
        (*_WAITING, PROCESSING),
        Event.GIVE_UP,
        "event is the current request; charged >= max",
        FAILED,
        "worker",
    ),
    Transition((PROCESSING,), Event.RENEW, _HOLDS, PROCESSING, "worker (heartbeat)"),
    Transition((PROCESSING,), Event.SUCCEED, f"{_HOLDS}; request still current", INDEXED, "worker"),
    Transition((PROCESSING,), Event.SUCCEED_DELETE, f"{_HOLDS}; request still current", DELETED, "worker"),
    Transition(
        (PROCESSING,), Event.FINISH_SUPERSEDED, f"{_HOLDS}; a newer request was recorded", QUEUED, "worker"
    ),
    Transition(
        (PROCESSING,),
        Event.FINISH_SUPERSEDED_BY_DELETE,
        f"{_HOLDS}; a newer delete was recorded",
        DELETING,
        "worker",
    ),
    Transition(
        (PROCESSING,), Event.FAIL_PERMANENTLY, f"{_HOLDS}; the document cannot be processed", FAILED, "worker"
    ),
    Transition(
        (PROCESSING,),
        Event.FAIL_TRANSIENTLY,
        f"{_HOLDS}; within the retry window; charge given back",
        QUEUED,
        "worker",
    ),
    Transition(
        (PROCESSING,), Event.FAIL_TRANSIENTLY_DELETE, f"{_HOLDS}; as above, for a delete", DELETING, "worker"
    ),
    Transition(
        (PROCESSING,),
        Event.FAIL_TRANSIENTLY_PAST_WINDOW,
        f"{_HOLDS}; failing longer than the window",
        FAILED,
        "worker",
    ),
    Transition((PROCESSING,), Event.FAIL_COUNTED, f"{_HOLDS}; charged < max", QUEUED, "worker"),
    Transition((PROCESSING,), Event.FAIL_COUNTED_DELETE, f"{_HOLDS}; charged < max", DELETING, "worker"),
    Transition((PROCESSING,), Event.FAIL_COUNTED_LAST, f"{_HOLDS}; charged >= max", FAILED, "worker"),
    Transition(
        (FAILED,), Event.REPLAY, "the dead letter's request is the current one", QUEUED, "API (operator)"
    ),
    Transition(
        (FAILED,),
        Event.REPLAY_DELETE,
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
    """Pass if the table moves a document in ``source`` on ``event`` to ``target``; else raise
    IllegalTransition naming the three."""
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
