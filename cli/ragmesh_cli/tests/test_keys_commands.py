"""``ragmesh keys add/list/revoke`` on a keys file (``--file``) and on the local secure stack's,
and ``SecureMaterial.prepare`` (every ``ragmesh up``) keeping the entries it did not create: the
stack only makes sure of ``ops`` and the tenants it is started with, and a revoked tenant stays
out until the stack is started with it again, which then gets a new key."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

from meshkit.rpc.auth import KeyStore, digest_of, key_id, load_keys, new_api_key
from meshkit.rpc.keysfile import read_entries, write_entries
from ragmesh_cli.main import main
from ragmesh_cli.secure import SecureMaterial

TENANTS = {"tenant-a": (["alpha"], ["alpha"])}


def add(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["keys", "add", "--json", *args]) == 0, capsys.readouterr().err
    added: dict[str, Any] = json.loads(capsys.readouterr().out)
    return added


def listed(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, Any]]:
    assert main(["keys", "list", "--json", *args]) == 0, capsys.readouterr().err
    keys: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
    return keys


def names(path: Path) -> list[str]:
    return [e["name"] for e in read_entries(path)]


def failure(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(list(args)) == 1
    return capsys.readouterr().err


# ----------------------------------------------------------------------------- on a file


def test_add_prints_the_key_once_and_stores_only_its_digest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "api-keys.json"
    assert main(["keys", "add", "--file", str(path), "--name", "search-app", "--collection", "docs"]) == 0
    captured = capsys.readouterr()
    key = captured.out.strip()
    assert key.startswith("rmk_") and captured.out == key + "\n"  # stdout: the key alone
    assert "shown once" in captured.err and "search-app" in captured.err and key not in captured.err
    text = path.read_text()
    assert key not in text and digest_of(key) in text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    (loaded,) = load_keys(path)
    assert KeyStore([loaded]).match(key) == loaded
    assert (loaded.read, loaded.write, loaded.rate) == ({"docs"}, {"docs"}, None)  # read + write by default
    assert key_id(digest_of(key)) in captured.err


def test_add_grants_several_collections_read_or_write_only_and_rates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(tmp_path / "keys.json")
    add(capsys, "--file", path, "--name", "both", "--collection", "a", "--collection", "b,c")
    add(capsys, "--file", path, "--name", "reader", "--collection", "a", "--read-only", "--rate", "5")
    add(capsys, "--file", path, "--name", "ingest", "--collection", "*", "--write-only", "--rate", "0")
    added = add(capsys, "--file", path, "--name", "burst", "--collection", "a", "--rate", "2", "--burst", "9")
    assert added["entry"]["rate"] == {"per_second": 2.0, "burst": 9}
    by_name = {k["name"]: k for k in listed(capsys, "--file", path)}
    assert (by_name["both"]["read"], by_name["both"]["write"]) == (["a", "b", "c"], ["a", "b", "c"])
    assert (by_name["reader"]["read"], by_name["reader"]["write"]) == (["a"], [])
    assert by_name["reader"]["rate"] == {"per_second": 5.0, "burst": 5}
    assert (by_name["ingest"]["read"], by_name["ingest"]["write"]) == ([], ["*"])
    assert by_name["ingest"]["rate"] == {"per_second": 0}  # explicitly unlimited
    assert by_name["burst"]["id"] == added["id"] == key_id(added["entry"]["sha256"])
    assert "sha256" not in json.dumps(by_name)  # the listing shows ids, not digests


def test_add_refuses_a_duplicate_name_and_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "keys.json"
    first = add(capsys, "--file", str(path), "--name", "app", "--collection", "docs")
    before = path.read_bytes()
    err = failure(capsys, "keys", "add", "--file", str(path), "--name", "app", "--collection", "faq")
    assert "already exists" in err and "rmk_" not in err
    assert path.read_bytes() == before and first["api_key"] not in before.decode()
    assert "name" in failure(capsys, "keys", "add", "--file", str(path), "--name", "a b", "--collection", "x")
    assert "read" in failure(
        capsys, "keys", "add", "--file", str(path), "--name", "x", "--collection", "Bad!"
    )
    assert "--burst needs --rate" in failure(
        capsys, "keys", "add", "--file", str(path), "--name", "x", "--collection", "x", "--burst", "3"
    )
    with pytest.raises(SystemExit):  # argparse: the two are exclusive
        main(
            [
                "keys",
                "add",
                "--file",
                str(path),
                "--name",
                "x",
                "--collection",
                "x",
                "--read-only",
                "--write-only",
            ]
        )
    capsys.readouterr()
    assert "does not exist" in failure(
        capsys,
        "keys",
        "add",
        "--file",
        str(tmp_path / "nowhere" / "k.json"),
        "--name",
        "x",
        "--collection",
        "x",
    )
    assert names(path) == ["app"]


def test_an_invalid_file_is_refused_without_echoing_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "keys.json"
    pasted = new_api_key()
    path.write_text(json.dumps({"keys": [{"name": "a", "sha256": pasted, "read": ["x"]}]}))
    before = path.read_bytes()
    for command in (
        ["keys", "add", "--file", str(path), "--name", "b", "--collection", "x"],
        ["keys", "list", "--file", str(path)],
        ["keys", "revoke", "--file", str(path), "--name", "a"],
    ):
        err = failure(capsys, *command)
        assert "keys.0.sha256" in err and pasted not in err
    assert path.read_bytes() == before


def test_list_shows_names_next_to_ids_and_filters_by_collection(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(tmp_path / "keys.json")
    docs = add(capsys, "--file", path, "--name", "docs-app", "--collection", "docs")
    add(capsys, "--file", path, "--name", "faq-app", "--collection", "faq", "--read-only")
    add(capsys, "--file", path, "--name", "admin", "--collection", "*")
    assert main(["keys", "list", "--file", path]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split() == ["NAME", "ID", "READ", "WRITE", "RATE"]
    docs_row = next(line for line in table.splitlines() if line.startswith("docs-app"))
    assert docs["id"] in docs_row and "server default" in docs_row
    assert docs["api_key"] not in table and docs["entry"]["sha256"] not in table
    assert [k["name"] for k in listed(capsys, "--file", path, "--collection", "docs")] == [
        "docs-app",
        "admin",
    ]
    assert [k["name"] for k in listed(capsys, "--file", path, "--collection", "hr")] == ["admin"]
    assert "--collection" in failure(capsys, "keys", "list", "--file", path, "--collection", "Not Valid")
    assert "no such keys file" in failure(capsys, "keys", "list", "--file", str(tmp_path / "none.json"))


def test_revoke_removes_the_entry_and_nothing_else(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "keys.json"
    kept = {
        "name": "hand-made",
        "sha256": digest_of("rmk_x"),
        "read": ["a"],
        "write": [],
        "rate": {"per_second": 3},
    }
    write_entries(path, [kept])
    gone = add(capsys, "--file", str(path), "--name", "gone", "--collection", "a")
    assert main(["keys", "revoke", "--file", str(path), "--name", "gone"]) == 0
    out = capsys.readouterr().out
    assert "revoked" in out and gone["id"] in out
    assert read_entries(path) == [kept]
    assert "no key named 'gone'" in failure(capsys, "keys", "revoke", "--file", str(path), "--name", "gone")


# ----------------------------------------------------------------------------- the local stack's file


def test_the_commands_need_a_secure_stack_or_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = failure(capsys, "keys", "list", "--state-dir", str(tmp_path))
    assert "no secure stack" in err and "--file" in err


def test_prepare_keeps_every_entry_it_did_not_create(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    material = SecureMaterial(tmp_path, TENANTS)
    material.prepare()
    state = ["--state-dir", str(tmp_path)]
    added = add(capsys, *state, "--name", "gamma-app", "--collection", "gamma")
    # A hand-edited entry with every optional field: kept exactly as written.
    hand = {
        "name": "hand",
        "sha256": digest_of("rmk_hand"),
        "read": ["h"],
        "write": [],
        "rate": {"per_second": 1},
    }
    write_entries(material.keys_file, [*read_entries(material.keys_file), hand])
    before = read_entries(material.keys_file)
    for again in (SecureMaterial(tmp_path), SecureMaterial(tmp_path, TENANTS)):  # ragmesh up, with or without
        again.prepare()
        assert read_entries(material.keys_file) == before
    assert names(material.keys_file) == ["ops", "tenant-a", "gamma-app", "hand"]
    assert stat.S_IMODE(material.keys_file.stat().st_mode) == 0o600
    # The stack never stored the added key's plaintext.
    assert added["api_key"] not in (tmp_path / "secure" / "credentials.json").read_text()
    with pytest.raises(LookupError, match="no API key named 'gamma-app'"):
        SecureMaterial(tmp_path).api_key("gamma-app")


def test_a_revoked_tenant_comes_back_only_when_asked_for_with_a_new_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    SecureMaterial(tmp_path, TENANTS).prepare()
    old_key = SecureMaterial(tmp_path).api_key("tenant-a")
    state = ["--state-dir", str(tmp_path)]
    assert main(["keys", "revoke", *state, "--name", "tenant-a"]) == 0
    capsys.readouterr()
    material = SecureMaterial(tmp_path)
    assert names(material.keys_file) == ["ops"]
    assert old_key not in (tmp_path / "secure" / "credentials.json").read_text()  # forgotten
    material.prepare()  # ragmesh up: no tenants given, none re-added
    assert names(material.keys_file) == ["ops"]
    again = SecureMaterial(tmp_path, TENANTS)
    again.prepare()  # started with tenant-a again: back, with a new key
    new_key = again.api_key("tenant-a")
    assert new_key != old_key
    keys = {k.name: k for k in load_keys(again.keys_file)}
    assert KeyStore(keys.values()).match(new_key) == keys["tenant-a"]
    assert KeyStore(keys.values()).match(old_key) is None


def test_the_stack_grants_its_own_tenants_as_given_and_leaves_others_alone(tmp_path: Path) -> None:
    SecureMaterial(tmp_path, TENANTS).prepare()
    SecureMaterial(tmp_path, {"tenant-a": (["alpha", "beta"], [])}).prepare()
    material = SecureMaterial(tmp_path)
    (tenant,) = [e for e in read_entries(material.keys_file) if e["name"] == "tenant-a"]
    assert (tenant["read"], tenant["write"]) == (["alpha", "beta"], [])
    # An operator's entry under a tenant's name is not the stack's: kept, and no key is made up.
    operator = {"name": "tenant-b", "sha256": digest_of("rmk_operator"), "read": ["b"], "write": []}
    write_entries(material.keys_file, [*read_entries(material.keys_file), operator])
    SecureMaterial(tmp_path, {"tenant-b": (["other"], ["other"])}).prepare()
    assert read_entries(material.keys_file)[-1] == operator
    with pytest.raises(LookupError):
        SecureMaterial(tmp_path).api_key("tenant-b")


def test_ops_is_the_stacks_own(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    SecureMaterial(tmp_path).prepare()
    state = ["--state-dir", str(tmp_path)]
    assert "operator key" in failure(capsys, "keys", "revoke", *state, "--name", "ops")
    assert "reserved" in failure(capsys, "keys", "add", *state, "--name", "ops", "--collection", "x")
    assert names(SecureMaterial(tmp_path).keys_file) == ["ops"]


def test_prepare_refuses_to_overwrite_an_invalid_keys_file(tmp_path: Path) -> None:
    material = SecureMaterial(tmp_path)
    material.prepare()
    material.keys_file.write_text("{ broken")
    with pytest.raises(ValueError, match="not JSON"):
        SecureMaterial(tmp_path).prepare()
    assert material.keys_file.read_text() == "{ broken"


def test_keys_new_points_at_keys_add(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "new", "--name", "x", "--read", "docs"]) == 0
    out = capsys.readouterr().out
    assert "ragmesh keys add" in out and "restart" in out  # "without a restart"
