"""``python -m services.sparse``: the sparse (BM25 + exact keyword) service."""

from __future__ import annotations

from meshkit.rpc.server import run_service
from meshkit.settings import SparseSettings
from services.sparse.servicer import build_spec


def main() -> None:
    settings = SparseSettings()
    run_service(build_spec(settings), settings)


if __name__ == "__main__":
    main()
