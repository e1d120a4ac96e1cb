"""A throwaway PostgreSQL cluster from the server binaries on the machine (``apt-get install
postgresql``), on a free loopback port, that a test can stop and start again on that port.

Its data directory is in memory (``/dev/shm``) where there is room for it: ``CREATE DATABASE
... TEMPLATE`` writes the template's ~11 MB twice (its files and the WAL), which on a disk busy
with other work took up to half a second for each test's database, and removing the cluster
at the session's end ten seconds."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.support.servers import free_port

IN_MEMORY = Path("/dev/shm")
IN_MEMORY_ROOM = 1 << 30
"""Free space ``/dev/shm`` must have to hold a cluster (a container's is often 64 MiB): the
cluster itself, a template and the databases the tests have open at once."""


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if found:
        return found[-1]
    on_path = shutil.which(name)
    if on_path is None:
        raise RuntimeError(f"PostgreSQL's {name} is not installed (apt-get install postgresql)")
    return on_path


def _as_postgres_user(command: list[str]) -> list[str]:
    # initdb and postgres refuse to run as root.
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


def _data_parent() -> Path | None:
    """Where the data directory goes: in memory if there is room, else the temporary dir."""
    try:
        if os.access(IN_MEMORY, os.W_OK) and shutil.disk_usage(IN_MEMORY).free >= IN_MEMORY_ROOM:
            return IN_MEMORY
    except OSError:
        pass
    return None


class PostgresCluster:
    """A new cluster (``initdb``), not yet started; ``remove`` deletes its files."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="lgw-pg-", dir=_data_parent()))
        self.port = free_port()
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        initdb = [_pg_bin("initdb"), "-D", str(self.root / "db"), "-U", "postgres", "-A", "trust"]
        initdb.append("--no-sync")
        subprocess.run(_as_postgres_user(initdb), check=True, capture_output=True)
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        data, log = str(self.root / "db"), str(self.root / "log")
        self._pg_ctl = [_pg_bin("pg_ctl"), "-D", data, "-l", log, "-o", options]

    @property
    def server_url(self) -> str:
        """The server's SQLAlchemy URL, without a database (append ``/name``)."""
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}"

    def start(self) -> None:
        command = _as_postgres_user([*self._pg_ctl, "-w", "start"])
        subprocess.run(command, check=True, capture_output=True)

    def stop(self) -> None:
        command = _as_postgres_user([*self._pg_ctl, "-m", "immediate", "stop"])
        subprocess.run(command, capture_output=True)

    def remove(self) -> None:
        """Stop the server and delete its files."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
