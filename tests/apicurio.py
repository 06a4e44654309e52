"""A private schema registry for tests: Apicurio Registry 2.6 (``scripts/setup-tests`` installs it) on free
ports of 127.0.0.1 (its HTTP API and its management port, which otherwise binds 0.0.0.0:9000), in-memory
storage (a fresh registry each start), stopped at the end; and a Kafka Connect worker that also has
Apicurio's Avro converter as a plugin (its settings: docs/connectors/avro.md).

Confluent's registry and converter are not on Maven Central; Apicurio's are, and speak Confluent's API
(``/apis/ccompat/v7``) and wire format (magic byte 0, 4-byte schema id, Avro body).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.connect import ConnectWorker
from tests.processes import LocalServer, free_port

APICURIO_VERSION = "2.6.13.Final"
APICURIO_HOME = Path(sys.prefix) / "share" / "cdc-assets" / "apicurio"
CONVERTER_PLUGINS = APICURIO_HOME / "converter"


class ApicurioError(RuntimeError):
    """The private registry could not be started."""


def _runner() -> Path:
    return APICURIO_HOME / "registry" / f"apicurio-registry-app-{APICURIO_VERSION}-runner.jar"


class Apicurio(LocalServer):
    """One private Apicurio Registry; a context manager that starts it and stops it, removing its directory."""

    def __init__(self) -> None:
        super().__init__()
        self.management_port = free_port()

    @property
    def url(self) -> str:
        """Apicurio's own API, as its converter is configured."""
        return f"http://127.0.0.1:{self.port}/apis/registry/v2"

    @property
    def confluent_url(self) -> str:
        """The Confluent-compatible API: a pipeline config's ``schema_registry.url``."""
        return f"http://127.0.0.1:{self.port}/apis/ccompat/v7"

    def start(self) -> Apicurio:
        """Start the registry; returns once its Confluent-compatible API answers."""
        if not _runner().exists():
            raise ApicurioError(f"no Apicurio Registry at {_runner()} (run scripts/setup-tests)")
        self.directory = Path(tempfile.mkdtemp(prefix="cdc-apicurio-"))
        log = (self.directory / "server.log").open("wb")
        self._process = subprocess.Popen(
            ["java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
             "-Dquarkus.http.host=127.0.0.1", f"-Dquarkus.http.port={self.port}",
             "-Dquarkus.management.host=127.0.0.1", f"-Dquarkus.management.port={self.management_port}",
             "-jar", str(_runner())],
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
        return self

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.confluent_url}/subjects", timeout=2) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, OSError):
            return False


class AvroConnectWorker(ConnectWorker):
    """A Kafka Connect worker (``tests.connect``) that also finds Apicurio's Avro converter."""

    def _properties(self) -> dict[str, str]:
        properties = super()._properties()
        return {**properties, "plugin.path": f"{properties['plugin.path']},{CONVERTER_PLUGINS}"}
