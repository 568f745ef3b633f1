"""Obsidian (and other wiki-style) Markdown: ``[[Note]]`` links read as the text a reader sees,
``![[embed]]`` embeds dropped, inline ``#tags`` collected.

- ``[[Note]]`` -> "Note" (the target note's title: Obsidian titles a note by its file name, so
  a path and a ``.md`` extension go); ``[[Note|alias]]`` -> "alias"; ``[[Note#Heading]]`` ->
  "Note > Heading"; ``[[#Heading]]`` -> "Heading"; block references (``#^id``) are dropped.
- ``![[file]]`` (an embedded note, image or PDF) is dropped: its text is indexed where it lives.
- ``#tag``: a '#' at the start of a line or after whitespace, followed by letters, digits,
  '_', '-' or '/', with at least one non-digit (``#123`` is not a tag; ``# Heading`` is not
  either). Tags stay in the text and are returned for the metadata.

Fenced code blocks and inline code spans are left alone. Every scan is a single pass with
``str.find`` and a cached next-closer position: linear in the text whatever it holds.
"""

from __future__ import annotations

from dataclasses import dataclass

# A link longer than this is not a link (an unclosed "[[" must not swallow a page).
MAX_LINK_CHARS = 512
MAX_TAG_CHARS = 100
MAX_TAGS = 64
_OPEN, _CLOSE = "[[", "]]"
_FENCES = ("```", "~~~")
_TAG_PUNCTUATION = frozenset("_-/")


@dataclass(frozen=True)
class VaultText:
    markdown: str
    tags: tuple[str, ...]


def resolve_vault_markdown(markdown: str) -> VaultText:
    """``markdown`` with wikilinks resolved and embeds dropped, and its inline tags."""
    if _OPEN not in markdown and "#" not in markdown:
        return VaultText(markdown, ())
    out: list[str] = []
    tags: list[str] = []
    fence = ""
    for line in markdown.split("\n"):
        stripped = line.lstrip(" ")
        if fence:
            if stripped.startswith(fence):
                fence = ""
            out.append(line)
            continue
        opener = next((f for f in _FENCES if stripped.startswith(f)), "")
        if opener and len(line) - len(stripped) <= 3:
            fence = opener
            out.append(line)
            continue
        out.append(_resolve_line(line, tags))
    return VaultText("\n".join(out), tuple(dict.fromkeys(tags))[:MAX_TAGS])


def _resolve_line(line: str, tags: list[str]) -> str:
    """One line outside fenced code: its inline code spans (between backticks) kept as they
    are, the rest resolved."""
    if "`" not in line:
        return _resolve_prose(line, tags)
    parts = line.split("`")
    # Even parts are outside code spans; an unmatched last backtick leaves its tail as prose.
    return "`".join(_resolve_prose(p, tags) if i % 2 == 0 else p for i, p in enumerate(parts))


def _resolve_prose(text: str, tags: list[str]) -> str:
    if "#" in text:
        tags.extend(inline_tags(text))
    return resolve_wikilinks(text) if _OPEN in text else text


def resolve_wikilinks(text: str) -> str:
    out: list[str] = []
    pos = 0
    close = -1  # the next "]]" at or after the current opener (cached: positions only grow)
    while True:
        start = text.find(_OPEN, pos)
        if start < 0:
            break
        if close < start + 2:
            close = text.find(_CLOSE, start + 2)
        if close < 0:
            break
        # Length first: slicing a far-away closer's text for every opener would be quadratic.
        target = text[start + 2 : close] if close - start - 2 <= MAX_LINK_CHARS else None
        if target is None or _OPEN in target or "\n" in target:
            # Not a link; this opener's text stays and the scan goes on after it.
            out.append(text[pos : start + 1])
            pos = start + 1
            continue
        embed = start > 0 and text[start - 1] == "!"
        out.append(text[pos : start - 1 if embed else start])
        if not embed:
            out.append(link_text(target))
        pos = close + 2
    out.append(text[pos:])
    return "".join(out)


def link_text(target: str) -> str:
    """What a reader sees for the link ``[[target]]``."""
    note, bar, alias = target.partition("|")
    if bar and alias.strip():
        return alias.strip()
    name, _hash, heading = note.partition("#")
    title = _note_title(name)
    heading = "" if heading.startswith("^") else heading.strip()
    if title and heading:
        return f"{title} > {heading}"
    return title or heading


def _note_title(name: str) -> str:
    base = name.strip().rsplit("/", 1)[-1]
    return base[:-3] if base.lower().endswith(".md") else base


def inline_tags(text: str) -> list[str]:
    """The ``#tags`` of a prose fragment, without the '#', in order."""
    found: list[str] = []
    pos = 0
    while True:
        hash_at = text.find("#", pos)
        if hash_at < 0:
            return found
        end = hash_at + 1
        if hash_at == 0 or text[hash_at - 1].isspace():
            while end < len(text) and (text[end].isalnum() or text[end] in _TAG_PUNCTUATION):
                end += 1
            tag = text[hash_at + 1 : end]
            if tag and len(tag) <= MAX_TAG_CHARS and not tag.isdigit() and not tag.strip("_-/").isdigit():
                found.append(tag)
        pos = end
