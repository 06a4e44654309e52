"""Asset checks of every CDC table: the keys are unique and never null (blocking: they guard
correctness for anything downstream), the table is fresh now (no event waits in its topic longer
than its bound, the connector's heartbeats are recent), the capture lag of the last merge is under
its bound, no event of the table sits in the dead-letter table, and the Delta schema holds every
column the source last announced.

Each table shows its own checks, but they are not an op each (thousands of ops made the code location
load in minutes): the checks a merge run evaluates after each table's merge (``merge_check_specs``: the
blocking key checks, or all with ``checks_after_merge: all``) are check specs of the connector's merge
op (``cdc_assets.assets``), also evaluated on their own when only they are selected; the others, and the
live ``freshness`` checks, are a subsettable check op each per connector, run on the freshness schedule.

One module per family: ``specs`` (which checks a table has, and which run evaluates each), ``merged`` (what
the merges left: keys, capture lag, dead letters, schema, unavailable values), ``transactions`` (whole
transactions and the consistent watermark), ``table_checks`` (those evaluated together, after a merge or on the
schedule), ``freshness`` (live), ``rows_match_source`` (against the source table); ``results`` what they share."""

from cdc_assets.checks.freshness import build_freshness_checks, freshness_check_spec, freshness_metadata, live_freshness
from cdc_assets.checks.merged import RunReads
from cdc_assets.checks.results import NOT_MATERIALIZED, duration_text
from cdc_assets.checks.rows_match_source import (
    DRIFTED_RANGES,
    build_rows_match_source_checks,
    evaluate_rows_match_source,
    rows_match_source_spec,
)
from cdc_assets.checks.specs import (
    evaluated_after_merge,
    merge_check_specs,
    merge_run_checks,
    scheduled_check_specs,
    selected_check_names,
    table_check_specs,
)
from cdc_assets.checks.table_checks import build_scheduled_table_checks, evaluate_table_checks

__all__ = [
    "DRIFTED_RANGES",
    "NOT_MATERIALIZED",
    "RunReads",
    "build_freshness_checks",
    "build_rows_match_source_checks",
    "build_scheduled_table_checks",
    "duration_text",
    "evaluate_rows_match_source",
    "evaluate_table_checks",
    "evaluated_after_merge",
    "freshness_check_spec",
    "freshness_metadata",
    "live_freshness",
    "merge_check_specs",
    "merge_run_checks",
    "rows_match_source_spec",
    "scheduled_check_specs",
    "selected_check_names",
    "table_check_specs",
]
