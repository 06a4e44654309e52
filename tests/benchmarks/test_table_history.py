"""The table-history benchmark, run small: it prints, for each history length, the CPU of a table's run the
project's way, the way before and a bare MERGE, and the ratios to the bare one."""

from __future__ import annotations

import re

from tests.support.benchmarks import run_benchmark


def test_it_prints_each_way_and_the_ratios_to_a_bare_merge() -> None:
    stdout = run_benchmark("table_history", "--commits", "1,12", "--runs", "3")
    number = r"([\d.]+)"
    rows = re.findall(rf"^ +(\d+) \| +{number} / +{number} / +{number} +\| +{number} \| +{number}$", stdout,
                      re.MULTILINE)
    assert [int(commits) for commits, *_ in rows] == [1, 12], stdout
    assert all(float(value) > 0 for row in rows for value in row[1:]), stdout
