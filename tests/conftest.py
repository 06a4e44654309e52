"""Real parts for the tests: a local Apache Kafka broker, a local Spark session, Delta on disk."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession

from cdc_assets.core import ChangeEventLayout, value_type
from cdc_assets.demo.broker import ApacheKafkaBroker
from cdc_assets.demo.events import Record
from cdc_assets.io.delta import DeltaRsWriter, DeltaSparkWriter, DeltaWriter
from cdc_assets.io.spark import DELTA_JARS_ENV_VAR, delta_jars_dir, has_delta, spark_config, spark_records
from cdc_assets.io.spark_server import (
    SERVER_DIR_ENV_VAR,
    START_TIMEOUT_ENV_VAR,
    connect,
    disconnect,
    ensure_local_server,
    stop_all,
)
from tests.support import timing
from tests.support.jvm import TEST_JVM_OPTIONS, compiling_with_c2

# The private servers' modules import packages that only scripts/setup-tests installs (boto3) or clients the fast
# tier never needs (psycopg, pymysql): each fixture imports its own, so that tests/fast runs after scripts/setup alone.
if TYPE_CHECKING:
    from tests.support.apicurio import Apicurio
    from tests.support.azurite import Azurite
    from tests.support.connect import ConnectWorker
    from tests.support.mariadb import MariaDBServer
    from tests.support.objectstore import ObjectStore
    from tests.support.postgres import PostgresServer


# The modules that take minutes, longest first (docs/testing.md has the figures): scripts/test's workers take whole
# modules in collection order, so these start first and the short ones fill in beside them instead of trailing.
SLOW_MODULES_FIRST = (
    "merge/test_semantics.py",
    "io/test_object_store.py",
    "merge/test_pipeline.py",
    "jobs/test_cluster.py",
    "conformance/test_real_debezium.py",
    "conformance/test_pk_change_toast.py",
    "conformance/test_column_choices_real.py",
    "conformance/test_mariadb_rows_match_source.py",
    "merge/test_mongodb.py",
    "merge/test_transaction_merges.py",
    "demo/test_docs_first_hour.py",
    "conformance/test_mariadb_schema_changes.py",
    "definitions/test_browser.py",
    "merge/test_resilience.py",
    "merge/test_shared_plan.py",
    "definitions/test_component.py",
    "definitions/test_daemon.py",
    "conformance/test_mariadb_transactions.py",
    "benchmarks/test_references.py",
    "io/test_azure_store.py",
    "benchmarks/test_avro_decode.py",
    "sensors/test_schema_changes.py",
    "conformance/test_drift_repair_real.py",
    "conformance/test_mariadb_drift_repair_real.py",
    "io/test_delta_writers.py",
    "definitions/test_definitions.py",
    "conformance/test_exactly_once_connect.py",
)


def pytest_configure(config: pytest.Config) -> None:
    """Print where the suite's time went (tests/support/timing.py) after the run; C1 only for the suite's JVMs (the
    environment's ``JDK_JAVA_OPTIONS``, which xdist's workers and every process they start inherit)."""
    options = os.environ.get("JDK_JAVA_OPTIONS", "")
    if TEST_JVM_OPTIONS not in options:
        os.environ["JDK_JAVA_OPTIONS"] = f"{options} {TEST_JVM_OPTIONS}".strip()
    # Three workers on two cores: a cold Spark server (a benchmark's, an object store's) started while the cores are
    # full took over the default 180 s once (2026-12-02; the session's main server 43-57 s).
    os.environ.setdefault(START_TIMEOUT_ENV_VAR, "420")
    timing.register(config)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the slow modules first (``SLOW_MODULES_FIRST``); every other module keeps its place after them."""
    def rank(item: pytest.Item) -> int:
        path = item.path.as_posix()
        return next((i for i, name in enumerate(SLOW_MODULES_FIRST) if path.endswith("tests/" + name)),
                    len(SLOW_MODULES_FIRST))
    items.sort(key=rank)


@pytest.fixture(scope="session")
def broker() -> Iterator[ApacheKafkaBroker]:
    """A single-node Apache Kafka (KRaft) on a free port with a fresh log dir, for the whole session."""
    with ApacheKafkaBroker() as kafka:
        yield kafka


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A private PostgreSQL (logical decoding on) for the session, from the machine's binaries."""
    from tests.support.postgres import PostgresServer

    with PostgresServer() as server:
        yield server


@pytest.fixture(scope="session")
def mariadb() -> Iterator[MariaDBServer]:
    """A private MariaDB (row-based binlog, a ``dbz`` user with Debezium's grants) for the session."""
    from tests.support.mariadb import MariaDBServer

    with MariaDBServer() as server:
        yield server


@pytest.fixture(scope="session")
def connect_worker(broker: ApacheKafkaBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectWorker]:
    """One Kafka Connect 4.3 distributed worker (Debezium's MariaDB and PostgreSQL connectors, Apicurio's Avro
    converter) on the session's broker, shared by every test: give each connector its own name and
    ``topic.prefix``."""
    from tests.support.apicurio import AvroConnectWorker

    with AvroConnectWorker(broker.bootstrap_servers, tmp_path_factory.mktemp("connect")) as worker:
        yield worker
        # Killed, not stopped: nothing of it is kept, and a graceful stop waits on the tasks of connectors whose
        # databases the session may have stopped already (up to a minute at the end of the suite).
        worker.kill()


@pytest.fixture(scope="session")
def schema_registry() -> Iterator[Apicurio]:
    """One Apicurio Registry for the session: Avro connectors register their schemas in it, kept on disk as
    production keeps them durably (a ``restart`` loses none)."""
    from tests.support.apicurio import Apicurio

    with Apicurio(storage="disk") as registry:
        yield registry


@pytest.fixture(scope="session", autouse=True)
def local_spark_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The tests' own directory of local Spark servers (runs in subprocesses inherit it), all stopped
    at the end: the test sessions and the Dagster runs share one server, as runs do in production. One directory per
    xdist worker: one server shared by three workers (2026-11-30) took the suite 2,104 s against 1,945 s for two
    workers with one each, the servers' CPU up by 28 % (one 768 MB heap for all), and a test of the session slots
    failed on the other workers' sessions."""
    previous = os.environ.get(SERVER_DIR_ENV_VAR)
    os.environ[SERVER_DIR_ENV_VAR] = str(tmp_path_factory.mktemp("spark-servers"))
    yield
    timing.record_spark_servers()
    stop_all(kill=True)  # a graceful stop waited out its 60 s at the suite's end (2026-11-30)
    if previous is None:
        os.environ.pop(SERVER_DIR_ENV_VAR)
    else:
        os.environ[SERVER_DIR_ENV_VAR] = previous


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A session on the local Spark server of the embedded default's settings: the session's main server, started
    with C2 (``jvm.compiling_with_c2``)."""
    with compiling_with_c2():
        url = ensure_local_server(spark_config())
    session = connect(url)
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


@pytest.fixture(scope="session")
def object_store() -> Iterator[ObjectStore]:
    """A private S3-API server (moto) for the session, its keys in the environment variables that its
    ``storage_options()`` name (runs and the local Spark server inherit them); give each test its own bucket."""
    from tests.support.objectstore import ObjectStore

    with ObjectStore() as store:
        store.export_keys()
        yield store


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    """A private Azure Blob server (Azurite) for the session, its account key in the environment variable
    its ``storage_options()`` name; give each test its own container."""
    from tests.support.azurite import Azurite

    with Azurite() as server:
        server.export_key()
        yield server


