"""A model's reply read as data: the JSON value in it (``extract_json``: the whole text, a fenced
block, or an object embedded in prose, in linear time), a validated pydantic model
(``parse_structured``), or the valid items of a list (``validate_items``)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from meshkit.llm.common import LLMError, ModelT

_FENCE_MARK = "```"
_FENCE_LANGUAGE = re.compile(r"[a-zA-Z]*")
# Work allowed for finding an object embedded in prose, as a multiple of the reply's length:
# each '{' is a try that may read to the end of the reply, so without a bound a reply full of
# unclosed braces costs quadratic time.
_EMBEDDED_JSON_WORK_FACTOR = 4


def extract_json(text: str) -> Any:
    """The JSON value in a model's reply: the whole text, a fenced block, or the first object
    embedded in surrounding prose. Raises ValueError when there is none."""
    candidates = [text.strip()]
    fenced = _fenced_block(text)
    if fenced is not None:
        candidates.append(fenced.strip())
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except (ValueError, RecursionError):
            pass
    return _embedded_object(text)


def _fenced_block(text: str) -> str | None:
    """The body of the first fenced block: what the lazy pattern "```[a-zA-Z]*\\s*(.*?)```" finds
    (leading blanks aside), with plain searches. The block can only open at the first mark (a
    later mark would be its closing one) and closes at the next mark after the language tag;
    the lazy pattern instead backtracks quadratically over a long unclosed block."""
    opening = text.find(_FENCE_MARK)
    if opening < 0:
        return None
    language = _FENCE_LANGUAGE.match(text, opening + len(_FENCE_MARK))
    body = language.end() if language else opening + len(_FENCE_MARK)
    closing = text.find(_FENCE_MARK, body)
    return text[body:closing] if closing >= 0 else None


def _embedded_object(text: str) -> Any:
    """The value starting at the first '{' that parses, within a work budget linear in the
    reply's length (the parser reads at most the budget's characters over all tries)."""
    decoder = json.JSONDecoder()
    budget = _EMBEDDED_JSON_WORK_FACTOR * len(text) + 1024
    start = text.find("{")
    while start >= 0 and budget > 0:
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError as exc:
            budget -= _parse_work(text, start, exc)
        except (ValueError, RecursionError):
            budget -= len(text) - start
        else:
            return value
        start = text.find("{", start + 1)
    raise ValueError("no JSON object in the reply")


def _parse_work(text: str, start: int, exc: json.JSONDecodeError) -> int:
    """Characters a failed parse from ``start`` read: up to the error, except for an unclosed
    string, which is reported where it opens but was read to the end."""
    if exc.msg.startswith("Unterminated string"):
        return len(text) - start
    return exc.pos - start + 1


def parse_structured(text: str, schema: type[ModelT]) -> ModelT:
    """``text`` as a validated ``schema`` (lax mode: "3" becomes 3); LLMError invalid_output
    with the raw text when it cannot be."""
    try:
        value = extract_json(text)
    except ValueError as exc:
        raise LLMError("invalid_output", str(exc), raw=text) from exc
    try:
        return schema.model_validate(value, strict=False)
    except ValidationError as exc:
        raise LLMError(
            "invalid_output", f"does not fit {schema.__name__}: {_summary(exc)}", raw=text
        ) from exc


def validate_items(
    raw_items: Iterable[Any], schema: type[ModelT]
) -> tuple[list[ModelT], list[tuple[int, str]]]:
    """Each valid entry as a ``schema``, and (index, reason) for each malformed one: one bad
    entry in a model's list does not sink the batch."""
    valid: list[ModelT] = []
    rejected: list[tuple[int, str]] = []
    for index, item in enumerate(raw_items):
        try:
            valid.append(schema.model_validate(item, strict=False))
        except ValidationError as exc:
            rejected.append((index, _summary(exc)))
    return valid, rejected


def _summary(exc: ValidationError, limit: int = 5) -> str:
    parts = [
        f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in exc.errors()[:limit]
    ]
    more = exc.error_count() - limit
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")
