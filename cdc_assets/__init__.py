"""cdc_assets: Debezium change-event topics kept in step with Delta Lake tables, as Dagster assets.

Layers, data flowing one way (topic -> decoded events -> folded batch -> MERGE -> commit + offsets):
- ``cdc_assets.core``: Debezium semantics as Spark column logic (no Kafka, no Dagster);
- ``cdc_assets.io``: Kafka source, Spark session factory, Delta writers;
- ``cdc_assets.pipeline``: one micro-batch of one table through those parts;
- ``cdc_assets.assets`` / ``cdc_assets.resources`` / ``cdc_assets.definitions``: thin Dagster layer.
"""
