"""API-key authentication, per-collection authorisation and per-key rate limits for the public
services (gateway, ingestion API).

Keys live in a JSON file (RAGMESH_API_KEYS_FILE) as sha256 digests, never in plaintext; each is
bound to the collections it may read and write and may carry a rate limit. A caller sends its key
as ``authorization: Bearer <key>`` or ``x-api-key: <key>``. Each service declares, per method,
what the call does (read or write) and where its collection is (``Rule``); the server interceptor
runs ``Guard.check`` before the handler. Format and threat model: docs/SECURITY.md.

The presented key is hashed and compared with every configured digest (hmac.compare_digest, no
early exit), so neither a prefix nor which entry matched shows in the timing. Neither the key
nor its digest ever reaches an error message, a log line or a metric label: only the key's name.
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import json
import logging
import math
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import grpc
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from meshkit.errors import (
    ServiceError,
    invalid_argument,
    permission_denied,
    resource_exhausted,
    unauthenticated,
)
from meshkit.ids import validate_collection
from meshkit.metrics import AUTH_REQUESTS
from meshkit.settings import MeshSettings

log = logging.getLogger("meshkit.auth")

Action = Literal["read", "write"]
READ: Action = "read"
WRITE: Action = "write"
ALL = "*"
KEY_PREFIX = "rmk_"
# Longer credentials are refused unhashed: no key this module issues comes close.
MAX_KEY_CHARS = 512
AUTHORIZATION_HEADER = "authorization"
API_KEY_HEADER = "x-api-key"
MISSING_KEY = f"missing API key: send '{AUTHORIZATION_HEADER}: Bearer <key>' or '{API_KEY_HEADER}: <key>'"
INVALID_KEY = "invalid API key"
NO_KEY_LABEL = "-"


class KeysFileError(ValueError):
    """A keys file that cannot be used; the message names the file and the problem, never a key."""


# ------------------------------------------------------------------------------- the keys file


class _RateEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    per_second: float = Field(ge=0, description="Sustained requests per second (0: unlimited).")
    burst: int | None = Field(
        None, ge=1, description="Requests allowed at once (default: one second's worth)."
    )


class _KeyEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    sha256: str = Field(pattern=r"^[0-9a-fA-F]{64}$")
    read: list[str] = Field(default_factory=list)
    write: list[str] = Field(default_factory=list)
    rate: _RateEntry | None = None

    @field_validator("read", "write")
    @classmethod
    def _collections(cls, names: list[str]) -> list[str]:
        for name in names:
            if name != ALL:
                try:
                    validate_collection(name)
                except ServiceError as exc:
                    raise ValueError(f"{exc.message} (or '*' for every collection)") from None
        return names


class _KeysFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    keys: list[_KeyEntry]


@dataclass(frozen=True)
class Rate:
    per_second: float
    burst: int

    @classmethod
    def of(cls, per_second: float, burst: int | None) -> Rate | None:
        """None for unlimited (a rate of 0)."""
        if per_second <= 0:
            return None
        return cls(per_second, burst or max(1, math.ceil(per_second)))


@dataclass(frozen=True)
class ApiKey:
    """A configured key: its name, the digest of its secret, and what it may do."""

    name: str
    digest: bytes = field(repr=False)
    read: frozenset[str] = frozenset()
    write: frozenset[str] = frozenset()
    rate: Rate | None = None

    def may(self, action: Action, collection: str) -> bool:
        """Whether this key may ``action`` ``collection`` ('*': every collection at once)."""
        granted = self.read if action == READ else self.write
        return ALL in granted or (collection != ALL and collection in granted)


def digest_of(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_api_key() -> str:
    """A fresh random key (256 bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def _problems(exc: ValidationError) -> str:
    # loc and msg only: pydantic's input would echo a plaintext key pasted into "sha256".
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])


def parse_keys(text: str, source: str, default_rate: Rate | None = None) -> list[ApiKey]:
    """The keys of a keys file's text; ``default_rate`` applies to entries without a rate."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        # The decoder's message gives a position, never the text around it.
        raise KeysFileError(
            f"{source}: not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    try:
        parsed = _KeysFile.model_validate(raw)
    except ValidationError as exc:
        raise KeysFileError(f"{source}: {_problems(exc)}") from None
    keys: list[ApiKey] = []
    names: set[str] = set()
    digests: set[str] = set()
    for entry in parsed.keys:
        digest = entry.sha256.lower()
        if entry.name in names:
            raise KeysFileError(f"{source}: key name {entry.name!r} appears twice")
        if digest in digests:
            raise KeysFileError(f"{source}: key {entry.name!r} has the same sha256 as another key")
        if not entry.read and not entry.write:
            raise KeysFileError(f"{source}: key {entry.name!r} grants nothing (empty read and write)")
        names.add(entry.name)
        digests.add(digest)
        rate = Rate.of(entry.rate.per_second, entry.rate.burst) if entry.rate is not None else default_rate
        keys.append(
            ApiKey(entry.name, digest.encode("ascii"), frozenset(entry.read), frozenset(entry.write), rate)
        )
    return keys


def load_keys(path: Path, default_rate: Rate | None = None) -> list[ApiKey]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KeysFileError(f"cannot read the API keys file {str(path)!r}: {exc}") from None
    return parse_keys(text, str(path), default_rate)


class KeyStore:
    """The configured keys, matched against a presented one in constant time."""

    def __init__(self, keys: Iterable[ApiKey]) -> None:
        self.keys = tuple(keys)

    def match(self, presented: str) -> ApiKey | None:
        digest = digest_of(presented).encode("ascii")
        found: ApiKey | None = None
        # Every digest is compared, whatever matched first: the time taken says nothing of which.
        for key in self.keys:
            if hmac.compare_digest(digest, key.digest):
                found = key
        return found


# ------------------------------------------------------------------------------- rate limits


class TokenBucket:
    """``burst`` requests at once, refilled at ``per_second``; safe across threads and tasks
    (the lock is held for a few arithmetic operations, never across an await)."""

    def __init__(self, rate: Rate, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.clock = clock
        self.tokens = float(rate.burst)
        self.updated = clock()
        self.lock = threading.Lock()

    def take(self) -> float:
        """0 when a request may go now, else the seconds until one may."""
        with self.lock:
            now = self.clock()
            elapsed = max(0.0, now - self.updated)
            self.tokens = min(float(self.rate.burst), self.tokens + elapsed * self.rate.per_second)
            self.updated = now
            if self.tokens >= 1.0:
                self.tokens -= 1.0
                return 0.0
            return (1.0 - self.tokens) / self.rate.per_second


# ------------------------------------------------------------------------------- the guard


@dataclass(frozen=True)
class Rule:
    """What a method does and to which collection. ``collection`` reads the collection off the
    request; None: the method touches no single collection (the servicer filters by the caller,
    see ``readable``). ``all_when_empty``: an empty collection means every collection, which
    needs '*'; otherwise an empty collection is refused as INVALID_ARGUMENT."""

    action: Action
    collection: Callable[[Any], str] | None = None
    all_when_empty: bool = False


# The key of the call being served (None: auth is off), for servicers that filter by caller.
principal_var: contextvars.ContextVar[ApiKey | None] = contextvars.ContextVar("principal", default=None)


def current_principal() -> ApiKey | None:
    return principal_var.get()


def readable(collections: Iterable[str]) -> list[str]:
    """The collections the current caller may read (all of them with auth off)."""
    key = current_principal()
    return [c for c in collections if key is None or key.may(READ, c)]


def credential_from(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    """The key a caller presented, or None. Raises UNAUTHENTICATED for a malformed
    authorization header (without echoing it)."""
    for name, value in metadata or ():
        if not isinstance(value, str):
            continue
        if name == AUTHORIZATION_HEADER:
            scheme, _, token = value.strip().partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise unauthenticated(f"{AUTHORIZATION_HEADER} must be 'Bearer <api key>'")
            return token.strip()
        if name == API_KEY_HEADER:
            return value.strip()
    return None


class Guard:
    """Authenticates, rate-limits and authorises calls to one service."""

    def __init__(
        self,
        service: str,
        rules: Mapping[str, Rule],
        keys: Iterable[ApiKey],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.service = service
        self.rules = dict(rules)
        self.store = KeyStore(keys)
        self.buckets = {k.name: TokenBucket(k.rate, clock) for k in self.store.keys if k.rate is not None}

    def check(self, method: str, request: Any, metadata: Iterable[tuple[str, Any]] | None) -> ApiKey:
        """The caller's key, or a ServiceError: UNAUTHENTICATED, RESOURCE_EXHAUSTED,
        PERMISSION_DENIED or INVALID_ARGUMENT (no collection where one is required)."""
        key = self._authenticate(metadata)
        self._limit(key)
        try:
            self._authorise(key, method, request)
        except ServiceError as exc:
            outcome = "permission_denied" if exc.code == grpc.StatusCode.PERMISSION_DENIED else "invalid"
            AUTH_REQUESTS.labels(self.service, key.name, outcome).inc()
            raise
        AUTH_REQUESTS.labels(self.service, key.name, "ok").inc()
        return key

    def _authenticate(self, metadata: Iterable[tuple[str, Any]] | None) -> ApiKey:
        try:
            presented = credential_from(metadata)
        except ServiceError:
            AUTH_REQUESTS.labels(self.service, NO_KEY_LABEL, "unauthenticated").inc()
            raise
        key = self.store.match(presented) if presented and len(presented) <= MAX_KEY_CHARS else None
        if key is None:
            AUTH_REQUESTS.labels(self.service, NO_KEY_LABEL, "unauthenticated").inc()
            raise unauthenticated(MISSING_KEY if not presented else INVALID_KEY)
        return key

    def _limit(self, key: ApiKey) -> None:
        bucket = self.buckets.get(key.name)
        wait = bucket.take() if bucket is not None else 0.0
        if wait > 0:
            assert key.rate is not None
            AUTH_REQUESTS.labels(self.service, key.name, "rate_limited").inc()
            raise resource_exhausted(
                f"API key {key.name!r} is over its rate limit ({key.rate.per_second:g}/s, burst "
                f"{key.rate.burst}): retry in {max(wait, 0.001):.3f}s"
            )

    def _authorise(self, key: ApiKey, method: str, request: Any) -> None:
        rule = self.rules.get(method)
        if rule is None:
            # Fail closed: a method added to the contract without a rule is nobody's.
            raise permission_denied(f"{method} has no access rule; no API key may call it")
        if rule.collection is None:
            if not (key.read if rule.action == READ else key.write):
                raise permission_denied(f"API key {key.name!r} may not {rule.action} any collection")
            return
        collection = rule.collection(request)
        if not collection:
            if not rule.all_when_empty:
                raise invalid_argument("collection is required")
            collection = ALL
        if not key.may(rule.action, collection):
            what = "every collection" if collection == ALL else f"collection {collection[:80]!r}"
            raise permission_denied(f"API key {key.name!r} may not {rule.action} {what}")


def guard_for(service: str, rules: Mapping[str, Rule], settings: MeshSettings) -> Guard | None:
    """The guard of a service with access rules, or None when no keys file is configured (auth
    off, said once at start) or the service declares no rules (an internal one)."""
    if not rules:
        return None
    if settings.api_keys_file is None:
        log.warning(
            "API key auth is OFF: RAGMESH_API_KEYS_FILE is not set, every caller may read and write "
            "every collection (local development only)"
        )
        return None
    default_rate = Rate.of(settings.api_key_rate_per_s, settings.api_key_burst or None)
    keys = load_keys(settings.api_keys_file, default_rate)
    if not keys:
        log.warning("the API keys file lists no keys: every call will be refused")
    log.info(
        "API key auth on",
        extra={"keys_file": str(settings.api_keys_file), "api_keys": [k.name for k in keys]},
    )
    return Guard(service, rules, keys)


def key_entry(name: str, key: str, read: list[str], write: list[str], rate: Rate | None) -> dict[str, Any]:
    """The keys-file entry of ``key`` (its digest, never the key)."""
    entry: dict[str, Any] = {"name": name, "sha256": digest_of(key), "read": read, "write": write}
    if rate is not None:
        entry["rate"] = {"per_second": rate.per_second, "burst": rate.burst}
    try:
        _KeyEntry.model_validate(entry)
    except ValidationError as exc:
        raise KeysFileError(_problems(exc)) from None
    return entry
