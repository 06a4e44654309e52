"""A deployment's connections checked before its first run, each within a time bound: the broker (a TCP
connection, then a metadata request with the configured security), topics, the schema registry, the Delta root
(a probe write and delete) and a source signal table. No config and no Dagster here: ``cdc_assets.preflight``
says what to check from the pipeline config, and the CLI and the Dagster job report the results."""

from __future__ import annotations

import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from confluent_kafka import Consumer, KafkaException

from cdc_assets.io.avro import SchemaRegistrySettings
from cdc_assets.io.kafka.clients import CLIENT_DEFAULTS
from cdc_assets.io.kafka.names import closest_topics
from cdc_assets.io.signals import mysql_address, signal_table_identifier
from cdc_assets.io.storage import delta_rs_options, store_of

Status = Literal["ok", "FAILED", "skipped"]
# A check's bound: all of them run side by side, so a whole preflight with something down ends within about
# this (issue 62 asks for 15 s).
CHECK_TIMEOUT_S = 10.0
# How long a TCP connection to a bootstrap address may take before the address counts as not answering.
CONNECT_TIMEOUT_S = 3.0
# delta-rs's object store gives up a request after these (its default retries for minutes).
_STORE_TIMEOUTS = {"timeout": "5s", "connect_timeout": "3s", "max_retries": "0"}


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome: what was checked (``check``, ``target``), whether it passed, a one-line ``detail``,
    and the config field a user changes when it fails."""

    check: str
    target: str
    status: Status
    detail: str
    field: str

    @property
    def failed(self) -> bool:
        return self.status == "FAILED"


class CheckFailed(Exception):
    """A check found its target wrong; the message is the one-line detail."""


def first_line(error: BaseException) -> str:
    """An error's first line (its type when it has no message): what a result shows."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def bounded(check: str, target: str, field: str, probe: Callable[[], str],
            timeout_s: float = CHECK_TIMEOUT_S) -> CheckResult:
    """Run ``probe`` (its return: the detail of a pass; an exception: the failure) within ``timeout_s``. It runs
    in a daemon thread, left behind if it outlasts the bound: no client library here can be told to stop
    (the process ends without waiting for it)."""
    outcome: list[CheckResult] = []

    def run() -> None:
        status: Status = "ok"
        try:
            detail = probe()
        except Exception as error:
            detail, status = first_line(error), "FAILED"
        outcome.append(CheckResult(check, target, status, detail, field))

    worker = threading.Thread(target=run, name=f"preflight-{check}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if outcome:
        return outcome[0]
    return CheckResult(check, target, "FAILED", f"no answer within {timeout_s:g} s", field)


def side_by_side(checks: Collection[Callable[[], list[CheckResult]]]) -> list[CheckResult]:
    """Each of ``checks`` (each bounded, returning its results) in a thread of its own; results in their order."""
    results: list[list[CheckResult]] = [[] for _ in checks]

    def run(index: int, check: Callable[[], list[CheckResult]]) -> None:
        results[index] = check()

    threads = [threading.Thread(target=run, args=(i, check), daemon=True) for i, check in enumerate(checks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [result for group in results for result in group]


def _addresses(bootstrap_servers: str) -> list[tuple[str, int]]:
    """``host:port`` pairs of a bootstrap list (a protocol prefix such as ``SSL://`` dropped; port 9092 if none)."""
    addresses = []
    for entry in bootstrap_servers.split(","):
        entry = entry.strip().split("://")[-1]
        if not entry:
            continue
        host, _, port = entry.rpartition(":") if entry.count(":") == 1 or entry.startswith("[") else (entry, "", "")
        addresses.append((host.strip("[]") or entry, int(port) if port.isdigit() else 9092))
    return addresses


def tcp_reachable(bootstrap_servers: str, timeout_s: float = CONNECT_TIMEOUT_S) -> str:
    """The first bootstrap address that takes a TCP connection; ``CheckFailed`` naming why each did not
    (refused, unresolvable, no answer). A closed port fails in milliseconds, before any Kafka client waits."""
    problems = []
    for host, port in _addresses(bootstrap_servers):
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return f"{host}:{port}"
        except TimeoutError:
            problems.append(f"{host}:{port}: no answer within {timeout_s:g} s")
        except OSError as error:
            problems.append(f"{host}:{port}: {error.strerror or error}")
    raise CheckFailed(f"no broker answers at {bootstrap_servers} ({'; '.join(problems) or 'no address'})")


def broker_topics(settings: Mapping[str, object], timeout_s: float = CHECK_TIMEOUT_S - CONNECT_TIMEOUT_S
                  ) -> dict[str, str | None]:
    """The broker's topics (each with its metadata error, None when readable) from one metadata request with
    the client ``settings`` (security included): a TLS or SASL mismatch fails here, at the request's bound."""
    client = Consumer({**CLIENT_DEFAULTS, **settings})
    try:
        metadata = client.list_topics(timeout=timeout_s)
    except KafkaException as error:
        raise CheckFailed(f"no metadata from {settings.get('bootstrap.servers')} within {timeout_s:g} s with the "
                          f"configured security ({error.args[0].str() if error.args else error})") from None
    finally:
        client.close()
    return {name: (str(topic.error) if topic.error is not None else None) for name, topic in metadata.topics.items()}


def topic_problem(topic: str, topics: Mapping[str, str | None]) -> str | None:
    """Why ``topic`` cannot be read, among the broker's ``topics`` (``broker_topics``); None when it can."""
    if topic not in topics:
        return f"does not exist; {closest_topics(topic, topics)}"
    error = topics[topic]
    return f"cannot be read: {error}" if error is not None else None


def registry_subjects(settings: SchemaRegistrySettings, subjects: Collection[str],
                      timeout_s: float = CHECK_TIMEOUT_S - 2) -> str:
    """That the registry answers and holds ``subjects``; ``CheckFailed`` naming those it lacks."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    client = SchemaRegistryClient({**settings.client_settings(), "timeout": timeout_s, "max.retries": 0})
    try:
        held = set(client.get_subjects())
    except Exception as error:
        raise CheckFailed(f"{settings.url} did not answer: {first_line(error)}") from None
    missing = sorted(set(subjects) - held)
    if missing:
        raise CheckFailed(f"{len(missing)} of {len(subjects)} subject(s) missing: {', '.join(missing[:5])}"
                          f"{' ...' if len(missing) > 5 else ''} ({len(held)} subject(s) held)")
    return f"answers; holds the {len(subjects)} subject(s) of the topics"


def probe_write(root: str, storage_options: Mapping[str, str]) -> str:
    """A small file written under the Delta ``root`` and deleted again, with the config's storage options and
    credentials: on local disk with the file system, on an object store with delta-rs's object-store client
    (the one both writers' credentials are given to: ``io.storage``)."""
    name = f".cdc-preflight-{uuid.uuid4().hex}"
    if store_of(root) == "local":
        return _probe_local(Path(root.removeprefix("file://")), name)
    from deltalake.fs import DeltaStorageHandler

    options = {**_STORE_TIMEOUTS, **delta_rs_options(storage_options)}
    store = DeltaStorageHandler(root, options)
    started = time.monotonic()
    try:
        # Its own stream: the handler's pyarrow wrapper (``open_output_stream``) hands it pyarrow buffers, which
        # it refuses (deltalake 1.6).
        stream = store._handler.open_output_stream(name, None)
        stream.write(b"cdc-assets preflight\n")
        stream.close()  # type: ignore[attr-defined]  # the upload ends here; deltalake's stub lacks it
        store.delete_file(name)
    except OSError as error:
        raise CheckFailed(f"cannot write and delete a file under {root}: {_store_error(error)}") from None
    return f"wrote and deleted {name} ({store_of(root)}, {time.monotonic() - started:.2f} s)"


def _store_error(error: OSError) -> str:
    """One line of an object-store error's chain: its first line, its deepest cause and the store's error code
    (``403 Forbidden (SignatureDoesNotMatch)``, ``Connection refused (os error 111)``)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    lines = [line.strip().lstrip("↳").strip() for line in text.splitlines() if line.strip()]
    causes = [line for line in lines[1:] if not line.startswith(("<", "Error performing"))]
    code = re.search(r"<Code>([^<]+)</Code>", text)
    return lines[0] + (f": {causes[-1]}" if causes else "") + (f" ({code.group(1)})" if code else "")


def _probe_local(root: Path, name: str) -> str:
    created = [parent for parent in (root, *root.parents) if not parent.exists()]
    root.mkdir(parents=True, exist_ok=True)
    try:
        probe = root / name
        probe.write_bytes(b"cdc-assets preflight\n")
        probe.unlink()
    finally:
        for directory in created:  # deepest first: what the probe made, and no more
            directory.rmdir()
    made = f" (made {created[-1]} and removed it)" if created else ""
    return f"wrote and deleted {name}{made}"


def signal_table(dsn_env: str, table: str, timeout_s: float = CHECK_TIMEOUT_S - 2) -> str:
    """That the source database named by ``$dsn_env`` answers and has the signal ``table`` (no row read)."""
    dsn = os.environ.get(dsn_env)
    if not dsn:
        raise CheckFailed(f"environment variable {dsn_env} is not set")
    schema_table = signal_table_identifier(table)
    address = mysql_address(dsn)
    if address is not None:
        connection = address.connect(timeout_s)
        try:
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT 1 FROM {'.'.join(f'`{part}`' for part in schema_table)} LIMIT 0")
        finally:
            connection.close()
        return f"{address.host}:{address.port} answers; {table} exists"
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, connect_timeout=int(timeout_s)) as connection:
        connection.execute(sql.SQL("SELECT 1 FROM {} LIMIT 0").format(sql.Identifier(*schema_table)))
        where = f"{connection.info.host}:{connection.info.port}"
    return f"{where} answers; {table} exists"
