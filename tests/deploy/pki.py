"""A throwaway mesh PKI for the deployment tests, made with the mesh's own (meshkit.rpc.pki): a CA
and certificates shaped like the ones the manifests expect (URI SAN spiffe://ragmesh/<identity>,
the DNS names pods dial, server and client auth)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from meshkit.rpc.identity import spiffe_id
from meshkit.rpc.pki import PKIFiles, issue, new_ca, write_pair


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path


class TestCA:
    __test__ = False  # not a test class, whatever its name

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self._files = PKIFiles(directory)
        self._ca = new_ca(days=1)
        write_pair(self._files, "ca", self._ca)
        self.ca_file = self._files.ca_cert

    def issue(self, identity: str, dns: list[str], ips: tuple[str, ...] = ("127.0.0.1",)) -> Issued:
        """A certificate for ``identity`` naming exactly ``dns`` and ``ips``."""
        cert = issue(
            self._ca, identity, dns_names=dns, ips=ips, uri=spiffe_id(identity), days=1, loopback=False
        )
        write_pair(self._files, identity, cert)
        return Issued(self._files.cert(identity), self._files.key(identity))
