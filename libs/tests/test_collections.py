"""Collection records, generation names and the embedder check (meshkit.domain.collections)."""

from __future__ import annotations

import grpc
import pytest

from meshkit.core.errors import ServiceError
from meshkit.domain.collections import (
    CollectionRecord,
    EmbedderIdentity,
    check_embedder,
    physical_name,
    reserved_name_problem,
    split_physical,
)

MINI = EmbedderIdentity("all-MiniLM-L6-v2-int8", 384, "8199be6f" + "0" * 56)
OTHER = EmbedderIdentity("e5-small", 384, "1234abcd" + "0" * 56)


def test_generation_names_round_trip() -> None:
    assert physical_name("docs", 1) == "docs"  # generation 1 is the collection itself: no migration
    assert physical_name("docs", 2) == "docs__g2"
    assert split_physical("docs__g2") == ("docs", 2)
    assert split_physical("docs") == ("docs", 1)
    assert split_physical("my__g_docs") == ("my__g_docs", 1)


def test_generation_names_are_reserved_for_callers() -> None:
    assert reserved_name_problem("docs__g2") is not None
    assert reserved_name_problem("docs") is None
    assert reserved_name_problem("docs_g2") is None


def test_record_serialises_with_both_generations() -> None:
    record = CollectionRecord(
        "docs", generation=2, embedder=MINI, pending_generation=3, pending_embedder=OTHER
    )
    again = CollectionRecord.from_bytes(record.to_bytes())
    assert again == record
    assert again.physical == "docs__g2"
    assert again.embedder_of(3) == OTHER and again.embedder_of(2) == MINI


def test_another_embedder_is_refused_with_both_models_and_the_fix() -> None:
    record = CollectionRecord("docs", embedder=MINI)
    check_embedder(record, 1, MINI)
    check_embedder(None, 1, OTHER)  # nothing recorded yet
    check_embedder(CollectionRecord("docs"), 1, OTHER)
    with pytest.raises(ServiceError) as refused:
        check_embedder(record, 1, OTHER)
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    message = refused.value.message
    assert "'all-MiniLM-L6-v2-int8'" in message and "'e5-small'" in message
    assert "ragmesh reindex --collection docs" in message


def test_a_dimension_change_alone_is_refused() -> None:
    record = CollectionRecord("docs", embedder=MINI)
    with pytest.raises(ServiceError):
        check_embedder(record, 1, EmbedderIdentity(MINI.model, 768, MINI.sha256))
