"""rows_match_source run as Dagster runs it (the connector's check job, in process): its verdict per table, and
runs of it made while a workload keeps writing to the source and the merge keeps merging, as a busy table's
scheduled check meets them in production."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg

from tests.support import harness as h
from tests.support import workloads as w

T = TypeVar("T")

BUSY_MAX_RECORDS = 50  # the merges while_writing runs: batches smaller than the random workload's tables
BUSY_SETTLE_TIMEOUT_S = 150  # while the workload writes, each wait lasts a merge run or two, slower under load


def rows_match_source_settings(dsn_env: str, settle_timeout_s: int = 30) -> str:
    """A connector's ``rows_match_source`` settings line in the tests' pipeline configs (16 buckets)."""
    return f"    rows_match_source: {{dsn_env: {dsn_env}, buckets: 16, settle_timeout_s: {settle_timeout_s}}}\n"


@dataclass(frozen=True)
class Verdict:
    """One table's rows_match_source evaluation: passed, its description and its metadata's values."""

    passed: bool
    description: str
    metadata: dict[str, Any]


def verdicts(config: str, job: str) -> dict[str, Verdict]:
    """The ``rows_match_source`` verdicts of ``job`` (a connector's check job) for ``config``, by source table
    (the description's first part)."""
    result = h.run_job(config, job)
    assert result.success, h.failures(result)
    return {str(e.description).split(":")[0]: Verdict(e.passed, str(e.description),
                                                      {name: entry.value for name, entry in e.metadata.items()})
            for e in result.get_asset_check_evaluations()}


class RandomWrites:
    """``workloads.rnd_changes``, ``steps`` a call, for ``while_writing``: the next free id kept between calls
    (``next_id``), the same connection, random generator and live ids as the workload's other phases."""

    def __init__(self, connection: psycopg.Connection, rng: random.Random, ids: list[int], next_id: int,
                 steps: int = 1):
        self._connection, self._rng, self._ids, self.next_id, self._steps = connection, rng, ids, next_id, steps

    def __call__(self) -> None:
        self.next_id = w.rnd_changes(self._connection, self._rng, self._ids, self.next_id, self._steps)


def while_writing(write: Callable[[], None], merge_config: str, check: Callable[[], T], runs: int,
                  pause_s: float = 1.5, merge_pause_s: float = 3.0) -> list[T]:
    """``check()`` ``runs`` times, one after the other, while one thread calls ``write()`` again and again (a
    pause of ``pause_s`` after each) and another runs ``cdc_merge_job`` for ``merge_config`` again and again (a
    pause of ``merge_pause_s`` after each: merge runs back to back took as much CPU as the checks); both stop once
    the checks are done. One merge runs first, so that every table exists. A failed merge or write fails the call
    (after the checks)."""
    stop, errors = threading.Event(), list[BaseException]()

    def merge() -> None:
        failed = h.failures(h.run_job(merge_config))
        assert not failed, failed

    merge()

    def write_and_pause() -> None:
        write()
        time.sleep(pause_s)

    def merge_and_pause() -> None:
        merge()
        stop.wait(merge_pause_s)

    def loop(work: Callable[[], None]) -> None:
        try:
            while not stop.is_set():
                work()
        except BaseException as exc:  # reported once the checks are done, with the thread's error
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(work,), daemon=True) for work in (write_and_pause, merge_and_pause)]
    for thread in threads:
        thread.start()
    try:
        found = [check() for _ in range(runs)]
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not errors, errors
    return found


def assert_no_drift_while_writing(runs: list[dict[str, Verdict]], table: str, max_records: int) -> None:
    """Every run of ``table``'s check made ``while_writing`` passed, at least one of them after a first look that
    differed (changes were in flight: the runs were put to the test), and the table held more rows than a batch of
    those merges (``max_records``)."""
    assert runs, "no check ran while the workload wrote"
    for run in runs:
        assert run[table].passed, run[table].description
    assert any(run[table].metadata["differing_at_first_look"] for run in runs), \
        [run[table].metadata for run in runs]
    assert all(run[table].metadata["source_rows"] > max_records for run in runs), \
        [run[table].metadata["source_rows"] for run in runs]
