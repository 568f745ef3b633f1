"""Where each collection is in a replicated log (meshkit.replication.log): the reader's cursor, the
collections restored past it, and the positions file a store saves them in."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshkit.core.fsutil import write_atomic


@dataclass
class Positions:
    """How far each collection is in the log. Collections not in ``ahead`` are exactly at
    ``cursor`` (the reader's position: every entry up to it has been applied to the collection
    it names); ``ahead`` holds collections already past it (they skip what they hold)."""

    cursor: int = 0
    ahead: dict[str, int] = field(default_factory=dict)
    log_id: str = ""

    def of(self, name: str) -> int:
        return max(self.ahead.get(name, 0), self.cursor)

    def needs(self, name: str, seq: int) -> bool:
        return seq > self.of(name)

    def advance(self, seq: int) -> None:
        self.cursor = max(self.cursor, seq)
        if self.ahead:
            self.ahead = {n: p for n, p in self.ahead.items() if p > self.cursor}

    def place(self, name: str, pos: int) -> bool:
        """Put a (restored) collection at ``pos``; True when the reader must rewind for it."""
        if pos >= self.cursor:
            if pos > self.cursor:
                self.ahead[name] = pos
            else:
                self.ahead.pop(name, None)
            return False
        return True

    def rewind(self, to: int, names: Sequence[str]) -> None:
        """Move the reader back to ``to``; ``names`` (the live collections) keep their place."""
        for name in names:
            self.ahead[name] = self.of(name)
        self.cursor = to
        self.ahead = {n: p for n, p in self.ahead.items() if p > to}

    def forget(self, name: str) -> None:
        self.ahead.pop(name, None)

    def restart(self, log_id: str) -> None:
        """The log was recreated: its sequences start again, so do all positions."""
        self.cursor = 0
        self.ahead.clear()
        self.log_id = log_id

    def dump(self, names: Sequence[str]) -> dict[str, Any]:
        return {"log": self.log_id, "cursor": self.cursor, "collections": {n: self.of(n) for n in names}}

    def save(self, path: Path, names: Sequence[str], extra: Mapping[str, Any] | None = None) -> None:
        data = {**self.dump(sorted(names)), **(extra or {})}
        write_atomic(path, json.dumps(data, sort_keys=True).encode())


def load_positions(path: Path) -> dict[str, Any]:
    """A positions file as saved (empty when there is none)."""
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return data
