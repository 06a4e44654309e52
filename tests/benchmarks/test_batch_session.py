"""The batch-session benchmark, run small: both sessions fold the same W2 batches to the same rows (it exits
non-zero otherwise) and it prints each session's server CPU a query and their ratio."""

from __future__ import annotations

import re

from tests.support.benchmarks import run_benchmark


def test_it_folds_each_size_on_both_sessions_and_prints_the_ratio() -> None:
    stdout = run_benchmark("batch_session", "--sizes", "20,1200", "--rounds", "1", "--queries", "2", "--warm", "1")
    rows = re.findall(r"^ +(\d+) +(\d+) \| +([\d.]+) \(.*\| +([\d.]+) \(.*\| ([\d.]+)$", stdout, re.MULTILINE)
    assert [int(events) for events, *_ in rows] == [20, 1200], stdout
    assert all(float(run) > 0 and float(small) > 0 and float(ratio) > 0 for _, _, run, small, ratio in rows), stdout
