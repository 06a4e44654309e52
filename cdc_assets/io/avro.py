"""Avro records with a schema registry, read as the JSON converter would have written them.

A connector with ``format: avro`` runs Kafka Connect with an Avro converter (Confluent's, or Apicurio's
with ``as-confluent``): each key and value is the Confluent wire format, a magic byte 0, a 4-byte
big-endian schema id and the Avro body. This module is a format rule of the I/O layer only: it turns
each such record into the bytes Kafka Connect's ``JsonConverter`` with schemas would have written,
``{"schema": <Connect schema>, "payload": <value>}``, so that every Debezium rule (layouts, ops,
positions, types, placeholders, schema changes, transactions) is read once, in core, from one form.

- The Connect schema is derived from the writer's Avro schema once per schema id, as Kafka Connect's
  ``AvroData`` reads it back: ``connect.name``, ``connect.version``, ``connect.parameters`` and
  ``connect.type`` are its Connect properties, a union with null an optional field, Avro's logical
  types (decimal, date, time-millis, timestamp-millis) Connect's Decimal, Date, Time and Timestamp.
- The payload takes the JSON converter's encodings: bytes (and so a Decimal's unscaled big-endian
  two's-complement value) as base64, a Date as its int days, a Time/Timestamp as its int millis: the
  body is read with its logical types left as their underlying Avro types, which are those encodings.
- Schemas are fetched from the registry once per id per process (an id names one schema for good) and
  kept. A record the rule cannot read (not the wire format, an id the registry does not know, a body that
  does not fit its schema) becomes a bad event carrying the reason and the record as read
  (``core.envelope.undecodable_value``): halted on or dead-lettered as the table says, never dropped. A
  registry that cannot be reached halts the batch (``SchemaRegistryUnavailableError``): a passing outage
  must not dead-letter every event.
"""

from __future__ import annotations

import base64
import io
import json
import os
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fastavro
import numpy
import pyarrow as pa
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from cdc_assets.core.envelope import undecodable_value
from cdc_assets.io.kafka import Decode

_WIRE_HEADER = struct.Struct(">bI")  # the magic byte and the schema id
# Avro's logical types, as Kafka Connect's AvroData names them when the schema has no connect.name.
_LOGICAL_NAMES = {
    "decimal": "org.apache.kafka.connect.data.Decimal",
    "date": "org.apache.kafka.connect.data.Date",
    "time-millis": "org.apache.kafka.connect.data.Time",
    "timestamp-millis": "org.apache.kafka.connect.data.Timestamp",
}
_PRIMITIVES = {"int": "int32", "long": "int64", "float": "float", "double": "double", "boolean": "boolean",
               "string": "string", "bytes": "bytes", "fixed": "bytes", "enum": "string"}


class SchemaRegistryUnavailableError(RuntimeError):
    """The schema registry did not answer (or failed) for a schema id: the batch is halted, not dead-lettered."""


class UnsupportedAvroSchemaError(ValueError):
    """An Avro schema with no Kafka Connect equivalent (a union of two non-null types)."""


@dataclass(frozen=True)
class SchemaRegistrySettings:
    """Where a connector's schemas are (``config.SchemaRegistryConfig``); secrets by env var name."""

    url: str
    basic_auth_user_env: str | None = None
    basic_auth_password_env: str | None = None
    ssl_ca_location: str | None = None

    def client_settings(self) -> dict[str, str]:
        """The registry client's settings, credentials read from the environment now."""
        settings = {"url": self.url}
        if self.basic_auth_user_env and self.basic_auth_password_env:
            missing = [name for name in (self.basic_auth_user_env, self.basic_auth_password_env)
                       if name not in os.environ]
            if missing:
                raise SchemaRegistryUnavailableError(
                    f"schema registry {self.url}: environment variable(s) {', '.join(missing)} named by "
                    "schema_registry.basic_auth_*_env are not set")
            settings["basic.auth.user.info"] = (f"{os.environ[self.basic_auth_user_env]}:"
                                                f"{os.environ[self.basic_auth_password_env]}")
        if self.ssl_ca_location:
            settings["ssl.ca.location"] = self.ssl_ca_location
        return settings


def _full_name(name: str, namespace: str) -> str:
    """An Avro named type's full name: its own when dotted, else within the enclosing ``namespace``."""
    return name if "." in name or not namespace else f"{namespace}.{name}"


def connect_schema(avro: Any, named: dict[str, Any] | None = None, namespace: str = "") -> dict[str, Any]:
    """The Kafka Connect schema (the JSON converter's form) of an Avro schema, as ``AvroData`` reads it.
    ``named``: the named types defined so far (a later use of a record's name refers to it)."""
    named = {} if named is None else named
    if isinstance(avro, list):
        branches = [branch for branch in avro if branch != "null"]
        if len(branches) != 1:
            raise UnsupportedAvroSchemaError(f"a union of {avro} has no Kafka Connect equivalent")
        return {**connect_schema(branches[0], named, namespace), "optional": True}
    if isinstance(avro, str):
        if avro in named:
            return named[avro]
        if f"{namespace}.{avro}" in named:
            return named[f"{namespace}.{avro}"]
        avro = {"type": avro}
    kind = avro["type"]
    if isinstance(kind, (dict, list)):  # a field's type written out: its own properties are the type's
        return connect_schema(kind, named, namespace)
    schema: dict[str, Any]
    if kind == "record":
        own_namespace = avro.get("namespace", namespace)
        full_name = _full_name(avro["name"], own_namespace)
        schema = {"type": "struct", "fields": [], "optional": False}
        named[full_name] = schema  # before its fields: a recursive reference finds it
        schema["fields"] = [{**connect_schema(field["type"], named, own_namespace), "field": field["name"]}
                            for field in avro["fields"]]
        name = avro.get("connect.name", full_name)
        if name != "io.confluent.connect.avro.ConnectDefault":
            schema["name"] = name
    elif kind == "array":
        schema = {"type": "array", "items": connect_schema(avro["items"], named, namespace), "optional": False}
    elif kind == "map":
        schema = {"type": "map", "keys": {"type": "string", "optional": False},
                  "values": connect_schema(avro["values"], named, namespace), "optional": False}
    elif kind in _PRIMITIVES:
        schema = {"type": avro.get("connect.type", _PRIMITIVES[kind]), "optional": False}
        name = avro.get("connect.name", _LOGICAL_NAMES.get(avro.get("logicalType", "")))
        if name:
            schema["name"] = name
        if kind in ("enum", "fixed") and "name" in avro:
            named[_full_name(avro["name"], namespace)] = schema
    else:
        raise UnsupportedAvroSchemaError(f"Avro type '{kind}' has no Kafka Connect equivalent")
    parameters = dict(avro.get("connect.parameters") or {})
    if avro.get("logicalType") == "decimal" and "scale" not in parameters:
        parameters["scale"] = str(avro.get("scale", 0))
    if parameters:
        schema["parameters"] = parameters
    if "connect.version" in avro:
        schema["version"] = avro["connect.version"]
    if "connect.doc" in avro:
        schema["doc"] = avro["connect.doc"]
    return schema


def _without_logical_types(avro: Any) -> Any:
    """The schema with Avro's logical types left out: the body then reads as their underlying types
    (bytes, int days, int/long millis), the very encodings of the JSON converter."""
    if isinstance(avro, list):
        return [_without_logical_types(branch) for branch in avro]
    if isinstance(avro, dict):
        return {key: _without_logical_types(value) for key, value in avro.items() if key != "logicalType"}
    return avro


Repair = Callable[[Any], Any]


def _float32_repair(avro: Any, named: dict[str, Repair | None] | None = None, namespace: str = "") -> Repair | None:
    """What makes a decoded value's Avro floats (32-bit) read as the JSON converter writes them, the shortest
    text of the 32-bit number (``0.1``, not ``0.10000000149011612``); None when the schema holds none."""
    named = {} if named is None else named
    if isinstance(avro, list):
        repairs = [_float32_repair(branch, named, namespace) for branch in avro if branch != "null"]
        repair = repairs[0] if len(repairs) == 1 else None
        return None if repair is None else (lambda value: None if value is None else repair(value))
    if isinstance(avro, str):
        if avro == "float":
            return lambda value: float(str(numpy.float32(value)))
        return named.get(avro, named.get(f"{namespace}.{avro}"))
    kind = avro["type"]
    if isinstance(kind, (dict, list)) or kind == "float":
        return _float32_repair(kind, named, namespace)
    if kind == "record":
        own_namespace = avro.get("namespace", namespace)
        full_name = _full_name(avro["name"], own_namespace)
        named[full_name] = None  # a recursive record's floats are left as they are
        fields = [(field["name"], _float32_repair(field["type"], named, own_namespace)) for field in avro["fields"]]
        repaired = [(name, repair) for name, repair in fields if repair is not None]
        if not repaired:
            return None

        def record(value: dict[str, Any]) -> dict[str, Any]:
            for name, repair in repaired:
                value[name] = repair(value[name])
            return value

        named[full_name] = record
        return record
    if kind == "array":
        items = _float32_repair(avro["items"], named, namespace)
        return None if items is None else (lambda value: [items(item) for item in value])
    if kind == "map":
        values = _float32_repair(avro["values"], named, namespace)
        return None if values is None else (lambda value: {key: values(item) for key, item in value.items()})
    return None


def _base64(value: object) -> str:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


# The JSON converter's text: compact, UTF-8 unescaped (a placeholder is searched for in the raw bytes), bytes as base64.
_PAYLOAD_TEXT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=_base64).encode


@dataclass(frozen=True)
class _Writer:
    """One schema id's writer schema, read to decode bodies, and its Connect schema as JSON."""

    parsed: Any
    opening: bytes  # ``{"schema":<its Connect schema>,"payload":``
    repair: Repair | None  # ``_float32_repair``


class AvroRecords:
    """Reads Confluent-wire Avro records of one schema registry as JSON-converter records, each schema
    fetched once and kept (``record_decoder`` shares one per registry in a process)."""

    def __init__(self, settings: SchemaRegistrySettings):
        self._settings = settings
        self._client: SchemaRegistryClient | None = None
        self._writers: dict[int, _Writer] = {}
        # Ids the registry answered it does not know, with why: asked once (a record's id was registered before
        # the record was written, so the registry lost it), not once per record.
        self._unknown: dict[int, str] = {}
        self._lock = threading.Lock()  # tables merged side by side share the cache

    def _writer(self, schema_id: int) -> _Writer:
        """The writer schema of ``schema_id``; ``KeyError`` when the registry does not know it."""
        writer = self._writers.get(schema_id)
        if writer is not None:
            return writer
        if schema_id in self._unknown:
            raise KeyError(self._unknown[schema_id])
        with self._lock:
            if self._client is None:
                self._client = SchemaRegistryClient(self._settings.client_settings())
            try:
                registered = self._client.get_schema(schema_id)
            except SchemaRegistryError as exc:
                if exc.http_status_code == 404:
                    self._unknown[schema_id] = (
                        f"schema id {schema_id} is unknown to the schema registry at {self._settings.url} "
                        f"({exc.error_message}); a registry that keeps its schemas in memory forgets them when it "
                        "restarts, and records written before then cannot be decoded: give it persistent storage "
                        "(Apicurio's kafkasql or sql)")
                    raise KeyError(self._unknown[schema_id]) from None
                raise SchemaRegistryUnavailableError(f"schema registry {self._settings.url} failed for schema id "
                                                     f"{schema_id}: {exc}") from exc
            except Exception as exc:  # the client's transport errors (httpx), refused connections
                raise SchemaRegistryUnavailableError(f"cannot reach the schema registry at {self._settings.url} "
                                                     f"for schema id {schema_id}: {exc}") from exc
            if (registered.schema_type or "AVRO") != "AVRO" or registered.schema_str is None:
                raise KeyError(f"schema id {schema_id} is a {registered.schema_type} schema, not Avro")
            avro = json.loads(registered.schema_str)
            writer = _Writer(fastavro.parse_schema(_without_logical_types(avro)),
                             b'{"schema":' + json.dumps(connect_schema(avro), separators=(",", ":")).encode()
                             + b',"payload":', _float32_repair(avro))
            self._writers[schema_id] = writer
            return writer

    def to_json(self, data: bytes) -> bytes:
        """One record's key or value in the JSON converter's form; ``ValueError`` naming the schema id
        when it cannot be read, ``SchemaRegistryUnavailableError`` when the registry cannot be asked."""
        if len(data) < _WIRE_HEADER.size or data[0] != 0:
            raise ValueError(f"not the Confluent wire format (magic byte 0, 4-byte schema id, Avro body): "
                             f"starts with {data[:_WIRE_HEADER.size]!r}")
        schema_id = _WIRE_HEADER.unpack_from(data)[1]
        try:
            writer = self._writer(schema_id)
        except KeyError as exc:
            raise ValueError(exc.args[0]) from None
        except UnsupportedAvroSchemaError as exc:
            raise ValueError(f"schema id {schema_id}: {exc}") from None
        try:
            payload = fastavro.schemaless_reader(io.BytesIO(memoryview(data)[_WIRE_HEADER.size:]), writer.parsed,
                                                 None)
        except Exception as exc:  # fastavro raises what the bytes lead it to (EOFError, IndexError, ...)
            raise ValueError(f"Avro body does not fit schema id {schema_id}: {type(exc).__name__}: {exc}") from None
        if writer.repair is not None:
            payload = writer.repair(payload)
        return b"".join((writer.opening, _PAYLOAD_TEXT(payload).encode(), b"}"))

    def decode(self, topic: str, records: pa.Table) -> pa.Table:
        """``records`` (``kafka.RAW_SCHEMA``) with keys and values in the JSON converter's form. A
        record whose key or value cannot be read carries the reason in its value (a bad event; a tombstone
        stays one); an unreachable registry raises."""
        keys: list[bytes | None] = []
        values: list[bytes | None] = []
        for partition, offset, key, value in zip(records["partition"].to_pylist(), records["offset"].to_pylist(),
                                                 records["key"].to_pylist(), records["value"].to_pylist(), strict=True):
            part = "key"
            try:
                keys.append(None if key is None else self.to_json(key))
                part = "value"
                values.append(None if value is None else self.to_json(value))
            except ValueError as exc:
                undecodable = undecodable_value(f"Avro {part} of {topic}[{partition}] at offset {offset}: {exc}",
                                                key, value)
                if part == "key":
                    keys.append(undecodable)
                values.append(None if value is None else undecodable)
            except SchemaRegistryUnavailableError as exc:
                raise SchemaRegistryUnavailableError(
                    f"{topic}[{partition}] at offset {offset}: {exc}; nothing of the batch was applied") from exc
        return records.set_column(2, "key", pa.array(keys, pa.binary())).set_column(
            3, "value", pa.array(values, pa.binary()))


_SHARED: dict[SchemaRegistrySettings, AvroRecords] = {}
_SHARED_LOCK = threading.Lock()


def record_decoder(registry: SchemaRegistrySettings | None) -> Decode | None:
    """The decoder of a connector's records: None for the JSON converter's (read as they are), else the
    registry's ``AvroRecords`` (one per registry in a process, so each schema is fetched once)."""
    if registry is None:
        return None
    with _SHARED_LOCK:
        records = _SHARED.get(registry)
        if records is None:
            records = _SHARED[registry] = AvroRecords(registry)
    return records.decode
