"""The command lines and configs of a secure stack's infrastructure: SeaweedFS reads the security
config of its internal ports, NATS opens no monitoring port."""

from __future__ import annotations

import json
from pathlib import Path

from ragmesh_cli.secure import SecureMaterial
from ragmesh_cli.stack.files import NATS_CONFIG_FILE, nats_argv, weed_argv
from ragmesh_cli.stack.objectstore_security import SECURITY_FILE
from ragmesh_cli.stack.spec import NATS, S3, Component


def components() -> tuple[Component, Component]:
    s3_roles = ("main", "master", "volume", "filer", "admin")
    s3_ports = {role: 20000 + i for i, role in enumerate(s3_roles)}
    s3_ports |= {f"{role}_grpc": 30000 + i for i, role in enumerate(s3_roles)}
    return Component(NATS, NATS, {"main": 4222, "monitor": 8222}), Component(S3, S3, s3_ports)


def test_a_secure_stack_secures_seaweedfs_internal_ports(tmp_path: Path) -> None:
    material = SecureMaterial(tmp_path)
    material.prepare()
    _, s3 = components()
    argv = weed_argv(tmp_path, s3, material)
    # A global flag: it goes before the subcommand.
    config_dir = Path(argv[1].removeprefix("-config_dir="))
    assert argv[1].startswith("-config_dir=") and argv[2] == "mini"
    assert (config_dir / SECURITY_FILE).is_file()
    assert not any(a.startswith("-config_dir") for a in weed_argv(tmp_path / "plain", s3, None))


def test_a_secure_nats_has_no_monitoring_port(tmp_path: Path) -> None:
    material = SecureMaterial(tmp_path)
    material.prepare()
    nats, _ = components()
    nats_argv(tmp_path, nats, material)
    secure = json.loads((tmp_path / NATS_CONFIG_FILE).read_text())
    assert "http" not in secure and "tls" in secure
    nats_argv(tmp_path / "plain", nats, None)
    plain = json.loads((tmp_path / "plain" / NATS_CONFIG_FILE).read_text())
    assert plain["http"] == "127.0.0.1:8222"
