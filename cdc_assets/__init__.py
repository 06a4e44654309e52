"""cdc_assets: Debezium change-event topics kept in step with Delta Lake tables, as Dagster assets.

Layers, data flowing one way (topic -> decoded events -> folded batch -> MERGE -> commit + offsets):
- ``cdc_assets.core``: Debezium semantics as Spark column logic (no Kafka, no Dagster);
- ``cdc_assets.io``: Kafka source, Spark session factory, Delta writers;
- ``cdc_assets.merge``: a table's micro-batches through those parts, one commit each;
- ``cdc_assets.assets`` / ``cdc_assets.resources`` / ``cdc_assets.definitions``: thin Dagster layer.

The public names below load lazily, so importing the core does not import Dagster.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cdc_assets.api import TableSpec, apply_pending
    from cdc_assets.catalog import CapturedTable
    from cdc_assets.component import CdcComponent
    from cdc_assets.config import BatchLimits
    from cdc_assets.definitions import build_definitions
    from cdc_assets.io.row_history import RowChange, row_history
    from cdc_assets.merge import BadEventError, BatchReport
    from cdc_assets.translator import CdcTranslator

__all__ = ["BadEventError", "BatchLimits", "BatchReport", "CapturedTable", "CdcComponent", "CdcTranslator", "RowChange",
           "TableSpec", "apply_pending", "build_definitions", "row_history"]

_HOMES = {"TableSpec": "cdc_assets.api", "apply_pending": "cdc_assets.api", "BatchLimits": "cdc_assets.config",
          "BatchReport": "cdc_assets.merge", "BadEventError": "cdc_assets.merge",
          "CapturedTable": "cdc_assets.catalog", "CdcComponent": "cdc_assets.component",
          "CdcTranslator": "cdc_assets.translator",
          "build_definitions": "cdc_assets.definitions", "RowChange": "cdc_assets.io.row_history",
          "row_history": "cdc_assets.io.row_history"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'cdc_assets' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)


def __dir__() -> list[str]:
    # Dagster's component registry (the dagster_dg_cli entry point) looks up what dir() lists: CdcComponent is
    # listed, the other lazy names are not, so that a registry scan imports neither Spark nor the code location.
    return sorted({*globals(), "CdcComponent"})
