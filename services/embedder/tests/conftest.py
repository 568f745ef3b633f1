from __future__ import annotations

import pytest

from meshkit.settings import EmbedderSettings
from services.embedder.model import EmbeddingModel


@pytest.fixture(scope="session")
def settings() -> EmbedderSettings:
    return EmbedderSettings(embedder_provider="cpu", log_format="text")


@pytest.fixture(scope="session")
def model(settings: EmbedderSettings) -> EmbeddingModel:
    # ~1 s to hash and load: shared by every embedder test module.
    return EmbeddingModel.load(settings)
