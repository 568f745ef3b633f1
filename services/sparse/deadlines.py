"""The caller's deadline inside the exact leg, which runs in threads that cannot be cancelled."""

from __future__ import annotations

import time


class DeadlinePassed(Exception):
    """The caller's deadline passed while the exact leg was still working."""


def check_deadline(deadline: float | None) -> None:
    """Raise DeadlinePassed once ``deadline`` (time.monotonic) has passed: the exact leg runs
    in a thread, which cannot be cancelled, so its loops check this instead."""
    if deadline is not None and time.monotonic() >= deadline:
        raise DeadlinePassed("the exact search ran out of time (the caller's deadline)")
