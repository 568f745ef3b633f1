"""``ragmesh keys``: API keys (docs/SECURITY.md).

- ``add``, ``list``, ``revoke`` edit a keys file in place: the local secure stack's
  (``<state_dir>/secure/api-keys.json``) or, with ``--file``, any deployment's (the file a
  Kubernetes Secret is made from). Every write is locked, validated with the services' own parser
  and atomic (meshkit.rpc.keysfile); the gateway and the ingestion API reload the file while running
  (meshkit.rpc.keyreload), so a change is in force within ``api_keys_reload_s`` without a restart.
  ``add`` prints the new key once: only its digest is stored.
- ``new`` mints a key and prints the entry to paste into a file; ``check`` validates a file.

Keys are listed with their id (``kid_...``), the label that metrics carry instead of the name.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshkit.core.errors import ServiceError
from meshkit.domain.ids import validate_collection
from meshkit.rpc.auth import ALL, KeysFileError, Rate, key_entry, key_id, load_keys, new_api_key
from meshkit.rpc.keysfile import Entry, LockedKeysFile, read_entries
from meshkit.settings import MeshSettings
from ragmesh_cli.documents import InputError
from ragmesh_cli.secure import SecureMaterial
from ragmesh_cli.state import state_dir_of
from ragmesh_cli.tables import format_table

RELOAD_NOTE = (
    "the gateway and the ingestion API apply it within RAGMESH_API_KEYS_RELOAD_S "
    f"({MeshSettings.model_fields['api_keys_reload_s'].default:g} s by default), without a restart"
)


def _collections(text: str) -> list[str]:
    return [c.strip() for c in text.split(",") if c.strip()]


# ---------------------------------------------------------------------------- parser


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """``ragmesh keys`` and its subcommands."""
    keys_parser = sub.add_parser("keys", parents=[common], help="API keys (docs/SECURITY.md)")
    keys_sub = keys_parser.add_subparsers(dest="keys_command", required=True)

    add = keys_sub.add_parser(
        "add", parents=[common], help="mint a key and add it to the keys file; prints the key once"
    )
    add.add_argument("--name", required=True, help="the key's name (logs, error messages), unique")
    add.add_argument(
        "--collection",
        action="append",
        required=True,
        metavar="C",
        help="a collection the key may use ('*': every one); repeat or comma separate for several",
    )
    access = add.add_mutually_exclusive_group()
    access.add_argument("--read-only", action="store_true", help="only search, ask and read status")
    access.add_argument("--write-only", action="store_true", help="only ingest, delete and replay")
    _rate_arguments(add)
    _file_argument(add)
    add.add_argument("--json", action="store_true", help='print {"name", "id", "api_key", ...}')
    add.set_defaults(func=run_add)

    listing = keys_sub.add_parser("list", parents=[common], help="the keys of the keys file, with their ids")
    listing.add_argument("--collection", default=None, help="only the keys granted something on it")
    listing.add_argument("--json", action="store_true")
    _file_argument(listing)
    listing.set_defaults(func=run_list)

    revoke = keys_sub.add_parser("revoke", parents=[common], help="remove a key from the keys file")
    revoke.add_argument("--name", required=True, help="the key to remove")
    _file_argument(revoke)
    revoke.set_defaults(func=run_revoke)

    new = keys_sub.add_parser(
        "new", parents=[common], help="mint a key: prints it once, and the keys-file entry (its digest)"
    )
    new.add_argument("--name", required=True, help="the key's name (logs, error messages)")
    new.add_argument("--read", default="", help="collections it may read, comma separated ('*': all)")
    new.add_argument("--write", default="", help="collections it may write, comma separated ('*': all)")
    _rate_arguments(new)
    new.add_argument("--json", action="store_true", help='print {"api_key": ..., "entry": ...}')
    new.set_defaults(func=run_new)

    check = keys_sub.add_parser("check", parents=[common], help="validate a keys file, list its keys")
    check.add_argument("path", nargs="?", default=None, help="keys file (default: $RAGMESH_API_KEYS_FILE)")
    check.set_defaults(func=run_check)


def _rate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rate", type=float, default=None, help="requests/s (default: the server's; 0: none)"
    )
    parser.add_argument("--burst", type=int, default=None, help="requests at once (default: 1 s worth)")


def _file_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--file",
        type=Path,
        default=None,
        metavar="PATH",
        help="the keys file to edit (default: the local secure stack's, <state-dir>/secure/api-keys.json)",
    )


# ---------------------------------------------------------------------------- where the keys are


@dataclass(frozen=True)
class KeysTarget:
    """The keys file a command acts on; ``stack``: the local secure stack it belongs to."""

    path: Path
    stack: SecureMaterial | None = None


def target_of(args: argparse.Namespace) -> KeysTarget:
    if args.file is not None:
        return KeysTarget(Path(args.file).absolute())
    state_dir = state_dir_of(args)
    material = SecureMaterial(state_dir)
    if not material.exists():
        raise InputError(
            f"no secure stack in {state_dir}: start one with 'ragmesh up --secure', or name a keys file "
            "with --file PATH"
        )
    return KeysTarget(material.keys_file, material)


# ---------------------------------------------------------------------------- entries


def _entry(name: str, key: str, read: list[str], write: list[str], args: argparse.Namespace) -> Entry:
    """The keys-file entry of a new key, validated; InputError says what is wrong."""
    if args.burst is not None and args.rate is None:
        raise InputError("--burst needs --rate")
    rate = Rate.of(args.rate, args.burst) if args.rate is not None else None
    try:
        entry = key_entry(name, key, read, write, rate)
    except KeysFileError as exc:
        raise InputError(str(exc)) from None
    if args.rate is not None and rate is None:
        entry["rate"] = {"per_second": 0}  # explicitly unlimited, whatever the server default
    return entry


def _grants(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """(read, write) of ``keys add``: both on every --collection unless told one of them."""
    collections = list(dict.fromkeys(c for given in args.collection for c in _collections(given)))
    if not collections:
        raise InputError("--collection names no collection")
    read = [] if args.write_only else collections
    write = [] if args.read_only else collections
    return read, write


def _rate_text(entry: Entry) -> str:
    rate = entry.get("rate")
    if rate is None:
        return "server default"
    per_second = float(rate["per_second"])
    if per_second <= 0:
        return "unlimited"
    return f"{per_second:g}/s burst {rate.get('burst') or max(1, math.ceil(per_second))}"


def _described(entry: Entry) -> dict[str, Any]:
    return {
        "name": entry["name"],
        "id": key_id(entry["sha256"]),
        "read": list(entry.get("read", [])),
        "write": list(entry.get("write", [])),
        "rate": entry.get("rate"),
    }


def _grants_on(entry: Entry, collection: str) -> bool:
    granted = [*entry.get("read", []), *entry.get("write", [])]
    return ALL in granted or collection in granted


# ---------------------------------------------------------------------------- commands


def run_add(args: argparse.Namespace) -> int:
    target = target_of(args)
    read, write = _grants(args)
    key = new_api_key()
    entry = _entry(args.name, key, read, write, args)
    try:
        if target.stack is not None:
            target.stack.add_key(entry)
        else:
            with LockedKeysFile(target.path) as keys_file:
                keys_file.add(entry)
                keys_file.save()
    except KeysFileError as exc:
        raise InputError(str(exc)) from None
    kid = key_id(entry["sha256"])
    if args.json:
        out = {"name": args.name, "id": kid, "api_key": key, "keys_file": str(target.path), "entry": entry}
        print(json.dumps(out, indent=2))
        return 0
    # The notes on stderr, the key alone on stdout: KEY=$(ragmesh keys add ...) holds just the key.
    print(
        f"added API key {args.name!r} (id {kid}) to {target.path}: read {read}, write {write}, rate "
        f"{_rate_text(entry)}; {RELOAD_NOTE}",
        file=sys.stderr,
    )
    print("the key follows, shown once: keep it in a secret store, it cannot be recovered", file=sys.stderr)
    print(key)
    return 0


def run_list(args: argparse.Namespace) -> int:
    target = target_of(args)
    if not target.path.exists():
        raise InputError(f"{target.path}: no such keys file")
    if args.collection is not None and args.collection != ALL:
        try:
            validate_collection(args.collection)
        except ServiceError as exc:
            raise InputError(f"--collection: {exc.message}") from None
    try:
        entries = read_entries(target.path)
    except KeysFileError as exc:
        raise InputError(str(exc)) from None
    if args.collection is not None:
        entries = [e for e in entries if _grants_on(e, args.collection)]
    described = [_described(e) for e in entries]
    if args.json:
        print(json.dumps(described, indent=2))
        return 0
    if not described:
        scope = f" for collection {args.collection!r}" if args.collection else ""
        print(f"no keys in {target.path}{scope}")
        return 0
    rows = [
        (d["name"], d["id"], ",".join(d["read"]) or "-", ",".join(d["write"]) or "-", _rate_text(e))
        for d, e in zip(described, entries, strict=True)
    ]
    print(format_table(["NAME", "ID", "READ", "WRITE", "RATE"], rows))
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    target = target_of(args)
    try:
        if target.stack is not None:
            removed = target.stack.revoke(args.name)
        else:
            with LockedKeysFile(target.path) as keys_file:
                removed = keys_file.remove(args.name)
                keys_file.save()
    except KeysFileError as exc:
        raise InputError(str(exc)) from None
    print(f"revoked API key {args.name!r} (id {key_id(removed['sha256'])}) in {target.path}; {RELOAD_NOTE}")
    return 0


def run_new(args: argparse.Namespace) -> int:
    key = new_api_key()
    entry = _entry(args.name, key, _collections(args.read), _collections(args.write), args)
    if not entry["read"] and not entry["write"]:
        raise InputError("the key would grant nothing: give --read and/or --write")
    if args.json:
        print(json.dumps({"api_key": key, "entry": entry}, indent=2))
        return 0
    print(f"API key {args.name!r} (shown once: keep it in a secret store, it cannot be recovered):")
    print(key)
    print()
    print('Add this entry to the "keys" list of the file RAGMESH_API_KEYS_FILE names (or let')
    print(f"'ragmesh keys add' do it); {RELOAD_NOTE}:")
    print(json.dumps(entry))
    return 0


def run_check(args: argparse.Namespace) -> int:
    path = Path(args.path) if args.path else MeshSettings().api_keys_file
    if path is None:
        raise InputError("give a keys file or set RAGMESH_API_KEYS_FILE")
    try:
        keys = load_keys(path)
    except KeysFileError as exc:
        raise InputError(str(exc)) from None
    print(f"{path}: {len(keys)} key(s)")
    for key in keys:
        rate = f"{key.rate.per_second:g}/s burst {key.rate.burst}" if key.rate else "server default"
        print(f"  {key.name}: read {sorted(key.read)}, write {sorted(key.write)}, rate {rate}, id {key.id}")
    return 0
