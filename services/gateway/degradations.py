"""What a search or an ask reports when a stage did not contribute: the stage, why (a reason
the caller can switch on), the downstream, a message, and what served instead. One entry per
(stage, downstream): sparse down is one degradation covering BM25 and exact, not two."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from meshkit.rpc.client import DownstreamError
from services.gateway.validation import LEGS

PLANNER, EMBEDDER, INDEX, SPARSE, HYDE = "planner", "embedder", "index", "sparse", "hyde"
INDEX_PAYLOAD = "index_payload"
UNAVAILABLE, DEADLINE, BREAKER_OPEN, ERROR = "unavailable", "deadline", "breaker_open", "error"
INVALID_OUTPUT = "invalid_output"
# The stage's model looped (a phrase repeated over and over); its looping sentences were dropped.
DEGENERATE_OUTPUT = "degenerate_output"
# DownstreamError.reason (and the LLM stages' fallback reasons) -> degradation reason
# ("rejected": the downstream refused our request, which is our error to report, not its health).
REASON_OF = {
    "unavailable": UNAVAILABLE,
    "deadline": DEADLINE,
    "breaker_open": BREAKER_OPEN,
    "invalid_output": INVALID_OUTPUT,
    "degenerate_output": DEGENERATE_OUTPUT,
}


@dataclass
class Degradation:
    stage: str
    reason: str
    target: str
    message: str
    legs: list[str] = field(default_factory=list)
    # What served instead (INDEX_PAYLOAD); "" when nothing did.
    fallback: str = ""


class Degradations:
    """Degradations of one search, one per (stage, downstream): sparse down is one entry
    covering BM25 and exact, not two."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str], Degradation] = {}

    def add(self, stage: str, reason: str, target: str, message: str, legs: Sequence[str] = ()) -> None:
        current = self.items.get((stage, target))
        if current is None:
            self.items[(stage, target)] = Degradation(stage, reason, target, message, list(legs))
            return
        current.legs = [leg for leg in LEGS if leg in current.legs or leg in legs]
        # What a call that reached the downstream saw says more than a refusal by the breaker
        # that this very search may have tripped.
        if current.reason == BREAKER_OPEN:
            current.reason = reason
        if message not in current.message:
            current.message = f"{current.message}; {message}"

    def add_error(self, stage: str, exc: DownstreamError, legs: Sequence[str] = (), what: str = "") -> None:
        reason = REASON_OF.get(exc.reason, ERROR)
        detail = f"{exc.target}: {exc.reason}: {exc.message}"
        self.add(stage, reason, exc.target, f"{what}: {detail}" if what else detail, legs)

    def note_fallback(self, stage: str, target: str, fallback: str, message: str) -> None:
        """``fallback`` served in place of ``stage`` (whose failure is already recorded, or is
        recorded now with ``message``)."""
        item = self.items.get((stage, target))
        if item is None:
            self.add(stage, ERROR, target, message)
            item = self.items[(stage, target)]
        elif message not in item.message:
            item.message = f"{item.message}; {message}"
        item.fallback = fallback

    def as_list(self) -> list[Degradation]:
        return list(self.items.values())


def from_error(stage: str, exc: DownstreamError) -> Degradation:
    """A stage's failed call, reported as Degradations.add_error reports one."""
    return Degradation(
        stage, REASON_OF.get(exc.reason, ERROR), exc.target, f"{exc.target}: {exc.reason}: {exc.message}"
    )


def from_reason(stage: str, target: str, reason_text: str) -> Degradation:
    """A stage's own "<reason>: <detail>" report (its LLM failed, it carried on without)."""
    reason, _, detail = reason_text.partition(":")
    return Degradation(
        stage, REASON_OF.get(reason.strip(), ERROR), target, reason_text if not detail else detail.strip()
    )
