"""Structured logging: one JSON object per line on stderr, tagged with the request id."""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
import uuid
from typing import Any

request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")
# The name of the API key the call being served authenticated with (never the key itself).
api_key_name_var: contextvars.ContextVar[str] = contextvars.ContextVar("api_key_name", default="")
# The mesh identity of the caller of the call being served (RAGMESH_SERVICE_AUTH=mtls).
caller_identity_var: contextvars.ContextVar[str] = contextvars.ContextVar("caller_identity", default="")
REQUEST_ID_HEADER = "x-request-id"

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


def new_request_id() -> str:
    return uuid.uuid4().hex[:16]


def current_request_id() -> str:
    return request_id_var.get()


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = request_id_var.get()
        if rid:
            entry["request_id"] = rid
        caller = api_key_name_var.get()
        if caller:
            entry["api_key_name"] = caller
        identity = caller_identity_var.get()
        if identity:
            entry["caller_identity"] = identity
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        tags = " ".join(
            f"{name}={value}"
            for name, value in (
                ("rid", request_id_var.get()),
                ("key", api_key_name_var.get()),
                ("caller", caller_identity_var.get()),
            )
            if value
        )
        base = f"{record.levelname[0]} {record.name}: {record.getMessage()}"
        return f"{base} [{tags}]" if tags else base


def configure_logging(service: str, level: str = "INFO", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service) if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Third-party chatter stays at warnings unless asked for.
    for noisy in ("nats", "urllib3", "asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
