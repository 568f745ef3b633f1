from __future__ import annotations

import pytest

from meshkit.domain.metadata import (
    EQ,
    EXISTS,
    IN,
    MAX_FILTER_CLAUSES,
    NE,
    Clause,
    InvalidFilter,
    MetadataIndex,
    clauses_from_pb,
    clauses_to_pb,
    metadata_problem,
    narrows,
)
from ragmesh.common.v1 import common_pb2


def clause(key: str, op: int, *values: str) -> common_pb2.MetadataClause:
    return common_pb2.MetadataClause(key=key, op=op, values=list(values))  # type: ignore[arg-type]


def test_filters_round_trip_and_bad_ones_are_named() -> None:
    good = common_pb2.MetadataFilter(
        clauses=[
            clause("team", common_pb2.FILTER_OP_EQ, "docs"),
            clause("lang", common_pb2.FILTER_OP_IN, "en", "de"),
            clause("draft", common_pb2.FILTER_OP_EXISTS),
        ]
    )
    parsed = clauses_from_pb(good)
    assert parsed == (
        Clause("team", EQ, ("docs",)),
        Clause("lang", IN, ("en", "de")),
        Clause("draft", EXISTS),
    )
    assert clauses_to_pb(parsed) == good
    bad = {
        "op must be one of": clause("team", common_pb2.FILTER_OP_UNSPECIFIED, "x"),
        "exactly one value": clause("team", common_pb2.FILTER_OP_EQ, "x", "y"),
        "takes no values": clause("team", common_pb2.FILTER_OP_EXISTS, "x"),
        "1..64 values": clause("team", common_pb2.FILTER_OP_IN),
        "may only hold": clause("te am", common_pb2.FILTER_OP_EQ, "x"),
        "1..64 chars": clause("k" * 65, common_pb2.FILTER_OP_EQ, "x"),
        "limit is 1024": clause("team", common_pb2.FILTER_OP_NE, "v" * 1025),
    }
    for message, wrong in bad.items():
        with pytest.raises(InvalidFilter, match=message):
            clauses_from_pb(common_pb2.MetadataFilter(clauses=[wrong]))
    many = common_pb2.MetadataFilter(
        clauses=[clause("k", common_pb2.FILTER_OP_EXISTS)] * (MAX_FILTER_CLAUSES + 1)
    )
    with pytest.raises(InvalidFilter, match="clauses, the limit is"):
        clauses_from_pb(many)


def test_metadata_problem() -> None:
    assert metadata_problem({"team": "docs", "a.b:c-d_e": ""}) is None
    assert "may only hold" in (metadata_problem({"bad key": "x"}) or "")
    assert "limit is 1024" in (metadata_problem({"k": "v" * 1025}) or "")


def test_index_matches_every_operator_and_forgets_removed_documents() -> None:
    index = MetadataIndex()
    index.put("a", {"team": "docs", "lang": "en"})
    index.put("b", {"team": "infra", "lang": "de"})
    index.put("c", {"team": "docs"})
    everyone = {"a", "b", "c", "d"}  # d has no metadata
    assert index.matching([Clause("team", EQ, ("docs",))], everyone) == {"a", "c"}
    assert index.matching([Clause("team", NE, ("docs",))], everyone) == {"b", "d"}
    assert index.matching([Clause("lang", IN, ("de", "fr"))], everyone) == {"b"}
    assert index.matching([Clause("lang", EXISTS)], everyone) == {"a", "b"}
    assert index.matching([Clause("team", EQ, ("docs",)), Clause("lang", EXISTS)], everyone) == {"a"}
    assert index.matching([Clause("team", EQ, ("docs",))], {"c"}) == {"c"}
    assert index.matching([Clause("nokey", EXISTS)], everyone) == set()
    index.put("a", {"team": "infra"})
    assert index.matching([Clause("team", EQ, ("docs",))], everyone) == {"c"}
    index.remove("c")
    assert index.matching([Clause("team", EQ, ("docs",))], everyone) == set()
    assert index.get("c") == {}


def test_index_without_a_universe_answers_from_postings_and_ne_alone_asks_for_one() -> None:
    # The index shards key documents by number and search every document they hold.
    index: MetadataIndex[int] = MetadataIndex()
    for num in range(10):
        index.put(num, {"dept": f"d{num % 3}", **({"draft": "yes"} if num < 4 else {})})
    assert index.matching([Clause("dept", EQ, ("d1",))], None) == {1, 4, 7}
    assert index.matching([Clause("dept", IN, ("d1", "d2")), Clause("draft", NE, ("yes",))], None) == {
        4,
        5,
        7,
        8,
    }
    assert narrows([Clause("dept", NE, ("d1",)), Clause("draft", EXISTS)])
    assert not narrows([Clause("dept", NE, ("d1",))])
    with pytest.raises(ValueError, match="needs the documents searched"):
        index.matching([Clause("dept", NE, ("d1",))], None)
    assert index.matching([Clause("dept", NE, ("d1",))], range(12)) == {0, 2, 3, 5, 6, 8, 9, 10, 11}
