"""The micro-batch merge job: one MERGE per captured table, in one process and one Spark session."""

from dagster import AssetSelection, define_asset_job, in_process_executor

from cdc_assets.assets import CDC_KINDS

cdc_merge_job = define_asset_job(
    "cdc_merge_job",
    selection=AssetSelection.kind("delta") & AssetSelection.kind("kafka"),
    executor_def=in_process_executor,
    description="Merge each captured table's new change events into its Delta table (one micro-batch each).",
    tags={"cdc_assets/kinds": ",".join(sorted(CDC_KINDS))},
)
