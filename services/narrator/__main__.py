"""``python -m services.narrator``: serve NarratorService with settings from RAGMESH_* variables."""

from __future__ import annotations

from meshkit.rpc.server import run_service
from meshkit.settings import NarratorSettings
from services.narrator.servicer import build_spec


def main() -> None:
    settings = NarratorSettings()
    spec, _servicer = build_spec(settings)
    run_service(spec, settings)


if __name__ == "__main__":
    main()
