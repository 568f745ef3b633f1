"""``python -m services.gateway``: the search gateway (GatewayService)."""

from __future__ import annotations

from meshkit.rpc.server import run_service
from meshkit.settings import GatewaySettings
from services.gateway.servicer import build_spec


def main() -> None:
    settings = GatewaySettings()
    run_service(build_spec(settings), settings)


if __name__ == "__main__":
    main()
