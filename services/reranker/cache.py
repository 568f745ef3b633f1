"""Scores of (query, passage) pairs the model has already run, kept per replica.

The same pairs come back often: a caller retrying after a deadline, a user asking again, an
``Ask`` after a ``Search`` of the same question, an evaluation run twice. A cross-encoder pair
costs tens of milliseconds on a CPU core; a lookup costs microseconds. Keys are digests of the
pair, so memory is bounded by the number of pairs kept, not by the texts' lengths; the least
recently used pair goes first.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

# A score and whether the pair was cut to the model's token limit.
Scored = tuple[float, bool]


def pair_key(query: str, passage: str) -> bytes:
    """A digest of the pair; the query's length up front keeps ("ab", "c") and ("a", "bc") apart."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{len(query)}:".encode())
    digest.update(query.encode())
    digest.update(passage.encode())
    return digest.digest()


class ScoreCache:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[bytes, Scored] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> Scored | None:
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
        return found

    def put(self, key: bytes, scored: Scored) -> None:
        if self.capacity <= 0:
            return
        self._entries[key] = scored
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
