"""The pipeline config: readable errors naming line and field, env interpolation, no inline secrets."""

import pytest

from cdc_assets.catalog import resolve_tables
from cdc_assets.config import DEMO_CONFIG_PATH, ConfigError, load_config, parse_config
from cdc_assets.core.columns import ColumnChoices
from cdc_assets.io.spark import CLASS_ARCHIVE_ENV_VAR, JAVA_OPTIONS
from cdc_assets.resources import build_resources
from cdc_assets.translator import CdcTranslator

VALID = """\
kafka:
  bootstrap_servers: 127.0.0.1:9092
delta:
  root: /data/delta
connectors:
  - name: inventory
    kind: postgresql
    topic.prefix: dbserver1
    tables:
      - name: inventory.customers
      - name: inventory.orders
        key_columns: [order_id]
        path: custom/orders
"""


def test_valid_config_resolves_topics_and_paths():
    tables = resolve_tables(parse_config(VALID))
    assert [(t.topic, t.target.path, t.merge.key_columns) for t in tables] == [
        ("dbserver1.inventory.customers", "/data/delta/dbserver1/inventory/customers", None),
        ("dbserver1.inventory.orders", "/data/delta/custom/orders", ("order_id",)),
    ]
    assert CdcTranslator().get_asset_key(tables[0]).path == ["dbserver1", "inventory", "customers"]


def test_errors_name_the_line_and_field():
    text = VALID.replace("kind: postgresql", "kind: postgres")
    with pytest.raises(ConfigError) as error:
        parse_config(text, source="pipeline.yaml")
    assert "pipeline.yaml:line 7: connectors.0.kind" in str(error.value)


def test_missing_section_is_named():
    with pytest.raises(ConfigError, match=r"line 1: delta: Field required"):
        parse_config(VALID.replace("delta:\n  root: /data/delta\n", ""))


def test_inline_secrets_are_refused():
    text = VALID.replace("  bootstrap_servers: 127.0.0.1:9092\n",
                         "  bootstrap_servers: 127.0.0.1:9092\n  settings:\n    sasl.password: hunter2\n")
    with pytest.raises(ConfigError, match=r"'sasl\.password' carries a secret"):
        parse_config(text)


def test_env_interpolation_with_default_and_missing(monkeypatch):
    text = VALID.replace("/data/delta", "${DELTA_ROOT_TEST:-/tmp/default}")
    assert parse_config(text).delta.root == "/tmp/default"
    monkeypatch.setenv("DELTA_ROOT_TEST", "/from/env")
    assert parse_config(text).delta.root == "/from/env"
    with pytest.raises(ConfigError, match="environment variable NOT_SET_ANYWHERE is not set"):
        parse_config(VALID.replace("/data/delta", "${NOT_SET_ANYWHERE}"))


def test_table_paths_cannot_escape_the_delta_root():
    with pytest.raises(ConfigError, match="outside the Delta root"):
        resolve_tables(parse_config(VALID.replace("custom/orders", "../../etc/orders")))


def test_bad_table_name_and_duplicates():
    with pytest.raises(ConfigError, match=r"line 10: connectors\.0\.tables\.0\.name"):
        parse_config(VALID.replace("inventory.customers", "inventory. customers"))
    with pytest.raises(ConfigError, match="lists tables more than once"):
        parse_config(VALID.replace("inventory.orders", "inventory.customers"))


def test_include_patterns_match_broker_topics():
    text = VALID.replace("    tables:\n", "    include: ['inventory\\.prod.*']\n    tables:\n")
    topics = ["dbserver1.inventory.products", "dbserver1.inventory.customers", "dbserver1.transaction",
              "other.inventory.products", "dbserver1"]
    names = [t.name for t in resolve_tables(parse_config(text), list_topics=lambda: topics)]
    assert names == ["inventory.customers", "inventory.orders", "inventory.products"]


def test_missing_file_and_demo_default(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="cannot read the pipeline config"):
        load_config(tmp_path / "nope.yaml")
    monkeypatch.delenv("CDC_ASSETS_CONFIG", raising=False)
    assert [c.name for c in load_config().connectors] == ["inventory", "sales"]
    assert DEMO_CONFIG_PATH.exists()


MONGODB = VALID.replace("kind: postgresql", "kind: mongodb").replace("        key_columns: [order_id]\n", "")


def test_mongodb_collections_take_scd2_and_document_fields():
    text = MONGODB.replace("        path: custom/orders\n", "        path: custom/orders\n        apply_mode: scd2\n"
                           "        document_fields: {status: string, qty: bigint, total: 'decimal(10,2)'}\n")
    orders = resolve_tables(parse_config(text))[1]
    assert orders.merge.apply_mode == "scd2" and orders.merge.document_fields == (
        ("status", "string"), ("qty", "bigint"), ("total", "decimal(10,2)"))


@pytest.mark.parametrize(("fields", "problem"), [
    ("{qty: int64}", "field 'qty': type 'int64' is not one a document field can take"),
    ("{qty: 'array<int>'}", "is not one a document field can take"),
    ("{'a.b': string}", "'a.b' is not a top-level field name"),
    ("{document: string}", "'document' is not a top-level field name"),
    ("{_cdc_op: string}", "'_cdc_op' is not a top-level field name"),
    ("{id: string}", r"document_fields names key column\(s\) \['id'\]"),
])
def test_document_fields_are_validated_at_load(fields, problem):
    text = MONGODB.replace("        path: custom/orders\n",
                           f"        path: custom/orders\n        document_fields: {fields}\n")
    with pytest.raises(ConfigError, match=problem):
        parse_config(text)


def test_document_fields_are_for_mongodb_only():
    text = VALID.replace("        path: custom/orders\n",
                         "        path: custom/orders\n        document_fields: {a: string}\n")
    with pytest.raises(ConfigError, match="document_fields are for MongoDB collections, not postgresql tables"):
        parse_config(text)


def test_the_class_archive_is_for_a_runs_own_jvm_only(tmp_path, monkeypatch):
    archive = tmp_path / "classes.jsa"
    archive.write_bytes(b"")
    monkeypatch.setenv(CLASS_ARCHIVE_ENV_VAR, str(archive))

    def archive_mapped(text):
        options = build_resources(parse_config(text))["spark"].spark_config.get(JAVA_OPTIONS, "")
        return f"-XX:SharedArchiveFile={archive}" in options

    assert not archive_mapped(VALID)  # the embedded default: the local Spark server, shared and long-lived
    assert archive_mapped(VALID + "spark:\n  local_server: false\n")


def test_placeholder_and_truncate_policy_reach_each_table():
    tables = resolve_tables(parse_config(VALID))
    # Defaults: Debezium's own placeholder, and a TRUNCATE halts (it never empties a table unasked).
    assert [(t.merge.unavailable_placeholder, t.merge.on_truncate) for t in tables] == [
        ("__debezium_unavailable_value", "halt"), ("__debezium_unavailable_value", "halt")]
    custom = VALID.replace("    topic.prefix: dbserver1\n",
                           "    topic.prefix: dbserver1\n    unavailable.value.placeholder: __toast__\n").replace(
        "        path: custom/orders\n", "        path: custom/orders\n        on_truncate: ignore\n")
    tables = resolve_tables(parse_config(custom))
    assert [(t.merge.unavailable_placeholder, t.merge.on_truncate) for t in tables] == [("__toast__", "halt"),
                                                                             ("__toast__", "ignore")]
    with pytest.raises(ConfigError, match=r"on_truncate: Input should be 'halt', 'ignore' or 'apply'"):
        parse_config(custom.replace("on_truncate: ignore", "on_truncate: drop"))


def test_the_documented_config_example_loads_as_written():
    """docs/configuration.md's annotated pipeline config is a config the project loads, every field as shown."""
    import re
    from pathlib import Path

    reference = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    example, choices, mongodb = re.findall(r"```yaml\n(.*?)```", reference, re.S)
    config = parse_config(example)
    [connector] = config.connectors
    assert connector.name == "inventory" and connector.format == "json"
    assert [table.name for table in connector.tables] == ["inventory.customers", "inventory.customers_history",
                                                          "inventory.audit_log"]
    history = next(t for t in resolve_tables(config, list_topics=lambda: []) if t.name.endswith("_history"))
    assert history.source_table == "inventory.customers"
    # Column choices: one table per setting, each meaning what its comment says.
    [chosen] = parse_config(choices).connectors
    assert {table.name: table.column_choices for table in chosen.tables} == {
        "inventory.customers": ColumnChoices(include=("email", "country")),
        "inventory.customers_archive": ColumnChoices(exclude=("ssn", "birth_date")),
        "inventory.devices": ColumnChoices(ignore_null_updates=True),
        "inventory.orders": ColumnChoices(ignore_null_updates=("shipped_at",)),
        "inventory.accounts": ColumnChoices(track_history=("plan", "status")),
        "inventory.sessions": ColumnChoices(track_history_except=("last_seen_at",)),
    }
    [orders] = resolve_tables(parse_config(mongodb))
    assert (orders.topic, orders.merge.apply_mode, orders.merge.document_fields) == (
        "mongo1.inventory.orders", "scd2",
        (("status", "string"), ("qty", "bigint"), ("total", "decimal(10,2)"), ("placed", "timestamp")))


def test_a_run_names_a_kafka_secret_variable_that_is_not_set(monkeypatch):
    """A run's Kafka client needs the secrets the config names by variable: one that is not set is an error
    naming it (before, a client without it failed later at the broker); a load reads on without it."""
    from cdc_assets.config import KafkaConfig
    from cdc_assets.resources import KafkaResource, MissingSecretError, kafka_client_settings

    monkeypatch.delenv("CDC_TEST_UNSET_PASSWORD", raising=False)
    kafka = KafkaConfig(bootstrap_servers="127.0.0.1:1", sasl_username_env="USER",
                        sasl_password_env="CDC_TEST_UNSET_PASSWORD", security_protocol="SASL_SSL",
                        sasl_mechanism="PLAIN")
    monkeypatch.setenv("USER", "someone")
    assert "sasl.password" not in kafka_client_settings(kafka)
    resource = KafkaResource(**kafka.model_dump())
    with pytest.raises(MissingSecretError, match="CDC_TEST_UNSET_PASSWORD"):
        resource.client_settings()


def test_each_setting_has_one_variable_and_the_address_hint_names_the_config_loaded(tmp_path):
    """The bundled configs and the docs read the broker's address from one variable (issue 62); what a run says
    to change when no broker answers names the file loaded and the variable it reads, not the demo's."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for bundled in (DEMO_CONFIG_PATH, root / "docs" / "minimal-pipeline.yaml"):
        assert load_config(bundled).variables_of("kafka.bootstrap_servers") == ("CDC_KAFKA_BOOTSTRAP_SERVERS",)
    documented = (root / "docs" / "configuration.md").read_text() + (root / "docs" / "first-hour.md").read_text()
    assert "${CDC_KAFKA_BOOTSTRAP_SERVERS:-" in documented and "KAFKA_BOOTSTRAP:" not in documented
    mine = tmp_path / "mine.yaml"
    mine.write_text(VALID.replace("127.0.0.1:9092", "${MY_BROKERS:-127.0.0.1:9092}"))
    where = f"kafka.bootstrap_servers in {mine} (read from MY_BROKERS)"
    assert load_config(mine).where_set("kafka.bootstrap_servers") == where
    assert build_resources(load_config(mine))["kafka"].address_source == where
    assert parse_config(VALID, source="inline.yaml").where_set("kafka.bootstrap_servers") == \
        "kafka.bootstrap_servers in inline.yaml"


def test_rows_match_source_needs_a_kind_it_reads_and_a_dsn_and_falls_back_to_the_signal_channels():
    base = """\
kafka: {bootstrap_servers: "k:9092"}
delta: {root: /tmp/lake}
connectors:
  - name: c
    kind: KIND
    topic.prefix: p
    tables: [{name: s.t}]
"""
    with pytest.raises(ConfigError, match="rows_match_source reads PostgreSQL, MariaDB and MySQL sources only"):
        parse_config(base.replace("KIND", "sqlserver") + "    rows_match_source: {dsn_env: X}\n")
    with pytest.raises(ConfigError, match="rows_match_source needs dsn_env"):
        parse_config(base.replace("KIND", "mariadb") + "    rows_match_source: {cron: '0 3 * * *'}\n")
    signalled = base.replace("KIND", "postgresql") + (
        "    signal: {channel: source, table: s.signal, dsn_env: SIGNAL_DSN}\n")
    [connector] = parse_config(signalled).connectors
    assert connector.source_dsn_env == "SIGNAL_DSN" and connector.rows_match_source is None
    [connector] = parse_config(signalled + "    rows_match_source: {dsn_env: READONLY_DSN}\n").connectors
    assert connector.source_dsn_env == "READONLY_DSN"
    # Kafka Connect's offsets: for the MySQL family, an http(s) URL, and a connector name only beside a URL.
    with pytest.raises(ConfigError, match="kafka_connect_url is for MariaDB and MySQL connectors"):
        parse_config(signalled + "    rows_match_source: {kafka_connect_url: 'http://connect:8083'}\n")
    maria = base.replace("KIND", "mariadb")
    with pytest.raises(ConfigError, match="kafka_connect_url"):
        parse_config(maria + "    rows_match_source: {dsn_env: X, kafka_connect_url: 'connect:8083'}\n")
    with pytest.raises(ConfigError, match="kafka_connect_connector needs kafka_connect_url"):
        parse_config(maria + "    rows_match_source: {dsn_env: X, kafka_connect_connector: shop}\n")
    [connector] = parse_config(maria + "    rows_match_source: {dsn_env: X, kafka_connect_url: "
                               "'https://connect.example:8083/', kafka_connect_connector: shop}\n").connectors
    assert connector.rows_match_source is not None
    assert connector.rows_match_source.kafka_connect_url == "https://connect.example:8083/"
