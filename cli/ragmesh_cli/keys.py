"""``ragmesh keys``: mint an API key (printed once, with the keys-file entry that holds only its
digest) and check a keys file before a service loads it (docs/SECURITY.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from meshkit.auth import KeysFileError, Rate, key_entry, load_keys, new_api_key
from meshkit.settings import MeshSettings
from ragmesh_cli.documents import InputError


def _collections(text: str) -> list[str]:
    return [c.strip() for c in text.split(",") if c.strip()]


def add_arguments(parser: argparse.ArgumentParser, check: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", required=True, help="the key's name (logs, metrics, error messages)")
    parser.add_argument("--read", default="", help="collections it may read, comma separated ('*': all)")
    parser.add_argument("--write", default="", help="collections it may write, comma separated ('*': all)")
    parser.add_argument("--rate", type=float, default=None, help="requests/s (default: the server's)")
    parser.add_argument("--burst", type=int, default=None, help="requests at once (default: 1 s worth)")
    parser.add_argument("--json", action="store_true", help='print {"api_key": ..., "entry": ...}')
    check.add_argument("path", nargs="?", default=None, help="keys file (default: $RAGMESH_API_KEYS_FILE)")


def run_new(args: argparse.Namespace) -> int:
    if args.burst is not None and args.rate is None:
        raise InputError("--burst needs --rate")
    key = new_api_key()
    rate = Rate.of(args.rate, args.burst) if args.rate is not None else None
    try:
        entry = key_entry(args.name, key, _collections(args.read), _collections(args.write), rate)
    except KeysFileError as exc:
        raise InputError(str(exc)) from None
    if args.rate is not None and rate is None:
        entry["rate"] = {"per_second": 0}  # explicitly unlimited, whatever the server default
    if not entry["read"] and not entry["write"]:
        raise InputError("the key would grant nothing: give --read and/or --write")
    if args.json:
        print(json.dumps({"api_key": key, "entry": entry}, indent=2))
        return 0
    print(f"API key {args.name!r} (shown once: keep it in a secret store, it cannot be recovered):")
    print(key)
    print()
    print('Add this entry to the "keys" list of the file RAGMESH_API_KEYS_FILE names, then restart the')
    print("gateway and the ingestion API:")
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
        print(f"  {key.name}: read {sorted(key.read)}, write {sorted(key.write)}, rate {rate}")
    return 0
