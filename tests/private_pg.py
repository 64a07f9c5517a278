"""A private PostgreSQL server for tests that stop and start it (never the shared one)."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path


def _bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivatePostgres:
    """initdb + pg_ctl in a temporary directory, run as the ``postgres`` user when we are root."""

    def __init__(self) -> None:
        initdb, pg_ctl = _bin("initdb"), _bin("pg_ctl")
        if initdb is None or pg_ctl is None:
            raise RuntimeError("initdb/pg_ctl not found")
        self.pg_ctl = pg_ctl
        self.port = _free_port()
        self.root = Path(tempfile.mkdtemp(prefix="dw-pg-"))
        self.data = self.root / "data"
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self._as_postgres([initdb, "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
        self._frozen: list[int] = []

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _as_postgres(self, command: list[str]) -> None:
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._as_postgres(
            [self.pg_ctl, "-D", str(self.data), "-o", options, "-l", str(self.root / "log"), "-w", "start"]
        )

    def stop(self, mode: str = "fast") -> None:
        self._as_postgres([self.pg_ctl, "-D", str(self.data), "-m", mode, "-w", "stop"])

    def freeze(self) -> None:
        """SIGSTOP the server: it accepts connections (the kernel does) and never answers, a hung database."""
        self._frozen = self._pids()
        for pid in self._frozen:  # the postmaster first: it forks no backend after that
            os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        for pid in reversed(self._frozen):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self._frozen = []

    def _pids(self) -> list[int]:
        """The postmaster, then its children (the backends holding the clients' connections)."""
        master = int((self.data / "postmaster.pid").read_text().split()[0])
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == master:
                children.append(int(stat.parent.name))
        return [master, *children]

    def destroy(self) -> None:
        self.thaw()
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
