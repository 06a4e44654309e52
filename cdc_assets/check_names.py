"""The names of a CDC table's asset checks (``cdc_assets.checks``): specs, results and the code that selects
them name each check by one of these."""

# Blocking: a key appears once and is never null, as a database's primary key.
KEY_CHECK = "primary_key"
# Blocking, for tables whose values the source may leave unavailable (a placeholder): none was stored as null.
UNAVAILABLE_CHECK = "unavailable_values_kept"
# Blocking, for transaction-consistent tables: no transaction has kept the table from applying anything too long.
TRANSACTIONS_CHECK = "transactions_reconciled"
CAPTURE_LAG_CHECK = "capture_lag"
DEAD_LETTERS_CHECK = "no_dead_letters"
SCHEMA_CHECK = "schema_matches_source"
WATERMARK_CHECK = "consistent_watermark_fresh"
# Live, on the freshness schedule: no event waits in the table's topic past its bound.
FRESHNESS_CHECK = "freshness"
# On demand and on its own schedule: the Delta table holds the source table's rows (cdc_assets.io.reconcile).
ROWS_MATCH_SOURCE_CHECK = "rows_match_source"
