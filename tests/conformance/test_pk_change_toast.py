"""Primary-key changes of rows whose TOASTed text is unchanged, captured by real Debezium (PostgreSQL,
``REPLICA IDENTITY DEFAULT``, 3 partitions): each change is a delete of the old key and a create of the
new key whose text is Debezium's placeholder. Merged with the project's ``cdc_merge_job`` in batches of
20 records (so batches stop at their limits between the two events), by both writers, in scd1 and scd2;
every Delta table must equal ``SELECT *`` of the source table (the oracle).

One Debezium capture feeds both tests: rows are inserted (snapshot and stream) and merged, so their text
is in Delta; then keys change without touching the text (one row and many rows a statement, with other
columns, chains of changes, rows inserted and changed before the next merge, updates after), and a second
merge runs.
"""

from __future__ import annotations

import random
import string
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support import harness as h

pytestmark = pytest.mark.conformance

SEED = 43_1
TEXT_BYTES = 10_000  # random text: pglz cannot shrink it below the TOAST threshold, so it is stored out of line
QUERY = "SELECT id, n, t FROM pkt"
ACTUAL = {"id": h.typed(int), "n": h.typed(int), "t": h.typed(str)}
TABLES = """\
      - {name: public.pkt}
      - {name: public.pkt_scd2, topic: TOPIC, path: PATH, apply_mode: scd2}
"""


@dataclass
class Capture:
    """The captured database and the merges' outcomes per writer."""

    dsn: str
    bootstrap_servers: str
    root: Path
    prefix: str
    first_merge: dict[str, list[str]] = field(default_factory=dict)

    def config(self, writer: str) -> str:
        """A pipeline config of the connector's two tables, merged by ``writer`` in batches of 20 records."""
        tables = TABLES.replace("TOPIC", f"{self.prefix}.public.pkt").replace("PATH", f"{self.prefix}/pkt_scd2")
        return f"""\
kafka: {{bootstrap_servers: "{self.bootstrap_servers}"}}
delta: {{root: "{self.root / writer}", writer: {writer}}}
batch: {{max_records: 20, poll_timeout_s: 5, max_batches_per_run: 500}}
connectors:
  - name: k
    kind: postgresql
    topic.prefix: {self.prefix}
    tables:
{tables}"""

    def merge(self, writer: str) -> list[str]:
        """``cdc_merge_job`` of both tables with ``writer``; its failed steps."""
        return h.failures(h.run_job(self.config(writer)))


def _text(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_letters + string.digits, k=TEXT_BYTES))


@pytest.fixture(scope="module")
def capture(broker: Any, postgres: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Capture]:
    """The capture, merged once by each writer between the inserts and the key changes."""
    run_id = uuid.uuid4().hex[:6]
    dsn = postgres.create_database(f"pk_toast_{run_id}")
    work = tmp_path_factory.mktemp("pk-toast")
    captured = Capture(dsn, broker.bootstrap_servers, work / "delta", f"pk{run_id}")
    rng = random.Random(SEED)
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute("CREATE TABLE cdc_marker (id int PRIMARY KEY)")
        connection.execute("CREATE TABLE pkt (id int PRIMARY KEY, n int, t text)")  # REPLICA IDENTITY DEFAULT
        connection.execute("ALTER TABLE pkt ALTER COLUMN t SET STORAGE EXTERNAL")
        for row_id in range(1, 13):  # taken by the initial snapshot
            connection.execute("INSERT INTO pkt VALUES (%s, %s, %s)", [row_id, row_id, _text(rng)])
        properties = h.connector_properties("k", captured.prefix, h.parse_dsn(dsn), ["public.pkt", "public.cdc_marker"],
                                            work)
        runner = h.DebeziumRunner(broker.bootstrap_servers, [properties], work)
        runner.start()
        try:
            h.write_marker(runner, connection, 1)
            for row_id in range(13, 25):  # streamed
                connection.execute("INSERT INTO pkt VALUES (%s, %s, %s)", [row_id, row_id, _text(rng)])
            h.write_marker(runner, connection, 2)
            captured.first_merge = {writer: captured.merge(writer) for writer in ("delta-rs", "delta-spark")}

            # Keys change without touching t: one row a statement, with and without another column.
            for row_id in range(1, 25, 3):
                connection.execute("UPDATE pkt SET id = id + 1000 WHERE id = %s", [row_id])
            for row_id in range(2, 25, 6):
                connection.execute("UPDATE pkt SET id = id + 2000, n = n + 1 WHERE id = %s", [row_id])
            # Many rows a statement, then a second change of some of them (a chain).
            connection.execute("UPDATE pkt SET id = id + 5000 WHERE id % 3 = 0 AND id < 100")
            connection.execute("UPDATE pkt SET id = id + 100 WHERE id BETWEEN 5000 AND 5020")
            # Rows inserted and changed before the next merge, and a key change in the same transaction.
            for row_id in range(300, 304):
                connection.execute("INSERT INTO pkt VALUES (%s, %s, %s)", [row_id, row_id, _text(rng)])
                connection.execute("UPDATE pkt SET id = id + 50 WHERE id = %s", [row_id])
            with connection.transaction():
                connection.execute("INSERT INTO pkt VALUES (400, 400, %s)", [_text(rng)])
                connection.execute("UPDATE pkt SET id = 401 WHERE id = 400")
                connection.execute("UPDATE pkt SET id = id + 7000 WHERE id = 1001")
            # Updates of other columns of changed rows (t unchanged), deletes, and an old key used again.
            connection.execute("UPDATE pkt SET n = n * 10 WHERE id > 1000 AND id % 2 = 0")
            connection.execute("DELETE FROM pkt WHERE id IN (1004, 2008)")
            connection.execute("UPDATE pkt SET id = 4 WHERE id = 1010")
            h.write_marker(runner, connection, 3)
        finally:
            runner.stop()
            h.drop_replication_slots(dsn)
        changed = connection.execute("SELECT count(*) FROM pkt WHERE id > 24").fetchone()
        assert changed is not None and changed[0] > 15
    yield captured


@pytest.mark.parametrize("writer", ["delta-rs", "delta-spark"])
def test_a_primary_key_change_keeps_unchanged_toasted_values(capture, writer):
    assert not capture.first_merge[writer], capture.first_merge[writer]
    failed = capture.merge(writer)
    assert not failed, failed
    source = h.source_rows(capture.dsn, QUERY)
    scd1 = capture.root / writer / capture.prefix / "public" / "pkt"
    scd2 = capture.root / writer / capture.prefix / "pkt_scd2"
    for mode, path in (("scd1", scd1), ("scd2", scd2)):
        problems = h.compare(source, h.current_rows(path, mode), ("id",), {}, ACTUAL)
        assert not problems, f"{writer} {mode}: {h.summarise(problems)}"
    # The history keeps the text in every version, the closed ones included.
    assert all(row["t"] is not None and len(row["t"]) == TEXT_BYTES for row in h.delta_rows(scd2))
