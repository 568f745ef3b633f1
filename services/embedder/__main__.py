"""``python -m services.embedder``: serve EmbedderService with settings from RAGMESH_* variables."""

from __future__ import annotations

from meshkit.rpc.server import run_service
from meshkit.settings import EmbedderSettings
from services.embedder.servicer import build_spec


def main() -> None:
    settings = EmbedderSettings()
    spec, _servicer = build_spec(settings)
    run_service(spec, settings)


if __name__ == "__main__":
    main()
