"""The micro-batch merge job: one MERGE per captured table, in one process and one Spark session."""

from dagster import AssetSelection, define_asset_job, in_process_executor

cdc_merge_job = define_asset_job(
    "cdc_merge_job",
    # Every CDC table asset (kinds delta and kafka), whatever else the code location grows.
    selection=AssetSelection.kind("delta") & AssetSelection.kind("kafka"),
    executor_def=in_process_executor,
    description="Merge each captured table's new change events into its Delta table (one micro-batch each).",
)
