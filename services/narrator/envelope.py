"""The answer inside a model's reply. Models wrap it (<answer>...</answer>), think aloud first
(<think>...</think>) or append notes after it; readers should see none of that, neither in the
final text nor in the streamed deltas."""

from __future__ import annotations

import re

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
_TAGS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_THINK_END = re.compile(r"</think>", re.IGNORECASE)
_THINK_UNCLOSED = re.compile(r"<think>.*", re.DOTALL | re.IGNORECASE)
_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL | re.IGNORECASE)
_AFTER_ANSWER = re.compile(r"</answer>.*", re.DOTALL | re.IGNORECASE)


def clean_output(text: str) -> str:
    """The answer in a whole reply: reasoning blocks and the envelope removed, anything after a
    closing </answer> dropped."""
    text = _THINK_BLOCK.sub("", text)
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


class VisibleText:
    """The same rules applied to a stream of deltas: ``feed`` returns what a reader may see now,
    holding back a trailing "<..." that may still become a tag; ``flush`` returns what is held
    once the stream ends."""

    def __init__(self) -> None:
        self._pending = ""
        self._thinking = False
        self._closed = False

    def feed(self, chunk: str) -> str:
        self._pending += chunk
        out: list[str] = []
        while self._pending and not self._closed:
            start = self._pending.find("<")
            if start < 0:
                self._show(out, self._pending)
                self._pending = ""
                break
            self._show(out, self._pending[:start])
            self._pending = self._pending[start:]
            head = self._pending.lower()
            tag = next((t for t in _TAGS if head.startswith(t)), None)
            if tag is not None:
                self._pending = self._pending[len(tag) :]
                self._on_tag(tag)
            elif any(t.startswith(head) for t in _TAGS):
                break
            else:
                self._show(out, "<")
                self._pending = self._pending[1:]
        if self._closed:
            self._pending = ""
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
