"""How captured tables appear in Dagster: one translator object decides every table's asset key,
group, owners, tags, description and metadata, and every asset, check, sensor and job asks it.

Subclass ``CdcTranslator`` and pass it to ``build_definitions`` to change any of it, as with
dagster-sling's and dagster-dlt's translators::

    class MyTranslator(CdcTranslator):
        def get_asset_key(self, table: CapturedTable) -> AssetKey:
            return AssetKey(["bronze", *super().get_asset_key(table).path])

    defs = build_definitions(load_config(), translator=MyTranslator())
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from dagster import AssetKey, AutomationCondition, FreshnessPolicy, MetadataValue

from cdc_assets.catalog import CapturedTable

STATUS_TAG = "cdc_assets/status"  # "retired" once the source table was dropped


def dagster_name(text: str) -> str:
    """``text`` with the characters Dagster names do not allow replaced by ``_``."""
    return re.sub(r"[^A-Za-z0-9_]", "_", text)


class CdcTranslator:
    """The default presentation of captured tables; every method may be overridden."""

    def get_asset_key(self, table: CapturedTable) -> AssetKey:
        """``[topic.prefix, schema, table]`` (or ``[topic.prefix, table]``), as Dagster names."""
        return AssetKey([dagster_name(part) for part in (table.topic_prefix, *table.name.split("."))])

    def get_topic_asset_key(self, table: CapturedTable) -> AssetKey:
        """The table's Kafka topic, upstream of it: ``[kafka, <topic.prefix>, <schema>, <table>]``."""
        return AssetKey(["kafka", *self.get_asset_key(table).path])

    def get_group_name(self, table: CapturedTable) -> str:
        """The connector's name."""
        return dagster_name(table.connector)

    def get_owners(self, table: CapturedTable) -> list[str]:
        """The owners from the config (table entries override their connector's)."""
        return list(table.asset.owners)

    def get_tags(self, table: CapturedTable) -> dict[str, str]:
        """The tags from the config, plus ``cdc_assets/status`` (``active`` or ``retired``)."""
        return {**dict(table.asset.tags), STATUS_TAG: "retired" if table.retired else "active"}

    def get_description(self, table: CapturedTable) -> str:
        """Where the table comes from and goes, and how it is applied."""
        keys = ", ".join(table.merge.key_columns) if table.merge.key_columns else "from the record key"
        return (f"`{table.name}` captured by {table.kind} connector `{table.connector}`: topic `{table.topic}` "
                f"merged into Delta at `{table.target.path}` (keys: {keys}; apply mode {table.merge.apply_mode}; "
                f"bad events: {table.merge.on_bad_event}).")

    def get_metadata(self, table: CapturedTable) -> dict[str, Any]:
        """The asset's static metadata."""
        return {"topic": table.topic, "delta_path": MetadataValue.path(table.target.path),
                "connector": table.connector, "connector_kind": table.kind, "source_table": table.name,
                "apply_mode": table.merge.apply_mode, "retired": table.retired}

    def get_automation_condition(self, table: CapturedTable) -> AutomationCondition | None:
        """``eager`` (the config's default): merged when an observation of its topic shows new events, not while
        a merge of it runs (the automation sensor, off until turned on, requests the runs); ``none``: None."""
        return AutomationCondition.eager() if table.asset.automation == "eager" else None

    def get_freshness_policy(self, table: CapturedTable) -> FreshnessPolicy | None:
        """Dagster's freshness: the table was merged within its capture-lag bound. It counts
        materializations, the merges that changed the table (a run over a table with nothing new records
        none), so it tells how long ago the table last changed; the ``freshness`` check tells a quiet source
        from a stalled pipeline whatever runs."""
        # Dagster takes no window under a minute.
        return FreshnessPolicy.time_window(fail_window=timedelta(seconds=max(60.0, table.checks.max_capture_lag_s)))
