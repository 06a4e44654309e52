"""A private Azure Blob Storage server for tests: Azurite's Blob service (npm ``azurite``, installed by
``scripts/setup-tests``) on a free port of 127.0.0.1, its data in a fresh temporary directory, stopped and
removed at the end.

Azurite serves the Blob API, not ADLS Gen2's ``dfs`` one; both writers reach it all the same: delta-rs
through its Blob client, delta-spark through ABFS's Blob-endpoint client (Hadoop 3.5's, for accounts
without a hierarchical namespace), with the settings ``cdc_assets.io.storage`` gives an emulator's
``endpoint``. The server has one account of its own, whose key is made at start; it checks every
request's Shared Key signature, so a writer given another key fails as on Azure.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
import urllib.request
from email.utils import formatdate
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlparse

from tests.support.processes import LocalServer

ACCOUNT = "cdctests"  # the server's account unless a test names another
# The tests name the account's key through this environment variable, as a user's config does.
ACCOUNT_KEY_ENV = "CDC_TEST_AZURE_ACCOUNT_KEY"
_API_VERSION = "2021-08-06"


class AzuriteError(RuntimeError):
    """The private Azurite server could not be started."""


def azurite_blob() -> Path:
    """Azurite's Blob server as ``scripts/setup-tests`` installed it."""
    return Path(sys.prefix) / "share" / "cdc-assets" / "azurite" / "node_modules" / ".bin" / "azurite-blob"


class Azurite(LocalServer):
    """One private Azurite Blob server; a context manager that starts it and stops and removes it."""

    def __init__(self, account: str = ACCOUNT) -> None:
        super().__init__()
        self.account = account
        self.account_key = base64.b64encode(secrets.token_bytes(32)).decode()

    @property
    def endpoint(self) -> str:
        """The account's URL (path style, as Azurite serves accounts): a config's ``endpoint``."""
        return f"http://127.0.0.1:{self.port}/{self.account}"

    def start(self) -> Azurite:
        """Start the server; returns once it answers."""
        if not azurite_blob().exists():
            raise AzuriteError(f"no Azurite at {azurite_blob()} (run scripts/setup-tests)")
        self.directory = Path(tempfile.mkdtemp(prefix="cdc-azurite-"))
        environment = {**os.environ, "AZURITE_ACCOUNTS": f"{self.account}:{self.account_key}"}
        log = (self.directory / "server.log").open("wb")
        self._process = subprocess.Popen(
            [str(azurite_blob()), "--blobHost", "127.0.0.1", "--blobPort", str(self.port),
             "--location", str(self.directory / "data"), "--silent", "--skipApiVersionCheck"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=environment)
        log.close()
        deadline = time.monotonic() + 60
        while not self._answers():
            if self._process.poll() is not None:
                raise AzuriteError(f"Azurite exited ({self._process.returncode}): {self.log()}")
            if time.monotonic() > deadline:
                self.stop()
                raise AzuriteError("Azurite did not answer within 60 s")
            time.sleep(0.2)
        return self

    def _request(self, method: str, path_and_query: str) -> bytes:
        """A Shared Key signed request to the account (Blob API): the response's body."""
        url = f"{self.endpoint}{path_and_query}"
        parsed = urlparse(url)
        headers = {"x-ms-date": formatdate(usegmt=True), "x-ms-version": _API_VERSION}
        canonical_headers = "".join(f"{name}:{value}\n" for name, value in sorted(headers.items()))
        resource = f"/{self.account}{parsed.path}" + "".join(
            f"\n{name}:{value}" for name, value in sorted(parse_qsl(parsed.query)))
        to_sign = f"{method}\n" + "\n" * 11 + canonical_headers + resource
        signature = base64.b64encode(hmac.new(base64.b64decode(self.account_key), to_sign.encode(),
                                              hashlib.sha256).digest()).decode()
        request = urllib.request.Request(url, method=method,
                                         headers={**headers, "Authorization": f"SharedKey {self.account}:{signature}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.read()

    def create_container(self, name: str) -> str:
        """Create container ``name``; returns its name."""
        self._request("PUT", f"/{name}?restype=container")
        return name

    def blobs(self, container: str, prefix: str = "") -> list[str]:
        """The blob names of ``container`` under ``prefix``, sorted (one listing page: the tests' few blobs)."""
        body = self._request("GET", f"/{container}?comp=list&prefix={quote(prefix, safe='')}&restype=container")
        return sorted(re.findall(r"<Name>([^<]*)</Name>", body.decode()))

    def root(self, container: str, prefix: str) -> str:
        """A ``delta.root`` in ``container`` of the server's account: ``abfs://`` (ABFS's scheme for plain
        HTTP, which the server speaks; delta-rs takes it as ``abfss://``)."""
        return f"abfs://{container}@{self.account}.dfs.core.windows.net/{prefix}"

    def storage_options(self) -> dict[str, str]:
        """``delta.storage_options`` for this server as a user writes them: the key named by environment
        variable (set by ``export_key``)."""
        return {"endpoint": self.endpoint, "account_key_env": ACCOUNT_KEY_ENV}

    def export_key(self) -> None:
        """Put the account's key in the environment variable ``storage_options`` names (runs and the local
        Spark server inherit it)."""
        os.environ[ACCOUNT_KEY_ENV] = self.account_key

