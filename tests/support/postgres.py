"""A real PostgreSQL server for tests and benchmarks, from the machine's binaries (Debian's
postgresql-15; `.ci/run` installs them if missing).

`initdb` and `pg_ctl` refuse to run as root: as root they run as `nobody`, in a directory
it owns. The cluster trusts local connections (loopback only) and trades durability for
speed (fsync off): it is a test fixture. It is stopped by its postmaster's pid."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

BIN_DIRS = [Path("/usr/lib/postgresql/15/bin"), *sorted(Path("/usr/lib/postgresql").glob("*/bin"))]
USER = "memsvc"


def _bin(name: str) -> str:
    for d in BIN_DIRS:
        if (d / name).is_file():
            return str(d / name)
    found = shutil.which(name)
    if found:
        return found
    raise RuntimeError(
        f"PostgreSQL's {name} is not installed: `apt-get install postgresql` (Debian)"
        " provides /usr/lib/postgresql/15/bin; .ci/run installs it"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresCluster:
    """`durable`: fsync and synchronous commit on (a crash loses no acknowledged commit);
    off by default, as a fixture's speed matters more there."""

    def __init__(self, durable: bool = False, options: str = "") -> None:
        self.durable = durable
        self.options = options  # more `-c name=value` server settings
        self.root = Path(tempfile.mkdtemp(prefix="memsvc-pg-", dir="/tmp"))
        self.data = self.root / "data"
        self.port = _free_port()
        self._names = itertools.count()
        self.created: list[str] = []  # the databases create_database made, in order
        self._as_nobody = os.geteuid() == 0
        if self._as_nobody:
            os.chmod(self.root, 0o755)
            os.chown(self.root, 65534, 65534)

    def _run(self, *args: str) -> None:
        cmd = ["runuser", "-u", "nobody", "--", *args] if self._as_nobody else list(args)
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=self.root)
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed: {done.stdout}{done.stderr}")

    def start(self) -> PostgresCluster:
        if not self.data.exists():
            self._run(_bin("initdb"), "-D", str(self.data), "-U", USER, "--auth=trust", "--no-sync")
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
        options += f" -c max_connections=300 {self.options}"
        if not self.durable:
            options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        self._run(
            _bin("pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.root / "log"),
            "-w",
            "start",
        )
        return self

    @property
    def pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().splitlines()[0])

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database; returns its URL."""
        import psycopg

        name = f"t{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name} TEMPLATE template0")
        self.created.append(name)
        return self.url(name)

    def drop_databases(self, names: list[str]) -> None:
        """Drop `names` (connections still open to them are ended): each database holds
        ~7.5 MB on disk, and a suite makes hundreds."""
        import psycopg

        if not names or not (self.data / "postmaster.pid").exists():
            return  # a stopped or killed server: destroy() removes its files
        with psycopg.connect(self.url(), autocommit=True) as conn:
            for name in names:
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        self.created = [n for n in self.created if n not in names]

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (fast: clients disconnected; immediate: like a crash)."""
        if not (self.data / "postmaster.pid").exists():
            return
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def kill(self) -> None:
        """SIGKILL the postmaster (its children exit with it)."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError):
            return
        time.sleep(0.5)
        (self.data / "postmaster.pid").unlink(missing_ok=True)

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
