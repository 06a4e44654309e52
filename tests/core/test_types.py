"""Connect and Debezium logical types become the right Spark values."""

from decimal import Decimal

import pytest
from pyspark.sql import functions as F

from cdc_assets.core import decode_change_events, derive_layout
from cdc_assets.core.layout import LayoutError
from cdc_assets.core.types import convert
from tests.support.logical_types import FIELDS, unscaled_bytes, wrapped


def test_logical_types_convert(hand_over):
    value = wrapped([f for f, _, _ in FIELDS], {f["field"]: v for f, v, _ in FIELDS})
    layout = derive_layout("postgresql", [b'{"id": 1}'], [value])
    row = decode_change_events(hand_over([(b'{"id": 1}', value)], layout), layout).first().asDict(recursive=True)
    assert row["_cdc_error"] is None
    for field, _, expected in FIELDS:
        got = row[field["field"]]
        got = bytes(got) if isinstance(got, (bytearray, memoryview)) else got
        assert got == expected, field["field"]


def test_a_value_that_does_not_fit_is_a_bad_event(hand_over):
    fields = [{"type": "int32", "field": "id"}, {"type": "int32", "name": "io.debezium.time.Date", "field": "d"}]
    value = wrapped(fields, {"id": 1, "d": "yesterday"})
    layout = derive_layout("postgresql", [b'{"id": 1}'], [value])
    row = decode_change_events(hand_over([(b'{"id": 1}', value)], layout), layout).first()
    assert row["_cdc_error"] == "column 'd' value does not fit type date"


def test_unknown_logical_types_are_refused():
    fields = [{"type": "int32", "field": "id"}, {"type": "string", "name": "com.example.Money", "field": "m"}]
    with pytest.raises(LayoutError, match=r"logical type 'com\.example\.Money' \(field 'm'\) is not supported"):
        derive_layout("postgresql", [b'{"id": 1}'], [wrapped(fields, {"id": 1, "m": "x"})])


def decode_one(hand_over, fields, values, **layout_options):
    """One wrapped event of ``fields`` decoded: its layout and row (as a dict)."""
    value = wrapped([{"type": "int32", "field": "id"}, *fields], {"id": 1, **values})
    layout = derive_layout("postgresql", [b'{"id": 1}'], [value], **layout_options)
    return layout, decode_change_events(hand_over([(b'{"id": 1}', value)], layout), layout).first().asDict()


def test_float_and_double_are_the_json_converter_s_names_and_read_as_postgresql_prints_them(hand_over):
    # Debezium's real(float4) is Connect FLOAT32, which the JSON converter names "float"; float8 is "double".
    fields = [{"type": "float", "field": "r"}, {"type": "double", "field": "d"},
              {"type": "double", "field": "nan"}, {"type": "double", "field": "inf"}]
    layout, row = decode_one(hand_over, fields, {"r": 0.1, "d": 1e-07, "nan": "NaN", "inf": "-Infinity"})
    assert {f.name: f.dataType.simpleString() for f in layout.row_type.fields} == {
        "id": "bigint", "r": "double", "d": "double", "nan": "double", "inf": "double"}
    assert row["_cdc_error"] is None
    # 0.1, not 0.10000000149011612: the value PostgreSQL prints for real '0.1' and a client reads.
    assert (row["r"], row["d"], row["inf"]) == (0.1, 1e-07, float("-inf"))
    assert row["nan"] != row["nan"]


@pytest.mark.parametrize("connect_type", ["float32", "float64", "decimal", "timestamp"])
def test_a_type_name_the_json_converter_never_writes_is_refused(connect_type):
    fields = [{"type": "int32", "field": "id"}, {"type": connect_type, "field": "x"}]
    with pytest.raises(LayoutError, match=rf"type '{connect_type}' \(field 'x'\) is not a Kafka Connect type"):
        derive_layout("postgresql", [b'{"id": 1}'], [wrapped(fields, {"id": 1, "x": 1})])


def decimal_field(name, scale, precision=None):
    parameters = {"scale": str(scale)}
    if precision is not None:
        parameters["connect.decimal.precision"] = str(precision)
    return {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "field": name, "optional": True,
            "parameters": parameters}


def variable_scale_field(name):
    return {"type": "struct", "name": "io.debezium.data.VariableScaleDecimal", "field": name, "optional": True,
            "fields": [{"type": "int32", "field": "scale"}, {"type": "bytes", "field": "value"}]}


def decimal_value(value: Decimal, scale: int) -> str:
    sign, digits, exponent = value.as_tuple()
    return unscaled_bytes((-1 if sign else 1) * int("".join(map(str, digits))) * 10 ** (exponent + scale))


def test_decimals_are_exact_at_every_precision_and_scale(hand_over):
    # numeric(p, s) for p up to 38 (decimal(38, s)) and beyond (exact text), random seeded values of
    # every length, negative and positive, including scale > 6 (Spark's division rounded those to 6).
    import random

    rng = random.Random(23)
    fields, values, expected = [], {}, {}
    for index, (precision, scale) in enumerate([(20, 8), (38, 0), (38, 38), (10, 2), (38, 10), (18, 17),
                                                (39, 0), (50, 10), (1000, 500), (3, -2), (3, 5), (45, -2)]):
        for sample in range(3):
            digits = rng.randint(1, precision) if sample else precision
            unscaled = rng.randrange(10 ** (digits - 1), 10**digits) * rng.choice((1, -1))
            value = Decimal((int(unscaled < 0), tuple(int(d) for d in str(abs(unscaled))), -scale))
            name = f"n{index}_{sample}"
            fields.append(decimal_field(name, scale, precision))
            values[name] = unscaled_bytes(unscaled)
            expected[name] = value
    fields.append(decimal_field("money", 2))  # money: scale 2, no precision
    values["money"], expected["money"] = unscaled_bytes(-9223372036854775808), Decimal("-92233720368547758.08")
    layout, row = decode_one(hand_over, fields, values)
    assert row["_cdc_error"] is None
    for name, value in expected.items():
        got = row[name]
        field_type = layout.row_type[name].dataType.simpleString()
        if isinstance(got, str):
            assert Decimal(got) == value and got == format(value, "f"), name
            assert field_type == "string", name
        else:
            assert got == value, (name, got, value)
            assert field_type.startswith("decimal(38,"), name


def test_unconstrained_numeric_is_exact_or_a_bad_event_never_rounded(hand_over):
    fields = [variable_scale_field("v")]
    exact = [Decimal("1.5"), Decimal("-81657634825.91843167"), Decimal("12345678901234567890.123456789012345678"),
             Decimal("0.000000000000000001"), Decimal("1E+19"), Decimal("0"), Decimal("-1")]
    for value in exact:
        scale = max(-value.as_tuple().exponent, 0)
        _, row = decode_one(hand_over, fields, {"v": {"scale": scale, "value": decimal_value(value, scale)}})
        assert (row["v"], row["_cdc_error"]) == (value, None), value
    too_wide = [(Decimal("0.0000000000000000001"), 19), (Decimal("123456789012345678901"), 0),
                (Decimal("1" * 45), 0)]
    for value, scale in too_wide:
        _, row = decode_one(hand_over, fields, {"v": {"scale": scale, "value": decimal_value(value, scale)}})
        assert row["v"] is None
        assert row["_cdc_error"].startswith("column 'v' value does not fit type decimal(38,18) exactly"), value
    # Declared a string, the column keeps every value exactly.
    for value, scale in [*too_wide, (Decimal("-3.25"), 2)]:
        layout, row = decode_one(hand_over, fields, {"v": {"scale": scale, "value": decimal_value(value, scale)}},
                                 configured_columns={"v": "string"})
        assert layout.row_type["v"].dataType.simpleString() == "string"
        assert (Decimal(row["v"]), row["_cdc_error"]) == (value, None)


def test_decimal_handling_modes_string_and_double_keep_what_debezium_sends(hand_over):
    # string mode: plain text, NaN/Infinity by SpecialValueDecimal's names; double mode: doubles.
    fields = [{"type": "string", "field": "s"}, {"type": "string", "field": "s_nan"},
              {"type": "string", "field": "s_inf"}, {"type": "double", "field": "d"},
              {"type": "double", "field": "d_inf"}]
    _, row = decode_one(hand_over, fields, {"s": "-81657634825.91843167", "s_nan": "NAN", "s_inf": "POSITIVE_INFINITY",
                                            "d": -81657634825.91843, "d_inf": "Infinity"})
    assert row["_cdc_error"] is None
    assert (row["s"], row["s_nan"], row["s_inf"]) == ("-81657634825.91843167", "NAN", "POSITIVE_INFINITY")
    assert (row["d"], row["d_inf"]) == (-81657634825.91843, float("inf"))


def test_a_wide_table_s_bad_events_are_listed_without_rewriting_the_decode_into_every_filter(hand_over):
    # A filter on decoded events (the bad-events pass, the transaction cut, scd2's keys) was pushed
    # down through the decode, spelling out the error's every column conversion, each naming its JSON
    # text and the envelope's fields, each a from_json of the whole envelope in the exact hand-over:
    # a 30-column table's bad-events pass held tens of thousands of JSON parses and ran for minutes.
    from cdc_assets.core.envelope import ERROR_COLUMN
    from cdc_assets.core.fold import bad_events

    fields = [variable_scale_field(f"v{i}") for i in range(8)] + [decimal_field(f"d{i}", 8, 20) for i in range(8)]
    values = {**{f"v{i}": {"scale": 0, "value": unscaled_bytes(i)} for i in range(8)},
              **{f"d{i}": unscaled_bytes(i) for i in range(8)}}
    values["v7"] = {"scale": 0, "value": unscaled_bytes(10**30)}  # beyond decimal(38,18): a bad event
    value = wrapped([{"type": "int32", "field": "id"}, *fields], {"id": 1, **values})
    layout = derive_layout("postgresql", [b'{"id": 1}'], [value])
    events = decode_change_events(hand_over([(b'{"id": 1}', value)], layout), layout)
    def parses(frame):
        plan = frame._explain_string(extended=True)
        return plan.split("== Optimized Logical Plan ==")[1].split("== Physical Plan ==")[0].count("from_json(")

    # The filter adds no parse to the decode's own, and the decode parses each variable-scale value a few
    # times at most (its conversion names the value's bytes about 30 times).
    assert parses(events.where(F.col(ERROR_COLUMN).isNotNull())) == parses(events) <= 8 * 4 + 4
    [bad] = bad_events(events)
    assert bad.reason.startswith("column 'v7' value does not fit type decimal(38,18) exactly")


def analyzed_plan(frame, capsys) -> str:
    capsys.readouterr()
    frame.explain(extended=True)
    return capsys.readouterr().out.split("== Analyzed Logical Plan ==")[1].split("== Optimized Logical Plan ==")[0]


def test_the_decode_spells_out_the_row_image_and_each_conversion_once(hand_over, spark, capsys):
    # A batch query's analysis and optimization grow with its expressions and were most of a small table's Spark
    # time (W2, in performance.md's git log): the image the columns are read from, and each column's conversion (a
    # decimal's names its bytes dozens of times), are named once and referred to by the value, its "does not
    # fit" test and the key, not spelt out at every use.
    fields = [{"type": "int32", "field": "id"}, decimal_field("amount", 2, 12)]
    value = wrapped(fields, {"id": 1, "amount": decimal_value(Decimal("-1.50"), 2)})
    layout = derive_layout("postgresql", [b'{"id": 1}'], [value])
    decoded = decode_change_events(hand_over([(b'{"id": 1}', value)], layout), layout)
    assert decoded.first()["amount"] == Decimal("-1.50")
    plan = analyzed_plan(decoded, capsys)
    alone = analyzed_plan(spark.createDataFrame([("/2I=",)], "amount string").select(
        convert(F.col("amount"), layout.column_type("amount")).alias("amount")), capsys)
    assert plan.count("unbase64(") == alone.count("unbase64(") > 0, (plan.count("unbase64("), alone.count("unbase64("))
    # The conversion itself names the bytes where it needs them: 7 times (27 when it hexed them first and
    # tested the digits, and named the digits thrice where the scale needs no test).
    assert alone.count("unbase64(") <= 7, alone
    assert plan.count("THEN _env_before") == 1, plan


def test_times_beyond_a_day_or_negative_keep_their_hours(hand_over):
    # MariaDB's TIME is a duration: Debezium 3.5 sent '-838:59:59' and '25:00:00.000001' as these MicroTimes;
    # PostgreSQL's time '24:00:00' is a whole day. A timestamp format wrapped them to a time of day.
    fields = [{"type": "int64", "name": "io.debezium.time.MicroTime", "field": name} for name in ("neg", "over", "day")]
    fields.append({"type": "int32", "name": "io.debezium.time.Time", "field": "millis"})
    _, row = decode_one(hand_over, fields, {"neg": -3020399000000, "over": 90000000001, "day": 86400000000,
                                            "millis": -1500})
    assert row["_cdc_error"] is None
    assert (row["neg"], row["over"], row["day"], row["millis"]) == (
        "-838:59:59.000000", "25:00:00.000001", "24:00:00.000000", "-00:00:01.500000")


def test_bits_are_stored_big_endian_as_the_database_returns_them(hand_over):
    # Debezium 3.5's MariaDB connector, BIT(12) b'000000000101' and BIT(64) 0x8000000000000001: little-endian bytes.
    fields = [{"type": "bytes", "name": "io.debezium.data.Bits", "field": name, "parameters": {"length": length}}
              for name, length in (("b12", "12"), ("b64", "64"), ("empty", "0"))]
    _, row = decode_one(hand_over, fields, {"b12": "BQA=", "b64": "AQAAAAAAAIA=", "empty": ""})
    assert row["_cdc_error"] is None
    assert (bytes(row["b12"]), bytes(row["b64"]), bytes(row["empty"])) == (
        b"\x00\x05", b"\x80\x00\x00\x00\x00\x00\x00\x01", b"")
