"""The checks of a table that applies whole transactions: none keeps it blocked, and the connector's consistent
watermark is fresh."""

import json
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from dagster import AssetCheckResult, AssetCheckSeverity, AssetKey

from cdc_assets.catalog import CapturedTable
from cdc_assets.check_names import TRANSACTIONS_CHECK, WATERMARK_CHECK
from cdc_assets.checks.results import duration_text
from cdc_assets.core.transaction_status import counts_from_metadata
from cdc_assets.io.transactions import latest_watermark


def transactions_result(table: CapturedTable, key: AssetKey, last: Mapping[str, Any]) -> AssetCheckResult:
    """Fails on a transaction that has kept the table from applying anything for ``transaction_timeout_s``: its
    END announces more events than the table's topic holds, or there is no END naming the table. One that is
    incomplete for less long passes, listed: a connector writes the END and the events to different
    partitions, and a restarted one writes again what it had not stored as sent."""
    incomplete: dict[str, Any] = dict(last.get("transactions_incomplete") or {})
    stalled = counts_from_metadata(last.get("transactions_stalled"))
    problems = [(f"transaction {tx}: END announces {n.expected} events for {table.name}, the topic holds {n.seen}"
                 if n.expected is not None else
                 f"transaction {tx}: {n.seen} of its events for {table.name} are in the topic and the transaction "
                 f"log has no END naming {table.name} for it")
                + f"; it has kept {table.name} from applying anything for {duration_text(n.waiting_s or 0.0)}"
                for tx, n in stalled.items()]
    return AssetCheckResult(asset_key=key, check_name=TRANSACTIONS_CHECK, passed=not problems,
                            description="; ".join(problems) or None,
                            metadata={"incomplete_transactions": sorted(incomplete),
                                      "stalled_transactions": sorted(stalled)})


def watermark_result(table: CapturedTable, key: AssetKey) -> AssetCheckResult:
    """The consistent-watermark check's result: a warning when the connector's newest watermark is older than
    its bound, or none is recorded yet."""
    assert table.transactions is not None
    latest = latest_watermark(table.transactions.watermarks, table.connector)
    if latest is None or latest["transaction_ts"] is None:
        return AssetCheckResult(asset_key=key, check_name=WATERMARK_CHECK, passed=False,
                                severity=AssetCheckSeverity.WARN,
                                description="no consistent watermark recorded yet (no transaction applied whole)",
                                metadata={"note": "no consistent watermark recorded yet"})
    age = (datetime.now(timezone.utc) - latest["transaction_ts"]).total_seconds()
    return AssetCheckResult(asset_key=key, check_name=WATERMARK_CHECK,
                            passed=age <= table.checks.max_watermark_lag_s, severity=AssetCheckSeverity.WARN,
                            description=f"the consistent watermark is {duration_text(age)} old (bound "
                                        f"{duration_text(table.checks.max_watermark_lag_s)})",
                            metadata={"transaction_id": latest["transaction_id"], "age_s": round(age, 3),
                                      "versions": json.loads(latest["versions"])})
