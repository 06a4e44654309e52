"""A private S3-API object store for tests: moto's server mode (``moto[server]``, installed by
``scripts/setup-tests``) on a free port of 127.0.0.1, its spilled objects in a fresh temporary directory,
stopped and removed at the end.

moto because it installs into the venv from PyPI (no other runtime, no JVM beside Spark's on a small
machine), starts in about a second, and serves what both Delta writers use: path-style requests,
multipart uploads, listing, and conditional puts (``If-None-Match: *``), on which delta-rs's safe
commits rest. It checks requests' signatures: the server's first requests (unsigned) make an IAM user
and its access key, and every later request must be signed with that key, so a writer that sends the
wrong credentials (or none) fails as on a real store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import boto3

from tests.support.processes import LocalServer

# The tests name the server's keys through these environment variables, as a user's config does.
ACCESS_KEY_ENV = "CDC_TEST_S3_ACCESS_KEY_ID"
SECRET_KEY_ENV = "CDC_TEST_S3_SECRET_ACCESS_KEY"
REGION = "us-east-1"
_SETUP_ACTIONS = 3  # create_user, put_user_policy, create_access_key


class ObjectStoreError(RuntimeError):
    """The private object store could not be started."""


class ObjectStore(LocalServer):
    """One private S3-API server; a context manager that starts it and stops and removes it."""

    def __init__(self) -> None:
        super().__init__()
        self.access_key = ""
        self.secret_key = ""

    @property
    def pid(self) -> int:
        """The server's process id (the benchmarks count its CPU)."""
        if self._process is None:
            raise ObjectStoreError("moto's server is not running")
        return self._process.pid

    @property
    def endpoint(self) -> str:
        """The server's URL."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ObjectStore:
        """Start the server; returns once it answers."""
        self.directory = Path(tempfile.mkdtemp(prefix="cdc-s3-"))
        # moto spills object bodies past its buffer size to temporary files: in this server's own directory.
        # Its first requests go unsigned (the IAM user's set-up), then every request must be signed.
        environment = {**os.environ, "TMPDIR": str(self.directory), "INITIAL_NO_AUTH_ACTION_COUNT": str(_SETUP_ACTIONS)}
        log = (self.directory / "server.log").open("wb")
        self._process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=environment)
        log.close()
        deadline = time.monotonic() + 60
        while not self._answers():
            if self._process.poll() is not None:
                raise ObjectStoreError(f"moto's server exited ({self._process.returncode}): {self.log()}")
            if time.monotonic() > deadline:
                self.stop()
                raise ObjectStoreError("moto's server did not answer within 60 s")
            time.sleep(0.1)
        self._create_key()
        return self

    def _create_key(self) -> None:
        """An IAM user allowed all of S3, and its access key: the server's ``_SETUP_ACTIONS`` unsigned requests."""
        iam = boto3.client("iam", endpoint_url=self.endpoint, region_name=REGION,
                           aws_access_key_id="setup", aws_secret_access_key="setup")
        iam.create_user(UserName="cdc-tests")
        iam.put_user_policy(UserName="cdc-tests", PolicyName="s3", PolicyDocument=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="cdc-tests")["AccessKey"]
        self.access_key, self.secret_key = key["AccessKeyId"], key["SecretAccessKey"]

    def client(self) -> Any:  # boto3 generates its clients' types at run time
        """A boto3 S3 client of the server."""
        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key)

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name``; returns its name."""
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """The keys of ``bucket`` under ``prefix``, sorted."""
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))

    def storage_options(self) -> dict[str, str]:
        """``delta.storage_options`` for this server as a user writes them: keys named by environment
        variable (set by ``export_keys``)."""
        return {"endpoint": self.endpoint, "region": REGION, "allow_http": "true",
                "access_key_id_env": ACCESS_KEY_ENV, "secret_access_key_env": SECRET_KEY_ENV}

    def export_keys(self) -> None:
        """Put the server's keys in the environment variables ``storage_options`` names (runs in
        subprocesses and the local Spark server inherit them)."""
        os.environ[ACCESS_KEY_ENV] = self.access_key
        os.environ[SECRET_KEY_ENV] = self.secret_key

