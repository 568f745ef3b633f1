"""Front matter (YAML ``---`` or TOML ``+++`` at the top of a Markdown page: Hugo, Jekyll,
Obsidian) parsed into the page's title, description and filterable metadata.

Metadata values are strings (meshkit.domain.metadata): scalars become their text, lists of scalars a
", "-joined string, nested tables dotted keys (``params.author``). Tags are multi-valued, and a
filter compares one value, so each tag also gets a key of its own: ``tag:<name>`` = "true"
(filter with ``exists tag:grpc`` or ``tag:grpc eq true``). Everything is bounded: the block's
size before parsing, the nodes visited while flattening (YAML aliases can make a small block
a huge tree), the number of keys and the length of values. A block that does not parse, or
does not parse into a table, is not front matter: the caller keeps it as body text.
"""

from __future__ import annotations

import datetime
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from meshkit.domain.metadata import MAX_KEY_CHARS, MAX_METADATA_ENTRIES, key_problem
from meshkit.text.front_matter import FrontMatter

# A front matter block larger than this is not parsed (kept as body): page metadata is small.
MAX_FRONT_MATTER_CHARS = 16_384
# Keys taken from one page's front matter (the stores accept 64 in all, the caller's included).
MAX_FRONT_MATTER_KEYS = 32
MAX_VALUE_CHARS = 512
# Values visited while flattening, whatever the nesting or aliasing.
MAX_NODES = 2_000
MAX_DEPTH = 4
# Keys whose list values are tags (Hugo: tags, keywords, categories; Obsidian: tags).
TAG_KEYS = ("tags", "tag", "keywords", "categories")
TAG_KEY_PREFIX = "tag:"
TRUE = "true"
# Fields that are the page's title and lead text, not metadata.
TITLE_KEY = "title"
DESCRIPTION_KEY = "description"

_KEY_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-")


@dataclass(frozen=True)
class ParsedFrontMatter:
    title: str
    description: str
    metadata: dict[str, str] = field(default_factory=dict)
    tags: tuple[str, ...] = ()


def parse_front_matter(front: FrontMatter, delimiter: str) -> ParsedFrontMatter | None:
    """The block's title, description, tags and metadata; None when it is not a valid table
    (malformed YAML/TOML, a scalar, too large): the caller keeps it as body."""
    raw = "\n".join(front.lines)
    if len(raw) > MAX_FRONT_MATTER_CHARS:
        return None
    table = _load(raw, delimiter)
    if not isinstance(table, dict):
        return None
    flat = _Flattener()
    for key, value in table.items():
        # "_build", "_target": site generator build options, not page metadata.
        if not str(key).startswith("_"):
            flat.add(str(key), value, 0)
    title = _scalar_text(table.get(TITLE_KEY))
    description = _scalar_text(table.get(DESCRIPTION_KEY))
    tags = tag_names(flat.tags)
    metadata = {k: v for k, v in flat.values.items() if k not in (TITLE_KEY, DESCRIPTION_KEY)}
    return ParsedFrontMatter(title, description, metadata, tags)


def _load(raw: str, delimiter: str) -> Any:
    try:
        if delimiter == "+++":
            return tomllib.loads(raw)
        # safe_load builds plain Python values only (no arbitrary objects).
        return yaml.safe_load(raw)
    except (yaml.YAMLError, tomllib.TOMLDecodeError, ValueError, RecursionError):
        return None


def _scalar_text(value: Any) -> str:
    if isinstance(value, str | int | float | bool | datetime.date):
        return " ".join(_text(value).split())
    return ""


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return TRUE if value else "false"
    if isinstance(value, datetime.date):
        return value.isoformat()
    return str(value)


def _is_scalar(value: Any) -> bool:
    return isinstance(value, str | int | float | bool | datetime.date)


class _Flattener:
    """Front matter values as string metadata, within the node and key budgets."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.tags: list[str] = []
        self._nodes = 0

    def add(self, key: str, value: Any, depth: int) -> None:
        self._nodes += 1
        if self._nodes > MAX_NODES or depth > MAX_DEPTH:
            return
        name = metadata_key(key)
        if name is None:
            return
        if key.lower() in TAG_KEYS and isinstance(value, str | list):
            items = value.replace(",", " ").split() if isinstance(value, str) else value
            self.tags.extend(_text(item) for item in self._scalars(items))
        if isinstance(value, dict):
            for child_key, child in value.items():
                self.add(f"{name}.{child_key}", child, depth + 1)
        elif isinstance(value, list):
            self._put(name, ", ".join(_text(item) for item in self._scalars(value)))
        elif value is not None and _is_scalar(value):
            self._put(name, _text(value))

    def _scalars(self, items: Iterable[Any]) -> list[Any]:
        found = []
        for item in items:
            self._nodes += 1
            if self._nodes > MAX_NODES:
                break
            if _is_scalar(item):
                found.append(item)
        return found

    def _put(self, key: str, value: str) -> None:
        value = " ".join(value.split())[:MAX_VALUE_CHARS]
        if value and (key in self.values or len(self.values) < MAX_FRONT_MATTER_KEYS):
            self.values[key] = value


def metadata_key(raw: str) -> str | None:
    """``raw`` as a metadata key a filter can name (characters outside [A-Za-z0-9_.:-]
    become '_'), or None when nothing usable is left."""
    key = "".join(c if c in _KEY_SAFE else "_" for c in raw.strip())[:MAX_KEY_CHARS]
    return None if key_problem(key) or not key.strip("_") else key


def tag_names(raw: Iterable[str]) -> tuple[str, ...]:
    """Tags as Obsidian compares them: without a leading '#', case-folded, each once, in order."""
    seen: dict[str, None] = {}
    for tag in raw:
        name = tag.strip().lstrip("#").casefold()
        if name:
            seen.setdefault(name, None)
    return tuple(seen)


def tag_metadata(tags: Iterable[str], budget: int) -> dict[str, str]:
    """``tags`` (joined) plus one ``tag:<name>`` key per tag, at most ``budget`` keys."""
    names = tag_names(tags)
    if not names or budget <= 0:
        return {}
    metadata = {"tags": ", ".join(names)[:MAX_VALUE_CHARS]}
    for name in names:
        if len(metadata) >= budget:
            break
        key = metadata_key(TAG_KEY_PREFIX + name.replace("/", "."))
        if key is not None:
            metadata[key] = TRUE
    return metadata


def merged_metadata(document: Mapping[str, str], caller: Mapping[str, str]) -> dict[str, str]:
    """The metadata stored with a document: the caller's keys, then as many of the document's
    own (front matter, tags) as the stores' limit leaves room for; a caller's key wins."""
    merged = dict(caller)
    for key, value in document.items():
        if len(merged) >= MAX_METADATA_ENTRIES:
            break
        merged.setdefault(key, value)
    return merged
