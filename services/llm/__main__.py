"""``python -m services.llm``: serve the GGUF model over an OpenAI-compatible HTTP API on
``RAGMESH_HOST:RAGMESH_PORT`` (``/v1/chat/completions``, ``/health``) until SIGTERM."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path

from meshkit.core.logs import configure_logging
from meshkit.settings import LLMServerSettings

log = logging.getLogger("ragmesh.llm")


def serve(settings: LLMServerSettings) -> None:
    import xllamacpp

    if not Path(settings.llm_server_gguf).is_file():
        raise SystemExit(f"GGUF model not found: {settings.llm_server_gguf!r} (RAGMESH_LLM_SERVER_GGUF)")
    params = xllamacpp.CommonParams()
    params.model.path = settings.llm_server_gguf
    params.hostnames = [settings.host]
    params.port = settings.port
    params.n_ctx = settings.llm_server_ctx
    params.n_parallel = settings.llm_server_parallel
    if settings.llm_server_threads:
        params.cpuparams.n_threads = settings.llm_server_threads
    if settings.llm_server_api_key:
        params.api_keys = [settings.llm_server_api_key]
    # Nothing in the mesh uses the web UI (served without the key), the slot endpoints (they show
    # and save prompts in flight), the settings endpoint (which changes the server) or llama.cpp's
    # own metrics.
    params.ui = False
    params.endpoint_slots = False
    params.endpoint_props = False
    params.endpoint_metrics = False
    server = xllamacpp.Server(params)
    log.info(
        "llm server listening",
        extra={"address": server.listening_address, "api_key": bool(settings.llm_server_api_key)},
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    log.info("llm server stopping")


def main() -> None:
    settings = LLMServerSettings()
    configure_logging("llm", settings.log_level, settings.log_format)
    serve(settings)


if __name__ == "__main__":
    main()
