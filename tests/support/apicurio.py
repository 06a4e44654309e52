"""A private schema registry for tests: Apicurio Registry 2.6, or 3.3 for its Kafka-backed storage
(``scripts/setup-tests`` installs both) on free ports of 127.0.0.1 (its HTTP API and its management port, which
otherwise binds 0.0.0.0:9000), in-memory, on-disk or (3.3) Kafka-backed storage, plain HTTP or TLS, restartable,
stopped at the end; and a Kafka Connect worker that also has Apicurio's Avro converter as a plugin (its settings:
docs/connectors/avro.md).

Confluent's registry and converter are not on Maven Central; Apicurio's are, and speak Confluent's API
(``/apis/ccompat/v7``) and wire format (magic byte 0, 4-byte schema id, Avro body).
"""

from __future__ import annotations

import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from tests.support.connect import ConnectWorker
from tests.support.processes import LocalServer, free_port, terminate

APICURIO_VERSION = "2.6.13.Final"
APICURIO_HOME = Path(sys.prefix) / "share" / "cdc-assets" / "apicurio"
CONVERTER_PLUGINS = APICURIO_HOME / "converter"
# The 3.x app has Kafka-backed storage; it needs Java 21+, which scripts/setup-tests finds and names in its ``java``.
APICURIO3_VERSION = "3.3.3"
APICURIO3_HOME = Path(sys.prefix) / "share" / "cdc-assets" / f"apicurio-{APICURIO3_VERSION}"
STORAGES = {APICURIO_VERSION: ("memory", "disk"), APICURIO3_VERSION: ("memory", "disk", "kafkasql")}


class ApicurioError(RuntimeError):
    """The private registry could not be started."""


def _runner(version: str) -> Path:
    if version == APICURIO3_VERSION:
        return APICURIO3_HOME / "quarkus-run.jar"
    return APICURIO_HOME / "registry" / f"apicurio-registry-app-{APICURIO_VERSION}-runner.jar"


def _java(version: str) -> str:
    """The Java that runs ``version``: the one on PATH for 2.6 (17 suffices), the 21+ setup-tests found for 3.x."""
    if version != APICURIO3_VERSION:
        return "java"
    named = APICURIO3_HOME / "java"
    if not named.exists():
        raise ApicurioError(f"no Java 21+ named in {named} for Apicurio Registry {version} (run scripts/setup-tests)")
    return named.read_text().strip()


class Apicurio(LocalServer):
    """One private Apicurio Registry; a context manager that starts it and stops it, removing its directory.

    ``version``: ``APICURIO_VERSION`` (2.6.13, which the suite's Avro converter is) or ``APICURIO3_VERSION``.
    ``storage``: ``"memory"`` (Apicurio's default: a restart forgets every schema), ``"disk"`` (its SQL storage
    on an H2 file in the registry's directory: a ``restart`` keeps every schema and id) or, 3.x only,
    ``"kafkasql"`` (a journal topic of its own on the broker at ``bootstrap_servers``, which a ``restart`` reads
    back). The 2.6 app on Maven Central has no Kafka-backed storage (2.6 builds it into its container images only).
    ``tls``: a server certificate and key (PEM files): the API is then https only."""

    def __init__(self, storage: str = "memory", tls: tuple[Path, Path] | None = None,
                 version: str = APICURIO_VERSION, bootstrap_servers: str | None = None) -> None:
        super().__init__()
        if version not in STORAGES:
            raise ValueError(f"version must be one of {sorted(STORAGES)}, not {version!r}")
        if storage not in STORAGES[version]:
            raise ValueError(f"Apicurio {version}'s storage must be one of {STORAGES[version]}, not {storage!r}")
        if (storage == "kafkasql") != (bootstrap_servers is not None):
            raise ValueError("bootstrap_servers is for storage='kafkasql', which needs it")
        self.version = version
        self.storage = storage
        self.tls = tls
        self.bootstrap_servers = bootstrap_servers
        self.management_port = free_port()
        # Each registry's own journal: registries sharing the session broker must not read each other's schemas.
        self.journal = f"apicurio-{uuid.uuid4().hex[:8]}"

    @property
    def _base(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """Apicurio's own API, as its converter is configured."""
        return f"{self._base}/apis/registry/{'v3' if self.version == APICURIO3_VERSION else 'v2'}"

    @property
    def confluent_url(self) -> str:
        """The Confluent-compatible API: a pipeline config's ``schema_registry.url``."""
        return f"{self._base}/apis/ccompat/v7"

    def start(self) -> Apicurio:
        """Start the registry in a fresh directory; returns once its Confluent-compatible API answers."""
        if not _runner(self.version).exists():
            raise ApicurioError(f"no Apicurio Registry at {_runner(self.version)} (run scripts/setup-tests)")
        self.directory = Path(tempfile.mkdtemp(prefix="cdc-apicurio-"))
        self._launch()
        return self

    def restart(self) -> None:
        """Stop the registry (SIGTERM, as an orchestrator does) and start it again on the same ports and storage."""
        if self._process is not None:
            terminate(self._process, timeout_s=30)
            self._process = None
        self._launch()

    def _arguments(self) -> list[str]:
        arguments = ["-Dquarkus.http.host=127.0.0.1", "-Dquarkus.management.host=127.0.0.1",
                     f"-Dquarkus.management.port={self.management_port}"]
        if self.storage == "disk":
            assert self.directory is not None
            database = f"jdbc:h2:file:{self.directory / 'storage' / 'registry'}"
            setting = "apicurio.datasource.url" if self.version == APICURIO3_VERSION else "quarkus.datasource.jdbc.url"
            arguments.append(f"-D{setting}={database}")
        if self.storage == "kafkasql":
            arguments += ["-Dapicurio.storage.kind=kafkasql",
                          f"-Dapicurio.kafkasql.bootstrap.servers={self.bootstrap_servers}",
                          f"-Dapicurio.kafkasql.topic={self.journal}-journal",
                          f"-Dapicurio.kafkasql.snapshots.topic={self.journal}-snapshots",
                          # Each start polls the (here always empty) snapshots topic twice this long (5 s by default).
                          "-Dapicurio.kafkasql.consumer.poll.timeout=500"]
        if self.tls is None:
            return [*arguments, f"-Dquarkus.http.port={self.port}"]
        certificate, key = self.tls
        # Quarkus opens its plain port even with insecure requests disabled: a free one, so the known port is https.
        return [*arguments, f"-Dquarkus.http.port={free_port()}", f"-Dquarkus.http.ssl-port={self.port}",
                f"-Dquarkus.http.ssl.certificate.files={certificate}",
                f"-Dquarkus.http.ssl.certificate.key-files={key}", "-Dquarkus.http.insecure-requests=disabled"]

    def _launch(self) -> None:
        assert self.directory is not None
        log = (self.directory / "server.log").open("ab")
        self._process = subprocess.Popen(
            [_java(self.version), "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", *self._arguments(),
             "-jar", str(_runner(self.version))],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.directory)
        log.close()
        deadline = time.monotonic() + 90
        while not self._ready():
            if self._process.poll() is not None:
                raise ApicurioError(f"Apicurio exited ({self._process.returncode}): {self.log()}")
            if time.monotonic() > deadline:
                self.stop()
                raise ApicurioError("Apicurio did not answer within 90 s")
            time.sleep(0.3)

    def _ready(self) -> bool:
        # The readiness probe only: the server's certificate is the tests' own, checked by the clients under test.
        context = None
        if self.tls:
            context = ssl.create_default_context()
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        try:
            with urllib.request.urlopen(f"{self.confluent_url}/subjects", timeout=2, context=context) as answer:
                if answer.status != 200:
                    return False
            if self.version != APICURIO3_VERSION:
                return True
            # 3.x also says when its storage is ready (a Kafka-backed one: its journal read back) on its health check.
            with urllib.request.urlopen(f"http://127.0.0.1:{self.management_port}/health/ready", timeout=2) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, OSError):
            return False


class AvroConnectWorker(ConnectWorker):
    """A Kafka Connect worker (``tests.connect``) that also finds Apicurio's Avro converter."""

    def _properties(self) -> dict[str, str]:
        properties = super()._properties()
        return {**properties, "plugin.path": f"{properties['plugin.path']},{CONVERTER_PLUGINS}"}
