"""``python -m services.index``: one shard of the dense vector index."""

from __future__ import annotations

from meshkit.rpc.server import run_service
from meshkit.settings import IndexSettings
from services.index.servicer import build_spec


def main() -> None:
    settings = IndexSettings()
    run_service(build_spec(settings), settings)


if __name__ == "__main__":
    main()
