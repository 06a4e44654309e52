"""Debezium semantics (envelope, op, ordering position, fold rule) as Spark column logic."""

from cdc_assets.core.envelope import decode_change_events, value_type
from cdc_assets.core.fold import BatchSummary, fold_batch, fold_events
from cdc_assets.core.layout import HIDDEN_COLUMNS, ChangeEventLayout, LayoutError, derive_layout
from cdc_assets.core.position import event_position, source_position

__all__ = [
    "HIDDEN_COLUMNS",
    "BatchSummary",
    "ChangeEventLayout",
    "LayoutError",
    "decode_change_events",
    "derive_layout",
    "event_position",
    "fold_batch",
    "fold_events",
    "source_position",
    "value_type",
]
