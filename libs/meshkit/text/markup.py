"""Markup out of untrusted text, in linear time: template tags and shortcodes (``{{< >}}``,
``{{% %}}``, ``{% %}``, ``{{ }}``; the text between a paired shortcode's tags stays), HTML
comments and tags, and inline Markdown (links keep their text, images their alt text, inline
code and emphasis their content). Every step is a scan with ``str.find`` or a regex that cannot
backtrack over a run. Ingestion (``services.ingestion.normalize``) strips template tags with the
same code as the evidence sentences (meshkit.text.evidence)."""

from __future__ import annotations

import html
import re

# (opener, closer) of template tags: Hugo shortcodes, Jinja/GitBook/Liquid tags, then Jinja/Go
# template expressions. Longer openers first: "{{<" must not be read as "{{".
HUGO_SHORTCODES: tuple[tuple[str, str], ...] = (("{{<", ">}}"), ("{{%", "%}}"))
TEMPLATE_TAGS: tuple[tuple[str, str], ...] = (*HUGO_SHORTCODES, ("{%", "%}"), ("{{", "}}"))
_HTML_COMMENT = ("<!--", "-->")

# A tag: "<" then a letter, "/" or "!" and anything up to ">" that is not "<", ">" or a line
# break. Each failed attempt stops at the next "<", so attempts never rescan a run.
_HTML_TAG = re.compile(r"<[A-Za-z/!][^<>\n]*>")
# ![alt](target) -> alt; [text](target) -> text. The bracket and parenthesis contents exclude
# their own delimiters, so a failed attempt stops at the next "[" or "(" (no rescan).
_IMAGE = re.compile(r"!\[([^\[\]\n]*)\]\([^()\n]*\)")
_LINK = re.compile(r"\[([^\[\]\n]*)\]\([^()\n]*\)")
# [text][ref] and [text][] reference links -> text.
_REF_LINK = re.compile(r"\[([^\[\]\n]*)\]\[[^\[\]\n]*\]")
# *emphasis* -> emphasis; a star inside a word or a number ("HLA-B*27", "(*2*2)") stays. The
# content cannot hold a star, so an attempt never scans past the next one.
_EMPHASIS = re.compile(r"(?<!\w)\*([^*\s][^*\n]*?)\*(?!\w)")
# What is left in brackets after links: a shortcut reference link ("[PING frame]") keeps its
# text; brackets holding an abbreviation or a statistic ("[RR]", "[n = 83]", "[1]") stay.
_BRACKETED = re.compile(r"\[([A-Za-z][\w .&/+#'\-]*)\]")
# Runs of whitespace, collapsed to one space.
WHITESPACE = re.compile(r"\s+")


def strip_tags(text: str, pairs: tuple[tuple[str, str], ...] = TEMPLATE_TAGS) -> str:
    """``text`` without the template tags delimited by ``pairs`` (each (opener, closer); the
    text between a paired shortcode's opening and closing tags stays, only the tags go). A tag
    does not span a blank line: an opener whose closer lies past the next paragraph break (or
    nowhere) is left as text, so one stray "{{" cannot swallow the rest of a document.

    Linear: the next closer and the next blank line after a position are looked up with
    cursors that only move forward, so no stretch of text is searched twice."""
    closers = [_NextOccurrence(text, closer) for _, closer in pairs]
    breaks = _NextOccurrence(text, "\n\n")
    out: list[str] = []
    pos = scan = 0
    while True:
        brace = text.find("{", scan)
        if brace < 0:
            break
        end = _tag_end(text, brace, pairs, closers, breaks)
        if end is None:
            scan = brace + 1
            continue
        out.append(text[pos:brace])
        pos = scan = end
    out.append(text[pos:])
    return "".join(out)


class _NextOccurrence:
    """The first occurrence of ``needle`` at or after a position, for non-decreasing positions."""

    def __init__(self, text: str, needle: str) -> None:
        self._text = text
        self._needle = needle
        self._found = -1  # the last answer; -1: none yet
        self._none_after = len(text) + 1  # no occurrence at or after this position

    def at_or_after(self, position: int) -> int | None:
        if position <= self._found:
            return self._found
        if position >= self._none_after:
            return None
        found = self._text.find(self._needle, position)
        if found < 0:
            self._none_after = position
            return None
        self._found = found
        return found


def _tag_end(
    text: str,
    start: int,
    pairs: tuple[tuple[str, str], ...],
    closers: list[_NextOccurrence],
    breaks: _NextOccurrence,
) -> int | None:
    """Where the tag opening at ``start`` ends (past its closer), or None: no tag there."""
    for (opener, closer), closers_of_kind in zip(pairs, closers, strict=True):
        if not text.startswith(opener, start):
            continue
        close = closers_of_kind.at_or_after(start + len(opener))
        if close is None:
            continue
        blank = breaks.at_or_after(start)
        if blank is not None and blank < close:
            continue
        return close + len(closer)
    return None


def strip_html_comments(text: str) -> str:
    """``text`` without ``<!-- ... -->`` comments; an unclosed one runs to the end."""
    opener, closer = _HTML_COMMENT
    out: list[str] = []
    pos = 0
    while True:
        start = text.find(opener, pos)
        if start < 0:
            break
        out.append(text[pos:start])
        close = text.find(closer, start + len(opener))
        if close < 0:
            return "".join(out)
        pos = close + len(closer)
    out.append(text[pos:])
    return "".join(out)


def inline_text(text: str) -> str:
    """Text without inline markup: images -> alt text, links -> their text, HTML tags out,
    inline code and emphasis markers dropped (their content stays), character references
    (``&gt;``, ``&#62;``) decoded."""
    # Each pass only runs when its opening character is there: most prose has none of them.
    if "<" in text:
        text = _HTML_TAG.sub("", strip_html_comments(text))
    if "{" in text:
        text = strip_tags(text)
    if "[" in text:
        text = _IMAGE.sub(r"\1", text)
        text = _LINK.sub(r"\1", text)
        text = _REF_LINK.sub(r"\1", text)
        text = _BRACKETED.sub(_unbracket_label, text)
    text = _EMPHASIS.sub(r"\1", text.replace("`", "").replace("**", ""))
    if "&" in text:
        # Character references as a reader sees them ("&gt;=" is ">="), after the tags are out so
        # an escaped tag ("&lt;b&gt;") stays text; html.unescape reads each reference in bounded steps.
        text = html.unescape(text)
    return WHITESPACE.sub(" ", text).strip()


def _unbracket_label(match: re.Match[str]) -> str:
    label = match.group(1)
    return label if any(c.islower() for c in label) else match.group(0)
