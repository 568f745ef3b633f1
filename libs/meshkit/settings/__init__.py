"""Typed settings for every process, read from ``RAGMESH_*`` environment variables.

One module per service (``meshkit.settings.gateway``, ``.index``...) beside the block every
process reads (``mesh``); this package exports them all, so callers keep importing from
``meshkit.settings`` and an operator still finds every knob with ``ragmesh config``, which lists
the classes below in this order. Each service reads the common block plus its own.

A new setting goes into its service's module; a new service's settings class into a new module
here, exported below and listed in ``SETTINGS_CLASSES`` (libs/tests/test_settings_layout.py fails
on a class left out).
"""

from __future__ import annotations

from meshkit.settings.embedder import EmbedderSettings
from meshkit.settings.extractor import ExtractorSettings
from meshkit.settings.gateway import GatewaySettings
from meshkit.settings.index import IndexSettings
from meshkit.settings.ingestion import IngestionSettings
from meshkit.settings.llm import LLMServerSettings, LLMSettings
from meshkit.settings.mesh import ENV_PREFIX, MeshSettings
from meshkit.settings.narrator import NarratorSettings
from meshkit.settings.planner import PlannerSettings
from meshkit.settings.reranker import DEFAULT_RERANKER_MODEL_DIR, RerankerSettings
from meshkit.settings.sparse import SparseSettings
from meshkit.settings.store import StoreSettings

# Every settings class, in the order ``ragmesh config`` lists them (a field is listed under the
# first class that has it: the common block first, then each service's own).
SETTINGS_CLASSES: tuple[type[MeshSettings], ...] = (
    MeshSettings,
    EmbedderSettings,
    StoreSettings,
    IndexSettings,
    SparseSettings,
    IngestionSettings,
    LLMSettings,
    PlannerSettings,
    RerankerSettings,
    GatewaySettings,
    LLMServerSettings,
    ExtractorSettings,
    NarratorSettings,
)

__all__ = [
    "DEFAULT_RERANKER_MODEL_DIR",
    "ENV_PREFIX",
    "SETTINGS_CLASSES",
    "EmbedderSettings",
    "ExtractorSettings",
    "GatewaySettings",
    "IndexSettings",
    "IngestionSettings",
    "LLMServerSettings",
    "LLMSettings",
    "MeshSettings",
    "NarratorSettings",
    "PlannerSettings",
    "RerankerSettings",
    "SparseSettings",
    "StoreSettings",
]
