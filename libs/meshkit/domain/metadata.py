"""Document metadata: what a caller may attach at ingest, the filters Search and Ask accept, and
the inverted index the index shards and the sparse service evaluate them with.

Keys are declared by use: every key a document carries at ingest is indexed (there is no schema
to register first). A key is 1..MAX_KEY_CHARS of ``[A-Za-z0-9_.:-]``, a value at most
MAX_VALUE_CHARS characters. A filter is a list of clauses that must all hold; each clause is
``eq`` / ``ne`` (one value), ``in`` (1..MAX_FILTER_VALUES values) or ``exists`` (no values).
``ne`` matches documents without the key too. Matching is set arithmetic over the index:
``eq``/``in``/``exists`` cost the size of what they match, never a scan of every document
(``ne`` is the complement of ``eq``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from ragmesh.common.v1 import common_pb2

MAX_KEY_CHARS = 64
MAX_VALUE_CHARS = 1024
MAX_METADATA_ENTRIES = 64
MAX_TITLE_CHARS = 4096
MAX_URI_CHARS = 4096
MAX_FILTER_CLAUSES = 16
MAX_FILTER_VALUES = 64
_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-")

EQ, NE, IN, EXISTS = "eq", "ne", "in", "exists"
_OPS = {
    common_pb2.FILTER_OP_EQ: EQ,
    common_pb2.FILTER_OP_NE: NE,
    common_pb2.FILTER_OP_IN: IN,
    common_pb2.FILTER_OP_EXISTS: EXISTS,
}
_OP_NUMBERS = {name: number for number, name in _OPS.items()}
# What a MetadataIndex knows a document by.
K = TypeVar("K", str, int)


class InvalidFilter(ValueError):
    """A filter a caller sent that cannot be applied; the message is safe to show them."""


@dataclass(frozen=True)
class Clause:
    key: str
    op: str
    values: tuple[str, ...] = ()


def key_problem(key: str) -> str | None:
    if not 1 <= len(key) <= MAX_KEY_CHARS:
        return f"metadata key must be 1..{MAX_KEY_CHARS} chars, got {len(key)}"
    if not set(key) <= _KEY_CHARS:
        return f"metadata key {key!r} may only hold letters, digits and _ . : -"
    return None


def metadata_problem(metadata: Mapping[str, str]) -> str | None:
    """Why a document's metadata cannot be indexed, or None (the caller bounds the count)."""
    for key, value in metadata.items():
        problem = key_problem(key)
        if problem:
            return problem
        if len(value) > MAX_VALUE_CHARS:
            return f"metadata value of {key!r} is {len(value)} chars, the limit is {MAX_VALUE_CHARS}"
    return None


def source_problem(source: common_pb2.DocumentSource) -> str | None:
    """Why a DocumentSource cannot be stored, or None."""
    if len(source.metadata) > MAX_METADATA_ENTRIES:
        return f"{len(source.metadata)} metadata entries, the limit is {MAX_METADATA_ENTRIES}"
    if len(source.title) > MAX_TITLE_CHARS or len(source.source_uri) > MAX_URI_CHARS:
        return f"title must be at most {MAX_TITLE_CHARS} chars and source_uri at most {MAX_URI_CHARS}"
    return metadata_problem(source.metadata)


def clauses_from_pb(
    filter_pb: common_pb2.MetadataFilter, max_clauses: int = MAX_FILTER_CLAUSES
) -> tuple[Clause, ...]:
    """The validated clauses of a MetadataFilter; InvalidFilter names the first bad one."""
    raw = filter_pb.clauses
    if len(raw) > max_clauses:
        raise InvalidFilter(f"filter has {len(raw)} clauses, the limit is {max_clauses}")
    clauses = []
    for i, clause in enumerate(raw):
        where = f"filter.clauses[{i}]"
        problem = key_problem(clause.key)
        if problem:
            raise InvalidFilter(f"{where}: {problem}")
        op = _OPS.get(clause.op)
        if op is None:
            raise InvalidFilter(f"{where}: op must be one of eq, ne, in, exists")
        values = tuple(clause.values)
        _check_values(where, op, values)
        clauses.append(Clause(clause.key, op, values))
    return tuple(clauses)


def _check_values(where: str, op: str, values: tuple[str, ...]) -> None:
    if op in (EQ, NE) and len(values) != 1:
        raise InvalidFilter(f"{where}: {op} takes exactly one value, got {len(values)}")
    if op == IN and not 1 <= len(values) <= MAX_FILTER_VALUES:
        raise InvalidFilter(f"{where}: in takes 1..{MAX_FILTER_VALUES} values, got {len(values)}")
    if op == EXISTS and values:
        raise InvalidFilter(f"{where}: exists takes no values")
    for value in values:
        if len(value) > MAX_VALUE_CHARS:
            raise InvalidFilter(f"{where}: a value is {len(value)} chars, the limit is {MAX_VALUE_CHARS}")


def clauses_to_pb(clauses: Iterable[Clause]) -> common_pb2.MetadataFilter:
    return common_pb2.MetadataFilter(
        clauses=[
            common_pb2.MetadataClause(key=c.key, op=_OP_NUMBERS[c.op], values=list(c.values)) for c in clauses
        ]
    )


def narrows(clauses: Iterable[Clause]) -> bool:
    """True when a clause selects from the index (eq, in, exists): the filter's documents are
    found from postings, without the set of every document searched."""
    return any(clause.op != NE for clause in clauses)


class MetadataIndex(Generic[K]):
    """document -> metadata, and key -> value -> documents. A document is whatever key its owner
    knows it by (a doc id; the index shards use their dense document numbers, so a filter's
    result feeds numpy directly). Not thread-safe: the owner's lock guards it like the rest of
    its state."""

    def __init__(self) -> None:
        self._docs: dict[K, dict[str, str]] = {}
        self._postings: dict[str, dict[str, set[K]]] = {}

    def __len__(self) -> int:
        return len(self._docs)

    def get(self, doc: K) -> dict[str, str]:
        return self._docs.get(doc, {})

    def put(self, doc: K, metadata: Mapping[str, str]) -> None:
        self.remove(doc)
        if not metadata:
            return
        self._docs[doc] = dict(metadata)
        for key, value in metadata.items():
            self._postings.setdefault(key, {}).setdefault(value, set()).add(doc)

    def remove(self, doc: K) -> None:
        old = self._docs.pop(doc, None)
        for key, value in (old or {}).items():
            values = self._postings[key]
            members = values[value]
            members.discard(doc)
            if not members:
                del values[value]
            if not values:
                del self._postings[key]

    def matching(self, clauses: Iterable[Clause], universe: Collection[K] | None) -> set[K]:
        """The documents of ``universe`` (the documents the caller searches; fast membership)
        that satisfy every clause. ``universe`` None: the caller searches every document it
        indexed, so a filter with an ``eq``/``in``/``exists`` clause costs only what that clause
        matches; a filter of ``ne`` clauses alone needs the universe (it matches documents
        without metadata too)."""
        result: set[K] | None = None
        negated: set[K] = set()
        for clause in clauses:
            values = self._postings.get(clause.key, {})
            if clause.op == NE:
                negated |= values.get(clause.values[0], set())
                continue
            if clause.op == EXISTS:
                found: set[K] = set().union(*values.values()) if values else set()
            else:
                found = set().union(*(values.get(v, set()) for v in clause.values))
            result = found if result is None else result & found
            if not result:
                return set()
        if result is None:
            if universe is None:
                raise ValueError("a filter of ne clauses alone needs the documents searched")
            return set(universe) - negated
        if universe is not None:
            result = {d for d in result if d in universe}
        return result - negated
