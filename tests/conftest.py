"""Real parts for the tests: a local Apache Kafka broker, a local Spark session, Delta on disk."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import DataFrame, SparkSession

from cdc_assets.catalog import CapturedTable
from cdc_assets.config import BatchLimits
from cdc_assets.core import ChangeEventLayout, value_type
from cdc_assets.demo.broker import PRODUCER_SETTINGS, ApacheKafkaBroker
from cdc_assets.demo.events import Record
from cdc_assets.io.delta import DeltaRsWriter, DeltaSparkWriter, DeltaTarget, DeltaWriter
from cdc_assets.io.kafka_source import KafkaSource
from cdc_assets.io.spark import DELTA_JARS_ENV_VAR, delta_jars_dir, has_delta, spark_config, spark_records
from cdc_assets.io.spark_server import SERVER_DIR_ENV_VAR, connect, disconnect, ensure_local_server, stop_all
from cdc_assets.merge import BatchReport, merge_micro_batch
from tests.apicurio import Apicurio, AvroConnectWorker
from tests.azurite import Azurite
from tests.connect import ConnectWorker
from tests.mariadb import MariaDBServer
from tests.objectstore import ObjectStore
from tests.postgres import PostgresServer

# Copies of ../shared/data/debezium-captures (real Debezium events, Apache License 2.0; see their README).
CAPTURES = Path(__file__).resolve().parent / "fixtures" / "debezium-captures"


@pytest.fixture(scope="session")
def broker() -> Iterator[ApacheKafkaBroker]:
    """A single-node Apache Kafka (KRaft) on a free port with a fresh log dir, for the whole session."""
    with ApacheKafkaBroker() as kafka:
        yield kafka


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A private PostgreSQL (logical decoding on) for the session, from the machine's binaries."""
    with PostgresServer() as server:
        yield server


@pytest.fixture(scope="session")
def mariadb() -> Iterator[MariaDBServer]:
    """A private MariaDB (row-based binlog, a ``dbz`` user with Debezium's grants) for the session."""
    with MariaDBServer() as server:
        yield server


@pytest.fixture(scope="session")
def connect_worker(broker: ApacheKafkaBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectWorker]:
    """One Kafka Connect 4.3 distributed worker (Debezium's MariaDB and PostgreSQL connectors, Apicurio's Avro
    converter) on the session's broker, shared by every test: give each connector its own name and
    ``topic.prefix``."""
    with AvroConnectWorker(broker.bootstrap_servers, tmp_path_factory.mktemp("connect")) as worker:
        yield worker


@pytest.fixture(scope="session")
def schema_registry() -> Iterator[Apicurio]:
    """One Apicurio Registry for the session: Avro connectors register their schemas in it, kept on disk as
    production keeps them durably (a ``restart`` loses none)."""
    with Apicurio(storage="disk") as registry:
        yield registry


@pytest.fixture(scope="session", autouse=True)
def local_spark_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The tests' own directory of local Spark servers (runs in subprocesses inherit it), all stopped
    at the end: the test sessions and the Dagster runs share one server, as runs do in production."""
    previous = os.environ.get(SERVER_DIR_ENV_VAR)
    os.environ[SERVER_DIR_ENV_VAR] = str(tmp_path_factory.mktemp("spark-servers"))
    yield
    stop_all()
    if previous is None:
        os.environ.pop(SERVER_DIR_ENV_VAR)
    else:
        os.environ[SERVER_DIR_ENV_VAR] = previous


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A session on the local Spark server of the embedded default's settings."""
    session = connect(ensure_local_server(spark_config()))
    yield session
    disconnect(session)


@pytest.fixture
def hand_over(spark: SparkSession) -> Iterator[Callable[..., DataFrame]]:
    """Hands (key, value) records to Spark as the merge path does (``io.spark.spark_records``), values
    parsed for a layout, at offsets 0, 1, ...; the frames stay readable until the test ends."""
    with contextlib.ExitStack() as frames:
        def frame(records: Sequence[Record], layout: ChangeEventLayout, partition: int = 0) -> DataFrame:
            table = pa.table({
                "partition": pa.array([partition] * len(records), pa.int32()),
                "offset": pa.array(range(len(records)), pa.int64()),
                "key": pa.array([k for k, _ in records], pa.binary()),
                "value": pa.array([v for _, v in records], pa.binary()),
            })
            return frames.enter_context(spark_records(spark, table, value_type(layout)))
        yield frame


@pytest.fixture(params=["delta-rs", "delta-spark"])
def writer(request: pytest.FixtureRequest, spark: SparkSession) -> DeltaWriter:
    """Each Delta writer in turn; delta-spark on the session's Delta jars (``scripts/setup`` fetches them)."""
    if request.param == "delta-rs":
        return DeltaRsWriter()
    if not has_delta(spark):
        pytest.fail(f"the local Spark session has no Delta: no jars in {delta_jars_dir()} (run scripts/setup) "
                    f"and none named by {DELTA_JARS_ENV_VAR}")
    return DeltaSparkWriter(spark)


def new_topic(broker: ApacheKafkaBroker, name: str, partitions: int = 1) -> str:
    """Create a uniquely named topic and return its name."""
    topic = f"{name}.{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result()
    return topic


def produce(broker: ApacheKafkaBroker, topic: str, records: Sequence[Record], partition: int | None = None) -> None:
    """Produce (key, value) records, keyed as Debezium keys them (same key, same partition)."""
    producer = Producer({**PRODUCER_SETTINGS, "bootstrap.servers": broker.bootstrap_servers})
    for key, value in records:
        if partition is None:
            producer.produce(topic, key=key, value=value)
        else:
            producer.produce(topic, key=key, value=value, partition=partition)
    assert producer.flush(30) == 0


def captured_table(topic: str, root: Path, kind: str = "postgresql", **options) -> CapturedTable:
    """A captured table reading ``topic`` into a Delta table under ``root``."""
    return CapturedTable(connector="test", kind=kind, topic_prefix=topic.split(".")[0], name="s.t", topic=topic,
                         target=DeltaTarget(str(root / topic)), **options)


def run_batch(spark: SparkSession, broker: ApacheKafkaBroker, writer: DeltaWriter, table: CapturedTable,
              max_records: int = 100_000) -> BatchReport:
    """One micro-batch of ``table`` through the real pipeline."""
    source = KafkaSource({"bootstrap.servers": broker.bootstrap_servers, "group.id": "cdc-tests"})
    try:
        return merge_micro_batch(spark, source, writer, table, BatchLimits(max_records=max_records,
                                                                           poll_timeout_s=10))
    finally:
        source.close()


def read_rows(spark: SparkSession, writer: DeltaWriter, table: CapturedTable, visible_only: bool = True) -> dict:
    """The Delta table as ``{key tuple: row dict}`` (hidden columns dropped unless asked)."""
    if writer.name == "delta-rs":
        from deltalake import DeltaTable

        rows = DeltaTable(table.target.path).to_pyarrow_table().to_pylist()
    else:
        rows = [row.asDict(recursive=True) for row in spark.read.format("delta").load(table.target.path).collect()]
    keys = table.key_columns or ("id",)
    result = {}
    for row in rows:
        if visible_only:
            row = {k: v for k, v in row.items() if not k.startswith("_cdc_")}
        result[tuple(row[k] for k in keys)] = row
    return result


@pytest.fixture(scope="session")
def object_store() -> Iterator[ObjectStore]:
    """A private S3-API server (moto) for the session, its keys in the environment variables that its
    ``storage_options()`` name (runs and the local Spark server inherit them); give each test its own bucket."""
    with ObjectStore() as store:
        store.export_keys()
        yield store


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    """A private Azure Blob server (Azurite) for the session, its account key in the environment variable
    its ``storage_options()`` name; give each test its own container."""
    with Azurite() as server:
        server.export_key()
        yield server


def race_after_fold(run: Callable[[], object], runs: int = 2, timeout_s: float = 180) -> None:
    """Call ``run`` in ``runs`` threads whose merges all fold their batch before any of them commits (a barrier
    at the merge's ``folded`` point), as two runs racing on one table do."""
    import threading

    from cdc_assets.merge import faults

    folded = threading.Barrier(runs, timeout=timeout_s)
    faults.fault_hook = lambda point: folded.wait() if point == "folded" else None
    try:
        threads = [threading.Thread(target=run) for _ in range(runs)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        faults.fault_hook = None
