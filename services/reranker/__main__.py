"""``python -m services.reranker``: serve RerankerService with settings from RAGMESH_* variables."""

from __future__ import annotations

from meshkit.rpc.server import run_service
from meshkit.settings import RerankerSettings
from services.reranker.servicer import build_spec


def main() -> None:
    settings = RerankerSettings()
    spec, _servicer = build_spec(settings)
    run_service(spec, settings)


if __name__ == "__main__":
    main()
