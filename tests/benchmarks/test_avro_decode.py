"""The Avro benchmark's decode level, run small: the project's Avro path, JSON with schemas and Spark's ``from_avro``
each read a real broker's topic (the Avro one's schemas in a private Apicurio Registry) to the decoded change-event
columns on one Spark server, decode the same values, and are printed as ratios to JSON with schemas."""

from __future__ import annotations

import re

from tests.support.benchmarks import run_benchmark


def test_the_decode_level_runs_from_avro_beside_the_project_avro_path_and_prints_ratios() -> None:
    stdout = run_benchmark("avro_decode", "--levels", "decode", "--events", "600", "--keys", "100", "--batch", "400",
                           "--runs", "1", "--warm-runs", "0")
    # Each variant read the whole topic (the run checks its event count) in a fresh process, with its CPU seconds.
    for variant in ("json_schemas", "avro", "from_avro"):
        assert re.search(rf"^  decode run 1 {variant} +[\d.]+ s \(CPU s: run [\d.]+, server [\d.]+\)$", stdout,
                         re.MULTILINE), stdout
    # The run fails unless every variant's decoded columns hashed alike (and from_avro's coordinates as avro's).
    table = stdout.split("every variant decoded the same values)")[1]
    rows = {line.split()[0]: line.split()[1:] for line in table.splitlines()[2:5]}
    assert set(rows) == {"json_schemas", "avro", "from_avro"}, table
    assert rows["json_schemas"][2] == "1.00" and rows["json_schemas"][5] == "1.00", table
    assert all(float(rows[variant][5]) > 0 for variant in rows), table
