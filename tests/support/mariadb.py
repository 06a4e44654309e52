"""A private MariaDB for tests: ``mariadb-install-db`` into a fresh temporary directory, ``mariadbd`` on a free
port of 127.0.0.1 with the row-based binlog Debezium reads, a ``dbz`` user with the connector's grants, stopped
and removed at the end.

Run as root, the server runs as the ``mysql`` OS user (Debian's package creates it; ``mariadbd`` refuses root).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pymysql
import pymysql.cursors

from cdc_assets.demo.broker import free_port
from tests.support.processes import terminate

_BINARIES = ("mariadbd", "mariadb-install-db")
# The grants Debezium's MariaDB connector documents (snapshot locks, binlog reading and its position).
DBZ_GRANTS = ("SELECT, RELOAD, SHOW DATABASES, REPLICATION SLAVE, REPLICATION CLIENT, BINLOG MONITOR, "
              "REPLICA MONITOR, LOCK TABLES")


# Each connector reads the binlog as a replica with a server id of its own (unique among the server's replicas).
_CONNECTOR_SERVER_IDS = itertools.count(5401)


class MariaDBError(RuntimeError):
    """The private MariaDB could not be set up."""


def mariadb_binary(name: str) -> str:
    """The path of a MariaDB server binary (``mariadbd`` lives in /usr/sbin, not always on ``PATH``)."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
    if found is None:
        raise MariaDBError(f"MariaDB's {name} was not found: run scripts/setup-tests (installs mariadb-server)")
    return found


class MariaDBServer:
    """One private MariaDB server; a context manager that starts it and stops and removes it.

    ``user``/``password`` are the connector's account (``dbz``, Debezium's grants); ``connect``, ``execute`` and
    ``query`` use an administrator account (``test``, all privileges) over TCP.
    """

    user = "dbz"
    password = "dbz-secret"
    admin_user = "test"
    admin_password = "test-secret"
    host = "127.0.0.1"

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        self.binaries = {name: mariadb_binary(name) for name in _BINARIES}
        self.port = free_port()
        self.settings = settings or {}
        self.directory: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None

    def _defaults(self, directory: Path) -> str:
        """``my.cnf``: a throwaway server (no durability across OS crashes), binlog as Debezium needs it."""
        settings = {
            "user": "mysql",
            "datadir": str(directory / "data"),
            "socket": str(directory / "mariadb.sock"),
            "pid-file": str(directory / "mariadb.pid"),
            "log-error": str(directory / "server.log"),
            "port": str(self.port),
            "bind-address": self.host,
            "skip-name-resolve": "1",
            "server_id": "1",
            "log_bin": str(directory / "mariadb-bin"),
            "binlog_format": "ROW",
            "binlog_row_image": "FULL",
            "default_time_zone": "+00:00",  # TIMESTAMP columns read back in UTC, as Debezium sends them
            "character_set_server": "utf8mb4",
            "collation_server": "utf8mb4_unicode_ci",
            "innodb_flush_log_at_trx_commit": "2",
            "sync_binlog": "0",
            "innodb_buffer_pool_size": "64M",
            "performance_schema": "OFF",
            "init_file": str(directory / "init.sql"),
            **self.settings,
        }
        return "[mariadbd]\n" + "".join(f"{name}={value}\n" for name, value in settings.items())

    def _init_sql(self) -> str:
        """Accounts created by the server itself at start-up (``init_file``): no root login is needed."""
        statements = []
        for name, password, grants in ((self.admin_user, self.admin_password, "ALL PRIVILEGES"),
                                       (self.user, self.password, DBZ_GRANTS)):
            for host in ("127.0.0.1", "localhost"):
                statements.append(f"CREATE USER IF NOT EXISTS '{name}'@'{host}' IDENTIFIED BY '{password}';")
                statements.append(f"GRANT {grants} ON *.* TO '{name}'@'{host}' WITH GRANT OPTION;"
                                  if name == self.admin_user else f"GRANT {grants} ON *.* TO '{name}'@'{host}';")
        return "\n".join(statements) + "\n"

    def start(self) -> MariaDBServer:
        """Install a data dir and start the server; returns once the test account can connect."""
        # Not under pytest's tmp dirs: those are private to root, the mysql user must reach its data.
        self.directory = Path(tempfile.mkdtemp(prefix="cdc-mariadb-"))
        defaults = self.directory / "my.cnf"
        defaults.write_text(self._defaults(self.directory))
        (self.directory / "init.sql").write_text(self._init_sql())
        if os.geteuid() == 0:
            account = pwd.getpwnam("mysql")
            for path in (self.directory, defaults, self.directory / "init.sql"):
                os.chown(path, account.pw_uid, account.pw_gid)
        installed = subprocess.run(
            [self.binaries["mariadb-install-db"], f"--defaults-file={defaults}", "--skip-test-db",
             "--auth-root-authentication-method=socket"], capture_output=True, text=True, timeout=180)
        if installed.returncode != 0:
            raise MariaDBError(f"mariadb-install-db failed ({installed.returncode}): "
                               f"{installed.stderr or installed.stdout}")
        with (self.directory / "mariadbd.out").open("ab") as out:
            self.process = subprocess.Popen([self.binaries["mariadbd"], f"--defaults-file={defaults}"],
                                            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                self.connect().close()
                return self
            except pymysql.err.OperationalError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    log = self.log_tail()
                    self.stop()
                    raise MariaDBError(f"mariadbd did not start:\n{log}") from None
                time.sleep(0.2)

    def log_tail(self, lines: int = 40) -> str:
        """The end of the server's error log."""
        if self.directory is None:
            return ""
        path = self.directory / "server.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Stop the server (SIGTERM: a clean shutdown) and remove its directory."""
        if self.process is not None:
            terminate(self.process)
            self.process = None
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def connect(self, database: str | None = None) -> pymysql.connections.Connection:
        """A connection of the administrator account (autocommit, utf8mb4), to ``database`` if given."""
        return pymysql.connect(host=self.host, port=self.port, user=self.admin_user, password=self.admin_password,
                               database=database, autocommit=True, charset="utf8mb4", connect_timeout=10)

    def execute(self, sql: str, database: str | None = None, args: Any = None) -> int:
        """Run one statement (``%s`` parameters from ``args``); returns the rows it affected."""
        with contextlib.closing(self.connect(database)) as connection, connection.cursor() as cursor:
            return cursor.execute(sql, args)

    def query(self, sql: str, database: str | None = None, args: Any = None) -> list[dict[str, Any]]:
        """The rows of a query, as column -> value dicts (pymysql's types: int, Decimal, datetime, bytes, ...)."""
        with contextlib.closing(self.connect(database)) as connection, \
                connection.cursor(pymysql.cursors.DictCursor) as cursor:
            cursor.execute(sql, args)
            return list(cursor.fetchall())

    def connector_config(self, topic_prefix: str, databases: list[str], bootstrap_servers: str,
                         **overrides: str) -> dict[str, str]:
        """Debezium's MariaDB connector over ``databases`` of this server, for Kafka Connect: schema changes on
        (topic ``topic_prefix``), schema history in Kafka (``<topic_prefix>.schema-history``), table topics of 3
        partitions created by the worker; ``overrides`` are further connector properties (dots as given)."""
        return {
            "connector.class": "io.debezium.connector.mariadb.MariaDbConnector",
            "tasks.max": "1",
            "database.hostname": self.host,
            "database.port": str(self.port),
            "database.user": self.user,
            "database.password": self.password,
            "database.server.id": str(next(_CONNECTOR_SERVER_IDS)),
            "database.ssl.mode": "disable",  # MariaDB's spelling (MySQL's is "disabled")
            "topic.prefix": topic_prefix,
            "database.include.list": ",".join(databases),
            "include.schema.changes": "true",
            "schema.history.internal.kafka.bootstrap.servers": bootstrap_servers,
            "schema.history.internal.kafka.topic": f"{topic_prefix}.schema-history",
            "topic.creation.default.replication.factor": "1",
            "topic.creation.default.partitions": "3",
            "skipped.operations": "none",
            "bigint.unsigned.handling.mode": "precise",
            **overrides,
        }

    def __enter__(self) -> MariaDBServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
