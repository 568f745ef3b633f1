"""The answer inside a model's reply. Models wrap it (<answer>...</answer>), think aloud first
(<think>...</think>) or append notes after it; readers should see none of that, neither in the
final text nor in the streamed deltas."""

from __future__ import annotations

import re

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
_TAGS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)
_LONGEST_TAG = max(len(t) for t in _TAGS)

_THINK_START = re.compile(r"<think>", re.IGNORECASE)
_THINK_END = re.compile(r"</think>", re.IGNORECASE)
_THINK_UNCLOSED = re.compile(r"<think>.*", re.DOTALL | re.IGNORECASE)
_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL | re.IGNORECASE)
_AFTER_ANSWER = re.compile(r"</answer>.*", re.DOTALL | re.IGNORECASE)


def clean_output(text: str) -> str:
    """The answer in a whole reply: reasoning blocks and the envelope removed, anything after a
    closing </answer> dropped."""
    text = _without_think_blocks(text)
    # A reply whose opening tag the chat template swallowed: the answer follows the last </think>.
    ends = list(_THINK_END.finditer(text))
    if ends:
        text = text[ends[-1].end() :]
    # An unclosed <think>: everything after it is reasoning cut off by the token limit.
    text = _THINK_UNCLOSED.sub("", text)
    envelope = _ANSWER.search(text)
    if envelope:
        text = envelope.group(1)
    return _AFTER_ANSWER.sub("", text).strip()


def _without_think_blocks(text: str) -> str:
    """``text`` without its <think>...</think> blocks (the first closing tag after an opening one
    ends it), in one left-to-right pass. A lazy "<think>.*?</think>" pattern would scan to the
    end from every unclosed opening tag: quadratic in a reply full of them."""
    kept: list[str] = []
    pos = 0
    while (opening := _THINK_START.search(text, pos)) is not None:
        closing = _THINK_END.search(text, opening.end())
        if closing is None:
            break  # no later opening tag can be closed either
        kept.append(text[pos : opening.start()])
        pos = closing.end()
    kept.append(text[pos:])
    return "".join(kept)


class VisibleText:
    """The same rules applied to a stream of deltas: ``feed`` returns what a reader may see now,
    holding back a trailing "<..." that may still become a tag; ``flush`` returns what is held
    once the stream ends."""

    def __init__(self) -> None:
        self._pending = ""
        self._thinking = False
        self._closed = False

    def feed(self, chunk: str) -> str:
        # One pass with an index over what is pending (at most a partial tag plus ``chunk``):
        # re-slicing the pending text at every '<' would be quadratic in a reply full of them.
        pending = self._pending + chunk
        out: list[str] = []
        pos = 0
        while pos < len(pending) and not self._closed:
            start = pending.find("<", pos)
            if start < 0:
                self._show(out, pending[pos:])
                pos = len(pending)
                break
            self._show(out, pending[pos:start])
            tag = _tag_at(pending, start)
            if tag is not None:
                pos = start + len(tag)
                self._on_tag(tag)
            elif _may_become_tag(pending, start):
                pos = start
                break
            else:
                self._show(out, "<")
                pos = start + 1
        self._pending = "" if self._closed else pending[pos:]
        return "".join(out)

    def flush(self) -> str:
        rest = "" if self._thinking or self._closed else self._pending
        self._pending = ""
        return rest

    def _show(self, out: list[str], text: str) -> None:
        if not self._thinking:
            out.append(text)

    def _on_tag(self, tag: str) -> None:
        if tag == THINK_OPEN:
            self._thinking = True
        elif tag == THINK_CLOSE:
            self._thinking = False
        elif tag == ANSWER_CLOSE:
            self._closed = True


def _tag_at(text: str, start: int) -> str | None:
    """The tag (any case) that ``text`` has at ``start``, if any."""
    return next((t for t in _TAGS if text[start : start + len(t)].lower() == t), None)


def _may_become_tag(text: str, start: int) -> bool:
    """Whether ``text`` from ``start`` to its end is the beginning of a tag."""
    if len(text) - start >= _LONGEST_TAG:
        return False
    rest = text[start:].lower()
    return any(t.startswith(rest) for t in _TAGS)
