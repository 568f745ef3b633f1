"""A document's front matter: the YAML (``---``) or TOML (``+++``) block at its very start, split
off its body, with its top-level scalar fields read without a parser (ingestion parses the block
fully, services.ingestion.frontmatter). Linear in the text."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from meshkit.text.markup import WHITESPACE

# Front matter: the first line is exactly the delimiter, and a later line closes it.
_FRONT_MATTER_DELIMITERS = ("---", "+++")
# Past this many lines an unclosed "---" is a thematic break, not front matter.
_MAX_FRONT_MATTER_LINES = 200


@dataclass(frozen=True)
class FrontMatter:
    """A document's front matter block, split off its body."""

    # The block's lines between the delimiters, unparsed.
    lines: tuple[str, ...]
    body: str

    def field(self, name: str) -> str:
        """A top-level scalar field (``title: X``, ``title = "X"``, or a YAML block scalar
        ``description: >-`` with indented lines), whitespace-collapsed; '' when absent."""
        for i, line in enumerate(self.lines):
            value = _field_value(line, name)
            if value is None:
                continue
            if value in (">", ">-", ">+", "|", "|-", "|+", ""):
                value = " ".join(_indented_run(self.lines, i + 1))
            return WHITESPACE.sub(" ", _unquote(value.strip())).strip()
        return ""


def split_front_matter(text: str) -> FrontMatter | None:
    """The YAML (``---``) or TOML (``+++``) front matter at the very start of ``text`` and the
    body after it, or None when there is none (no closing delimiter within
    _MAX_FRONT_MATTER_LINES lines: a leading "---" is then a thematic break)."""
    first_end = text.find("\n")
    first = text if first_end < 0 else text[:first_end]
    delimiter = first.rstrip()
    if delimiter not in _FRONT_MATTER_DELIMITERS or first_end < 0:
        return None
    lines: list[str] = []
    pos = first_end + 1
    while len(lines) <= _MAX_FRONT_MATTER_LINES:
        end = text.find("\n", pos)
        line = text[pos:] if end < 0 else text[pos:end]
        if line.rstrip() == delimiter:
            body = "" if end < 0 else text[end + 1 :]
            return FrontMatter(tuple(lines), body)
        if end < 0:
            return None
        lines.append(line)
        pos = end + 1
    return None


def _field_value(line: str, name: str) -> str | None:
    if not line.startswith(name):
        return None
    rest = line[len(name) :].lstrip(" \t")
    if rest[:1] not in (":", "="):
        return None
    return rest[1:].strip()


def _indented_run(lines: tuple[str, ...], start: int) -> Iterator[str]:
    for line in lines[start:]:
        if line.strip() and not line[:1].isspace():
            return
        yield line.strip()


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value
