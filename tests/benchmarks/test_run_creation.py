"""``benchmarks.run_creation`` on Dagster's real storages: a ``cdc_merge_job`` run's creation stores a planned
event per selected table and per selected check, each by its own ``store_event`` call, even with
``DAGSTER_EVENT_BATCH_SIZE`` set (docs/operations.md: why the deployment leaves it unset). Should a Dagster
upgrade write planned events in one statement, this fails and the advice is to be measured again."""

from __future__ import annotations

import pytest

from benchmarks.many_tables import BATCH_SIZE_ENV_VAR
from benchmarks.run_creation import create_runs

TABLES = 3


@pytest.mark.parametrize("storage", ["sqlite", "postgres"])
@pytest.mark.parametrize("batch_size", [0, 1000])
def test_a_runs_planned_events_are_stored_one_by_one(storage, batch_size, postgres, tmp_path, monkeypatch):
    monkeypatch.setenv("CDC_ASSETS_CONFIG", "")  # create_runs sets it: restored after the test
    monkeypatch.setenv(BATCH_SIZE_ENV_VAR, str(batch_size))
    url = None
    if storage == "postgres":
        database = f"creation_{batch_size}"
        postgres.create_database(database)
        url = f"postgresql+psycopg2://postgres@127.0.0.1:{postgres.port}/{database}"
    [run] = create_runs(tmp_path, TABLES, 1, url, pooled=False)

    # The benchmark's tables are PostgreSQL ones: blocking checks primary_key and unavailable_values_kept each.
    assert run["events"] == {"ASSET_MATERIALIZATION_PLANNED": TABLES, "ASSET_CHECK_EVALUATION_PLANNED": 2 * TABLES}
    assert run["calls"]["store_event"] == 3 * TABLES
    assert run["calls"].get("store_event_batch", 0) == (1 if batch_size else 0)
