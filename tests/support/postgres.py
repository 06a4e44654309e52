"""A private PostgreSQL for tests: ``initdb`` into a fresh temporary directory, started on a free port
of 127.0.0.1 with logical decoding on, trust authentication, stopped and removed at the end.

Run as root, the server runs as the ``postgres`` OS user (PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from cdc_assets.demo.broker import free_port

_BINARIES = ("initdb", "pg_ctl")


class PostgresError(RuntimeError):
    """The private PostgreSQL could not be set up."""


def postgres_bin_dir() -> Path:
    """The directory holding ``initdb`` and ``pg_ctl``: Debian's newest ``/usr/lib/postgresql/*/bin``,
    else the one on ``PATH``."""
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name)
                      if p.parent.name.isdigit() else 0)
    for directory in reversed(versions):
        if all((directory / name).exists() for name in _BINARIES):
            return directory
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    raise PostgresError("PostgreSQL's initdb/pg_ctl were not found: run scripts/setup (installs Debian's postgresql)")


class PostgresServer:
    """One private PostgreSQL server; a context manager that starts it and stops and removes it."""

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        self.bin_dir = postgres_bin_dir()
        self.port = free_port()
        self.settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "wal_level": "logical",
            "max_replication_slots": "20",
            "max_wal_senders": "20",
            "max_connections": "100",
            "fsync": "off",  # a throwaway server: durability across OS crashes is not needed
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "shared_buffers": "64MB",
            "timezone": "UTC",
            **(settings or {}),
        }
        self.directory: Path | None = None

    @property
    def _as_postgres_user(self) -> list[str]:
        return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *command: str) -> None:
        result = subprocess.run([*self._as_postgres_user, *command], capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise PostgresError(f"{' '.join(command)} failed ({result.returncode}): {result.stderr or result.stdout}")

    def start(self) -> PostgresServer:
        """``initdb`` and start the server; returns once it accepts connections."""
        # Not under pytest's tmp dirs: those are private to root, the postgres user must reach its data.
        self.directory = Path(tempfile.mkdtemp(prefix="cdc-pg-"))
        data = self.directory / "data"
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.directory, user.pw_uid, user.pw_gid)
        self._run(str(self.bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                  "-E", "UTF8", "--no-locale", "--no-sync")
        with (data / "postgresql.conf").open("a") as conf:
            for name, value in self.settings.items():
                conf.write(f"{name} = '{value}'\n")
            conf.write(f"unix_socket_directories = '{self.directory}'\n")
        with (data / "pg_hba.conf").open("a") as hba:
            hba.write("host replication all 127.0.0.1/32 trust\n")
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(data), "-l", str(self.directory / "server.log"),
                  "-w", "-t", "60", "start")
        deadline = time.monotonic() + 60
        while True:
            try:
                psycopg.connect(self.dsn(), connect_timeout=2).close()
                return self
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self) -> None:
        """Stop the server (fast shutdown) and remove its directory."""
        if self.directory is None:
            return
        with contextlib.suppress(PostgresError):
            self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.directory / "data"), "-m", "fast", "-w", "stop")
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory = None

    def dsn(self, dbname: str = "postgres") -> str:
        """A libpq connection string for database ``dbname`` as the ``postgres`` superuser."""
        return f"host=127.0.0.1 port={self.port} dbname={dbname} user=postgres connect_timeout=10"

    def create_database(self, name: str) -> str:
        """Create database ``name`` and return its DSN."""
        with psycopg.connect(self.dsn(), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
