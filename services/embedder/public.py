"""What other code may use of the embedder (it imports this module only, never the servicer or
the batcher): the ONNX embedding model the service serves, loaded in-process from the embedder
settings, for tools that embed a corpus without the service (the reranker build's dense
mining)."""

from __future__ import annotations

from meshkit.settings import EmbedderSettings
from services.embedder.model import EmbeddingModel, ModelInfo, ModelLoadError, TextKind

__all__ = ["EmbeddingModel", "ModelInfo", "ModelLoadError", "TextKind", "load_model"]


def load_model(settings: EmbedderSettings | None = None) -> EmbeddingModel:
    """The model ``settings`` name (default: the RAGMESH_EMBEDDER_* environment, as the service
    reads it), checked against its pinned sha256 like the service's."""
    return EmbeddingModel.load(settings if settings is not None else EmbedderSettings())
