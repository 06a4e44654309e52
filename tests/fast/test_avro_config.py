"""A connector's ``format`` and ``schema_registry``: validated at load with file, line and field; and the Connect
schema the Avro rule derives from a writer schema as Kafka Connect's AvroData writes it (no registry needed)."""

import re
from pathlib import Path

import pytest

from cdc_assets.catalog import resolve_tables
from cdc_assets.config import ConfigError, parse_config
from cdc_assets.core.types import column_type
from cdc_assets.io.avro import SchemaRegistrySettings, UnsupportedAvroSchemaError, connect_schema

CONFIG = """\
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
"""


def with_connector_lines(lines: str) -> str:
    return CONFIG.replace("    tables:\n", lines + "    tables:\n")


def load_error(text: str) -> str:
    with pytest.raises(ConfigError) as error:
        parse_config(text, source="pipeline.yaml")
    return str(error.value)


def test_json_is_the_default_and_reads_no_registry():
    (table,) = resolve_tables(parse_config(CONFIG))
    assert table.merge.schema_registry is None


def test_avro_with_a_registry_reaches_every_table_and_the_transaction_log():
    text = with_connector_lines("    format: avro\n    transaction_metadata: true\n    schema_registry:\n"
                                "      url: http://registry:8080/apis/ccompat/v7\n"
                                "      basic_auth_user_env: REGISTRY_USER\n"
                                "      basic_auth_password_env: REGISTRY_PASSWORD\n")
    (table,) = resolve_tables(parse_config(text))
    expected = SchemaRegistrySettings("http://registry:8080/apis/ccompat/v7", "REGISTRY_USER", "REGISTRY_PASSWORD")
    assert table.merge.schema_registry == expected
    assert table.transactions is not None and table.transactions.log.schema_registry == expected


def test_avro_without_a_registry_is_refused_naming_line_and_field():
    message = load_error(with_connector_lines("    format: avro\n"))
    assert "pipeline.yaml:line 6: connectors.0.schema_registry" in message
    assert "format: avro needs a schema_registry" in message


def test_a_registry_for_a_json_connector_is_refused():
    message = load_error(with_connector_lines("    schema_registry: {url: 'http://registry:8080'}\n"))
    assert "pipeline.yaml:line 9: connectors.0.schema_registry" in message
    assert "read only with format: avro" in message


def test_an_unknown_format_is_refused():
    assert "pipeline.yaml:line 9: connectors.0.format" in load_error(with_connector_lines("    format: protobuf\n"))


@pytest.mark.parametrize(("registry", "problem"), [
    ("{url: 'registry:8080'}", "connectors.0.schema_registry.url: String should match pattern"),
    ("{url: 'http://r:8080', basic_auth_user_env: U}", "needs both basic_auth_user_env and basic_auth_password_env"),
    ("{url: 'http://r:8080', ssl_ca_location: /etc/hostname}", "ssl_ca_location is for an https:// registry"),
    ("{url: 'https://r:8443', ssl_ca_location: /nonexistent/ca.pem}", "'/nonexistent/ca.pem' is not a readable file"),
    ("{url: 'http://r:8080', password: hunter2}", "connectors.0.schema_registry.password: Extra inputs are not"),
])
def test_registry_settings_are_checked(registry, problem):
    message = load_error(with_connector_lines(f"    format: avro\n    schema_registry: {registry}\n"))
    assert "pipeline.yaml:line 10:" in message and problem in message


def test_registry_credentials_come_from_the_environment(monkeypatch):
    settings = SchemaRegistrySettings("http://r:8080", "REGISTRY_USER_TEST", "REGISTRY_PASSWORD_TEST")
    monkeypatch.setenv("REGISTRY_USER_TEST", "reader")
    monkeypatch.setenv("REGISTRY_PASSWORD_TEST", "s3cret")
    assert settings.client_settings()["basic.auth.user.info"] == "reader:s3cret"
    monkeypatch.delenv("REGISTRY_PASSWORD_TEST")
    with pytest.raises(RuntimeError, match="REGISTRY_PASSWORD_TEST named by schema_registry"):
        settings.client_settings()


# A Debezium PostgreSQL row schema as Kafka Connect's AvroData writes it (Apicurio's converter, as-confluent).
ROW = {"type": "record", "name": "Value", "namespace": "dbserver1.inventory.t", "fields": [
    {"name": "id", "type": "int"},
    {"name": "small", "type": ["null", {"type": "int", "connect.type": "int16"}], "default": None},
    {"name": "price", "type": ["null", {
        "type": "bytes", "scale": 2, "precision": 10, "connect.version": 1, "logicalType": "decimal",
        "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"},
        "connect.name": "org.apache.kafka.connect.data.Decimal"}], "default": None},
    {"name": "anything", "type": ["null", {"type": "record", "name": "VariableScaleDecimal",
                                           "namespace": "io.debezium.data", "fields": [
                                               {"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}],
                                           "connect.doc": "Variable scaled decimal", "connect.version": 1,
                                           "connect.name": "io.debezium.data.VariableScaleDecimal"}], "default": None},
    {"name": "day", "type": ["null", {"type": "int", "connect.version": 1, "logicalType": "date",
                                      "connect.name": "io.debezium.time.Date"}], "default": None},
    {"name": "at", "type": ["null", {"type": "long", "connect.version": 1,
                                     "connect.name": "io.debezium.time.MicroTimestamp"}], "default": None},
    {"name": "at_tz", "type": ["null", {"type": "string", "connect.version": 1,
                                        "connect.name": "io.debezium.time.ZonedTimestamp"}], "default": None},
    {"name": "mood", "type": ["null", {"type": "string", "connect.version": 1,
                                       "connect.parameters": {"allowed": "sad,ok,happy"},
                                       "connect.name": "io.debezium.data.Enum"}], "default": None},
    {"name": "ratio", "type": ["null", "float"], "default": None},
    {"name": "raw", "type": ["null", "bytes"], "default": None},
    {"name": "tags", "type": ["null", {"type": "array", "items": ["null", "string"]}], "default": None},
], "connect.name": "dbserver1.inventory.t.Value"}


def test_the_connect_schema_is_the_one_the_json_converter_writes():
    envelope = {"type": "record", "name": "Envelope", "namespace": "dbserver1.inventory.t", "fields": [
        {"name": "before", "type": ["null", ROW], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},  # the record's second use: by name
        {"name": "op", "type": "string"}], "connect.version": 2, "connect.name": "dbserver1.inventory.t.Envelope"}
    schema = connect_schema(envelope)
    assert schema["name"] == "dbserver1.inventory.t.Envelope" and schema["version"] == 2
    before, after, op = schema["fields"]
    assert before == {**after, "field": "before"} and before["optional"] and op["type"] == "string"
    fields = {field["field"]: field for field in before["fields"]}
    assert fields["id"] == {"type": "int32", "optional": False, "field": "id"}
    assert fields["small"] == {"type": "int16", "optional": True, "field": "small"}
    assert fields["price"] == {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal",
                               "parameters": {"scale": "2", "connect.decimal.precision": "10"}, "version": 1,
                               "field": "price"}
    assert fields["anything"]["name"] == "io.debezium.data.VariableScaleDecimal"
    assert [f["field"] for f in fields["anything"]["fields"]] == ["scale", "value"]
    assert fields["ratio"]["type"] == "float" and fields["tags"]["items"]["optional"]
    # Every column reads as the JSON converter's schema would make it read.
    spark_types = {name: column_type(field).data_type.simpleString() for name, field in fields.items()}
    assert spark_types == {
        "id": "bigint", "small": "bigint", "price": "decimal(38,2)", "anything": "decimal(38,18)", "day": "date",
        "at": "timestamp_ntz", "at_tz": "timestamp", "mood": "string", "ratio": "double", "raw": "binary",
        "tags": "array<string>"}


def test_logical_types_without_connect_names_read_as_connect_types():
    assert connect_schema({"type": "bytes", "logicalType": "decimal", "precision": 5, "scale": 3}) == {
        "type": "bytes", "optional": False, "name": "org.apache.kafka.connect.data.Decimal",
        "parameters": {"scale": "3"}}
    assert connect_schema({"type": "int", "logicalType": "date"})["name"] == "org.apache.kafka.connect.data.Date"


def test_a_union_of_two_types_has_no_connect_equivalent():
    with pytest.raises(UnsupportedAvroSchemaError, match="no Kafka Connect equivalent"):
        connect_schema(["null", "string", "long"])


def doc_block(language: str) -> str:
    """The first ``language`` block of docs/connectors/avro.md."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "connectors" / "avro.md").read_text()
    match = re.search(rf"^```{language}\n(.*?)^```$", text, re.M | re.S)
    assert match is not None
    return match.group(1)


def test_the_docs_config_loads_as_written():
    (table,) = resolve_tables(parse_config(doc_block("yaml"), source="docs/connectors/avro.md"))
    assert table.merge.schema_registry == SchemaRegistrySettings(
        "http://registry.example.internal:8080/apis/ccompat/v7", "REGISTRY_USER", "REGISTRY_PASSWORD")
