"""Sampled values are parsed with each schema once, and parse exactly as ``json.loads`` parses them whole."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_assets.core.layout import parse_values, schema_prefix
from cdc_assets.demo.events import envelope, postgres_source

SOURCE = postgres_source(100, 1_700_000_000_000, "inventory", "products")
FIRST = envelope("c", None, {"id": 1, "name": "a"}, SOURCE, 1, with_schema=True)
SECOND = envelope("u", None, {"id": 2, "name": "b", "qty": 3}, SOURCE, 2, with_schema=True)  # another schema


def whole(raw: bytes | None) -> object:
    """What parsing a value by itself gives (None where it is not JSON)."""
    try:
        return None if raw is None else json.loads(raw)
    except ValueError:
        return None


def test_a_value_after_its_schema_has_only_its_payload_parsed_and_shares_the_schema():
    third = envelope("d", {"id": 1, "name": "a"}, None, SOURCE, 3, with_schema=True)  # FIRST's schema
    parsed = parse_values([FIRST, SECOND, third])
    assert parsed == [json.loads(FIRST), json.loads(SECOND), json.loads(third)]
    assert parsed[2]["schema"] is parsed[0]["schema"]
    assert parsed[1]["schema"] is not parsed[0]["schema"]


def test_schema_prefix_ends_where_the_payload_begins_even_with_payload_text_in_the_schema():
    schema = {"type": "struct", "doc": 'a "payload": trap', "fields": []}
    raw = b'{ "schema" : ' + json.dumps(schema).encode() + b' , "payload" :{"op":"c"}}'
    prefix = schema_prefix(raw)
    assert prefix is not None and raw[len(prefix):] == b'{"op":"c"}}'
    assert schema_prefix(b'{"payload": {}, "schema": {}}') is None
    assert schema_prefix(b'{"schema": {"a": 1}') is None


# Edits that make a value another schema's, a broken one, or one with more than schema and payload.
EDITS = [
    lambda v: v,
    lambda v: v + b"  \n",
    lambda v: v[:-1],
    lambda v: v[:-1] + b', "extra": 1}',
    lambda v: v[:-1] + b'}}',
    lambda v: v[:-1] + b', "payload": null}',
    lambda v: v.replace(b'"payload": {', b'"payload": [{', 1)[:-1] + b"]}",
    lambda v: v.replace(b'"payload": {', b'"payload": null, "x": {', 1),
    lambda v: v[: v.index(b'"payload":') + 10] + b" null}",
    lambda v: v[: v.index(b'"payload":') + 10] + b' "\xff"}',
    lambda v: v[: v.index(b'"payload":') + 10] + b" 12 13}",
    lambda v: v[: v.index(b'"payload":') + 10] + b" 12",
    lambda v: json.dumps(json.loads(v)["payload"]).encode(),
    lambda v: b"not json",
    lambda v: None,
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([FIRST, SECOND]), st.integers(0, len(EDITS) - 1)), max_size=12))
def test_sampled_values_parse_as_each_parses_alone(draws):
    values = [EDITS[edit](value) for value, edit in draws]
    assert parse_values(values) == [whole(value) for value in values]
