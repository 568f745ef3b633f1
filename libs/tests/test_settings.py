from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from meshkit.rpc.client import ClientPolicy
from meshkit.settings import EmbedderSettings, IngestionSettings, MeshSettings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests see only the RAGMESH_ variables they set themselves."""
    for key in list(os.environ):
        if key.upper().startswith("RAGMESH_"):
            monkeypatch.delenv(key)


def test_defaults_without_environment() -> None:
    settings = MeshSettings()
    assert settings.host == "127.0.0.1"
    assert settings.port == 0
    assert settings.log_format == "json"
    assert settings.client_retry_attempts == 3


def test_prefixed_env_vars_override_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGMESH_PORT", "50099")
    monkeypatch.setenv("RAGMESH_BREAKER_RESET_S", "0.5")
    monkeypatch.setenv("RAGMESH_LOG_FORMAT", "text")
    monkeypatch.setenv("RAGMESH_STATE_DIR", "/tmp/ragmesh-x")
    monkeypatch.setenv("RAGMESH_EMBEDDER_MAX_BATCH", "16")
    settings = EmbedderSettings()
    assert settings.port == 50099
    assert settings.breaker_reset_s == 0.5
    assert settings.log_format == "text"
    assert settings.state_dir == Path("/tmp/ragmesh-x")
    assert settings.embedder_max_batch == 16


def test_unprefixed_env_vars_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PORT", "1234")
    monkeypatch.setenv("EMBEDDER_MAX_BATCH", "1")
    settings = EmbedderSettings()
    assert settings.port == 0
    assert settings.embedder_max_batch == 64


def test_malformed_env_values_fail_at_startup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGMESH_PORT", "not-a-port")
    with pytest.raises(ValidationError):
        MeshSettings()
    monkeypatch.setenv("RAGMESH_PORT", "1")
    monkeypatch.setenv("RAGMESH_LOG_FORMAT", "xml")
    with pytest.raises(ValidationError):
        MeshSettings()


def test_settings_are_frozen_but_copyable() -> None:
    settings = MeshSettings()
    with pytest.raises(ValidationError):
        settings.port = 5  # type: ignore[misc]
    assert settings.model_copy(update={"port": 5}).port == 5


def test_secret_key_is_not_in_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGMESH_S3_SECRET_KEY", "hunter2-secret")
    settings = MeshSettings()
    assert settings.s3_secret_key == "hunter2-secret"
    assert "hunter2-secret" not in repr(settings)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("127.0.0.1:50052", ["127.0.0.1:50052"]),
        ("a:1,b:2,c:3", ["a:1", "b:2", "c:3"]),
        (" a:1 , b:2 ,, ", ["a:1", "b:2"]),
        ("", []),
    ],
)
def test_index_address_list(raw: str, expected: list[str]) -> None:
    assert MeshSettings(index_addresses=raw).index_address_list() == expected


def test_index_addresses_from_env_keep_shard_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGMESH_INDEX_ADDRESSES", "h2:2,h0:0,h1:1")
    assert MeshSettings().index_address_list() == ["h2:2", "h0:0", "h1:1"]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1,2,5,10", [1.0, 2.0, 5.0, 10.0]),
        (" 0.5 , 1.5,, ", [0.5, 1.5]),
        ("3", [3.0]),
        ("", []),
    ],
)
def test_retry_backoffs(raw: str, expected: list[float]) -> None:
    assert IngestionSettings(ingest_retry_backoff_s=raw).retry_backoffs() == expected


def test_retry_backoffs_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGMESH_INGEST_RETRY_BACKOFF_S", "0.1,0.2")
    assert IngestionSettings().retry_backoffs() == [0.1, 0.2]


def test_client_policy_from_settings() -> None:
    settings = MeshSettings(
        client_timeout_s=2.5,
        client_retry_attempts=4,
        client_retry_backoff_s=0.05,
        breaker_fail_max=7,
        breaker_reset_s=1.5,
    )
    assert ClientPolicy.from_settings(settings) == ClientPolicy(
        timeout_s=2.5, retry_attempts=4, retry_backoff_s=0.05, breaker_fail_max=7, breaker_reset_s=1.5
    )


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def test_default_embedder_model_matches_pinned_sha256() -> None:
    settings = EmbedderSettings()
    model = Path(settings.embedder_model_path)
    assert model.is_file(), model
    assert sha256_file(model) == settings.embedder_model_sha256


def test_default_embedder_tokenizer_matches_pinned_sha256() -> None:
    settings = EmbedderSettings()
    tokenizer = Path(settings.embedder_tokenizer_path)
    assert tokenizer.is_file(), tokenizer
    assert sha256_file(tokenizer) == settings.embedder_tokenizer_sha256
    assert IngestionSettings().ingest_tokenizer_path == settings.embedder_tokenizer_path


def test_sparse_addresses_take_the_index_form() -> None:
    settings = MeshSettings(sparse_addresses="a:1|a:2,b:1")
    assert settings.sparse_address_list() == ["a:1,a:2", "b:1"]
    assert MeshSettings().sparse_address_list() == ["127.0.0.1:50053"]


def test_a_renamed_variable_is_refused_not_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    # Ignored, it would leave every process dialling the default sparse address.
    monkeypatch.setenv("RAGMESH_SPARSE_ADDRESS", "sparse:50051")
    with pytest.raises(ValueError, match="RAGMESH_SPARSE_ADDRESS was renamed to RAGMESH_SPARSE_ADDRESSES"):
        MeshSettings()
