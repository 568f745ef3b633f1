"""API-key authentication, per-collection authorisation and per-key rate limits for the public
services (gateway, ingestion API).

Keys live in a JSON file (RAGMESH_API_KEYS_FILE) as sha256 digests, never in plaintext; each is
bound to the collections it may read and write and may carry a rate limit. A caller sends its key
as ``authorization: Bearer <key>`` or ``x-api-key: <key>``. Each service declares, per method,
what the call does (read or write) and where its collection is (``Rule``); the server interceptor
runs ``Guard.check`` before the handler. Format and threat model: docs/SECURITY.md.

The presented key is hashed and compared with every configured digest (hmac.compare_digest, no
early exit), so neither a prefix nor which entry matched shows in the timing. Neither the key
nor its digest ever reaches an error message, a log line or a metric label: errors and logs name
the key, metrics carry its id (``key_id``: the metrics port is unauthenticated, and a tenant's key
name can say who the tenant is).

A guard's keys can be replaced while it serves (``Guard.replace_keys``, driven by
meshkit.rpc.keyreload): each call checks against the set it started with, and the rate-limit buckets
of keys that did not change carry over.
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

from meshkit.core.errors import (
    ServiceError,
    invalid_argument,
    permission_denied,
    resource_exhausted,
    unauthenticated,
)
from meshkit.domain.ids import validate_collection
from meshkit.rpc.metrics import AUTH_REQUESTS
from meshkit.settings import MeshSettings

log = logging.getLogger("meshkit.rpc.auth")

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
KEY_ID_PREFIX = "kid_"
KEY_ID_HEX_DIGITS = 12


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


def key_id(digest: str | bytes) -> str:
    """The public id of the key whose stored (hex) digest is ``digest``: a hash of the digest,
    so the id can be shown anywhere (metrics, listings) without helping anyone to the digest,
    let alone the key. ``ragmesh keys list`` maps ids to names."""
    text = digest.decode("ascii") if isinstance(digest, bytes) else digest
    hashed = hashlib.sha256(text.lower().encode("ascii")).hexdigest()
    return KEY_ID_PREFIX + hashed[:KEY_ID_HEX_DIGITS]


@dataclass(frozen=True)
class ApiKey:
    """A configured key: its name, the digest of its secret, and what it may do."""

    name: str
    digest: bytes = field(repr=False)
    read: frozenset[str] = frozenset()
    write: frozenset[str] = frozenset()
    rate: Rate | None = None
    # The metric label (key_id of the digest); computed once, not per call.
    id: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", key_id(self.digest))

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


def read_keys_text(path: Path) -> str:
    """A keys file's text; KeysFileError when it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        # The position only: the decoder's own message quotes the offending byte.
        raise KeysFileError(f"{path}: not UTF-8 (byte {exc.start})") from None
    except OSError as exc:
        raise KeysFileError(f"cannot read the API keys file {str(path)!r}: {exc}") from None


def load_keys(path: Path, default_rate: Rate | None = None) -> list[ApiKey]:
    return parse_keys(read_keys_text(path), str(path), default_rate)


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


@dataclass(frozen=True)
class KeysChange:
    """What a replacement of a guard's keys changed, by key name (for the log)."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)

    @classmethod
    def between(cls, old: Iterable[ApiKey], new: Iterable[ApiKey]) -> KeysChange:
        before = {k.name: k for k in old}
        after = {k.name: k for k in new}
        return cls(
            added=tuple(sorted(after.keys() - before.keys())),
            removed=tuple(sorted(before.keys() - after.keys())),
            changed=tuple(sorted(n for n in before.keys() & after.keys() if before[n] != after[n])),
        )


@dataclass(frozen=True)
class _KeySet:
    """The keys in force and their rate-limit buckets (by digest), swapped as one."""

    store: KeyStore
    buckets: Mapping[bytes, TokenBucket]


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
        self.clock = clock
        self._keys = self._key_set(keys, {})

    @property
    def store(self) -> KeyStore:
        return self._keys.store

    def replace_keys(self, keys: Iterable[ApiKey]) -> KeysChange:
        """Put ``keys`` in force. A key whose digest and rate are unchanged keeps its bucket (a
        reload neither refills nor drains it); calls already past the check are not affected."""
        old = self._keys
        new = self._key_set(keys, old.buckets)
        # One attribute store: a concurrent check sees the old set or the new one, never a mix.
        self._keys = new
        return KeysChange.between(old.store.keys, new.store.keys)

    def _key_set(self, keys: Iterable[ApiKey], previous: Mapping[bytes, TokenBucket]) -> _KeySet:
        store = KeyStore(keys)
        buckets: dict[bytes, TokenBucket] = {}
        for key in store.keys:
            if key.rate is None:
                continue
            bucket = previous.get(key.digest)
            if bucket is None or bucket.rate != key.rate:
                bucket = TokenBucket(key.rate, self.clock)
            buckets[key.digest] = bucket
        return _KeySet(store, buckets)

    def check(self, method: str, request: Any, metadata: Iterable[tuple[str, Any]] | None) -> ApiKey:
        """The caller's key, or a ServiceError: UNAUTHENTICATED, RESOURCE_EXHAUSTED,
        PERMISSION_DENIED or INVALID_ARGUMENT (no collection where one is required)."""
        keys = self._keys  # one set for the whole check, whatever a reload does meanwhile
        key = self._authenticate(keys, metadata)
        self._limit(keys, key)
        try:
            self._authorise(key, method, request)
        except ServiceError as exc:
            outcome = "permission_denied" if exc.code == grpc.StatusCode.PERMISSION_DENIED else "invalid"
            AUTH_REQUESTS.labels(self.service, key.id, outcome).inc()
            raise
        AUTH_REQUESTS.labels(self.service, key.id, "ok").inc()
        return key

    def _authenticate(self, keys: _KeySet, metadata: Iterable[tuple[str, Any]] | None) -> ApiKey:
        try:
            presented = credential_from(metadata)
        except ServiceError:
            AUTH_REQUESTS.labels(self.service, NO_KEY_LABEL, "unauthenticated").inc()
            raise
        key = keys.store.match(presented) if presented and len(presented) <= MAX_KEY_CHARS else None
        if key is None:
            AUTH_REQUESTS.labels(self.service, NO_KEY_LABEL, "unauthenticated").inc()
            raise unauthenticated(MISSING_KEY if not presented else INVALID_KEY)
        return key

    def _limit(self, keys: _KeySet, key: ApiKey) -> None:
        bucket = keys.buckets.get(key.digest)
        wait = bucket.take() if bucket is not None else 0.0
        if wait > 0:
            assert key.rate is not None
            AUTH_REQUESTS.labels(self.service, key.id, "rate_limited").inc()
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


def default_rate_of(settings: MeshSettings) -> Rate | None:
    """The rate of keys whose entry sets none (None: unlimited)."""
    return Rate.of(settings.api_key_rate_per_s, settings.api_key_burst or None)


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
    keys = load_keys(settings.api_keys_file, default_rate_of(settings))
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
