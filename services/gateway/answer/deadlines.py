"""An Ask's time: each step runs under its share of the caller's deadline (the search a fixed
share, extraction a share of what is left, narration the rest), so a slow LLM costs the
answer's quality, never its arrival. Inside a step's scope every downstream call sees the
step's end as the caller's deadline."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from meshkit.core.errors import deadline_exceeded
from meshkit.rpc.interceptors import deadline_var

# Time kept back from the narrator to build and send the final reply.
REPLY_MARGIN_S = 0.1


def ask_end(timeout_s: float) -> float:
    """When the whole Ask must be answered: the caller's deadline, else ``timeout_s`` from now."""
    now = time.monotonic()
    inbound = deadline_var.get()
    end = now + timeout_s if inbound is None else inbound
    if end <= now:
        raise deadline_exceeded("the deadline passed before the ask started")
    return end


def share_of(end: float, share: float) -> float:
    """The end of a step given ``share`` of the time left until ``end``."""
    now = time.monotonic()
    return now + (end - now) * share


@contextlib.contextmanager
def deadline_scope(deadline: float) -> Iterator[None]:
    """Downstream calls made inside see ``deadline`` as the caller's (never a later one)."""
    current = deadline_var.get()
    token = deadline_var.set(deadline if current is None else min(current, deadline))
    try:
        yield
    finally:
        deadline_var.reset(token)


def scope_left() -> float:
    """Seconds left in the current deadline scope (a step's share; see deadline_scope). Passed
    as the call's timeout: without one the client would cap the call at its default timeout,
    far shorter than an LLM step's share."""
    deadline = deadline_var.get()
    assert deadline is not None, "called outside a deadline scope"
    return deadline - time.monotonic()
