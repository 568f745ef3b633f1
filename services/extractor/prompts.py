"""Prompts and reply schemas of the extractor's LLM calls.

The local model is tiny (SmolLM2-135M, ~2000 tokens per request), so prompts are short and
every list in a schema is bounded (maxItems), or greedy decoding loops until max_tokens. The
schemas sent to the server describe the exact entry shape, for guided decoding, while the
Python side validates only the outer object: entries are checked one by one afterwards
(meshkit.llm.replies.validate_items) so one bad entry does not sink the batch."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BaseModel, Field, StringConstraints, create_model, model_validator

from services.extractor.facts import Source

# Longest fact the schema lets the model write: one atomic statement, not a paragraph.
FACT_SCHEMA_CHARS = 300

SYSTEM = "You read numbered texts and answer with JSON only."


class FactEntry(BaseModel):
    """One entry of a map or summary reply; ``passage`` is a number shown in the prompt."""

    passage: int
    fact: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]


def _bare_list_as(field: str, data: Any) -> Any:
    """Small models often drop the wrapper object: a bare list (or a bare entry, or the list
    under another name) is read as ``field``."""
    if isinstance(data, list):
        return {field: data}
    if isinstance(data, dict) and field not in data:
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) == 1:
            return {field: lists[0]}
        if field == "facts" and {"passage", "fact"} <= data.keys():
            return {field: [data]}
    return data


class FactList(BaseModel):
    facts: list[Any]

    @model_validator(mode="before")
    @classmethod
    def _lenient(cls, data: Any) -> Any:
        return _bare_list_as("facts", data)


class NumberList(BaseModel):
    relevant: list[Any]

    @model_validator(mode="before")
    @classmethod
    def _lenient(cls, data: Any) -> Any:
        return _bare_list_as("relevant", data)


@functools.lru_cache(maxsize=64)
def fact_list_schema(max_items: int, numbers: int) -> type[FactList]:
    """A FactList whose JSON schema bounds the list to ``max_items`` entries citing 1..numbers."""
    entry = {
        "type": "object",
        "properties": {
            "passage": {"type": "integer", "minimum": 1, "maximum": numbers},
            "fact": {"type": "string", "maxLength": FACT_SCHEMA_CHARS},
        },
        "required": ["passage", "fact"],
    }
    extra: dict[str, Any] = {"items": entry, "maxItems": max_items}
    return create_model("Facts", __base__=FactList, facts=(list[Any], Field(..., json_schema_extra=extra)))


@functools.lru_cache(maxsize=64)
def number_list_schema(numbers: int) -> type[NumberList]:
    """A NumberList whose JSON schema allows at most ``numbers`` integers in 1..numbers."""
    extra: dict[str, Any] = {
        "items": {"type": "integer", "minimum": 1, "maximum": numbers},
        "maxItems": numbers,
    }
    return create_model(
        "Relevant", __base__=NumberList, relevant=(list[Any], Field(..., json_schema_extra=extra))
    )


def _messages(user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def _one_line(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit].rstrip() + "..."


def map_messages(query: str, batch: Sequence[Source], chars_each: int) -> list[dict[str, str]]:
    """Ask for at most one atomic fact per passage of ``batch`` (numbered from 1)."""
    lines = []
    for number, source in enumerate(batch, start=1):
        title = f"({_one_line(source.title, 120)}) " if source.title.strip() else ""
        lines.append(f"[{number}] {title}{_one_line(source.text, chars_each)}")
    passages = "\n".join(lines)
    return _messages(
        f"Question: {query}\n\nPassages:\n{passages}\n\n"
        "For each passage that helps answer the question, write one short atomic fact from it. "
        "Keep numbers, dates, names and code exactly as written. "
        "At most one fact per passage, and at most one fact per title in parentheses. "
        "Skip passages that do not help.\n"
        'Reply as {"facts": [{"passage": <number>, "fact": "<fact>"}]}.'
    )


def gate_messages(query: str, facts: Sequence[str], chars_each: int) -> list[dict[str, str]]:
    """Ask which of the numbered ``facts`` bear on the question."""
    numbered = "\n".join(f"[{i}] {_one_line(f, chars_each)}" for i, f in enumerate(facts, start=1))
    return _messages(
        f"Question: {query}\n\nFacts:\n{numbered}\n\n"
        "Which facts are related to the question, even loosely?\n"
        'Reply as {"relevant": [<fact numbers>]}.'
    )


def summary_messages(query: str, facts: Sequence[tuple[int, str]], chars_each: int) -> list[dict[str, str]]:
    """Ask to condense ``facts`` (passage number, text) into one shorter fact per passage."""
    numbered = "\n".join(f"[{n}] {_one_line(text, chars_each)}" for n, text in facts)
    return _messages(
        f"Question: {query}\n\nFacts, numbered by passage:\n{numbered}\n\n"
        "Rewrite them as fewer, shorter facts: one per passage number, merging the facts that "
        "share a number, keeping what helps answer the question and numbers, dates, names and "
        "code exactly.\n"
        'Reply as {"facts": [{"passage": <number>, "fact": "<shorter fact>"}]}.'
    )
