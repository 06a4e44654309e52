"""Which checks a table has (``table_check_specs``), and which of them its merge runs evaluate and which
the freshness schedule's."""

from collections.abc import Iterable, Mapping

from dagster import AssetCheckKey, AssetCheckSpec, AssetKey

from cdc_assets.catalog import CapturedTable
from cdc_assets.check_names import (
    CAPTURE_LAG_CHECK,
    DEAD_LETTERS_CHECK,
    KEY_CHECK,
    SCHEMA_CHECK,
    TRANSACTIONS_CHECK,
    UNAVAILABLE_CHECK,
    WATERMARK_CHECK,
)
from cdc_assets.checks.results import duration_text
from cdc_assets.core.layout import PLACEHOLDER_KINDS


def table_check_specs(table: CapturedTable, key: AssetKey) -> list[AssetCheckSpec]:
    """The specs of the checks that look at what the merges of ``table`` left (``evaluate_table_checks``):
    those its merge runs evaluate (``merge_check_specs``) are check specs of the connector's merge op, the
    others (``scheduled_check_specs``) of its scheduled check op (``build_scheduled_table_checks``)."""
    name = table.name
    specs = [
        # One key check, not two: each evaluation is an event Dagster stores, 31-38 ms apiece in its SQLite
        # storage (docs/performance.md).
        AssetCheckSpec(KEY_CHECK, asset=key, blocking=True, description=(
            f"Each key of {name} appears once and no row has a null key (current versions for scd2).")),
        AssetCheckSpec(CAPTURE_LAG_CHECK, asset=key, description=(
            f"The newest change applied by the last merge of {name} is at most "
            f"{duration_text(table.checks.max_capture_lag_s)} old.")),
        AssetCheckSpec(DEAD_LETTERS_CHECK, asset=key, description=f"No event of {name} is in the dead-letter table."),
        AssetCheckSpec(SCHEMA_CHECK, asset=key,
                       description=f"The Delta table of {name} has every column the source last announced."),
    ]
    if table.transactions is not None:
        timeout_s = table.transactions.timeout_s
        specs += [
            AssetCheckSpec(TRANSACTIONS_CHECK, asset=key, blocking=True, description=(
                f"No transaction has kept {name} from applying anything for "
                f"{duration_text(timeout_s)} or more (events its END announces missing, or no "
                "END).")),
            AssetCheckSpec(WATERMARK_CHECK, asset=key, description=(
                f"The connector's consistent watermark is at most "
                f"{duration_text(table.checks.max_watermark_lag_s)} old.")),
        ]
    if table.kind in PLACEHOLDER_KINDS:
        # Evaluated after each merge, on that merge's own count: a later merge's would hide it.
        specs.append(AssetCheckSpec(UNAVAILABLE_CHECK, asset=key, blocking=True, description=(
            f"Every value of {name} the source left unavailable (PostgreSQL's unchanged TOAST, Oracle's LOBs) "
            "was kept from the table's row: none was stored as null.")))
    return specs


def evaluated_after_merge(table: CapturedTable, spec: AssetCheckSpec) -> bool:
    """Whether a merge run of ``table`` evaluates its check ``spec``: the blocking checks always (they stop
    what depends on a table whose keys broke), the warnings with ``checks_after_merge: all`` only, else on the
    freshness schedule. Each evaluation is an event Dagster stores (31-38 ms each in its SQLite storage: five
    checks a table were half of a 50-table run's time, docs/performance.md)."""
    return spec.blocking or table.asset.checks_after_merge == "all"


def merge_check_specs(table: CapturedTable, key: AssetKey) -> list[AssetCheckSpec]:
    """The checks of ``table`` (``table_check_specs``) that its merge run evaluates."""
    return [spec for spec in table_check_specs(table, key) if evaluated_after_merge(table, spec)]


def scheduled_check_specs(table: CapturedTable, key: AssetKey) -> list[AssetCheckSpec]:
    """The checks of ``table`` (``table_check_specs``) left to the freshness schedule's runs."""
    return [spec for spec in table_check_specs(table, key) if not evaluated_after_merge(table, spec)]


def merge_run_checks(selected: Mapping[AssetKey, CapturedTable]) -> list[AssetCheckKey]:
    """The checks a merge run of the ``selected`` tables evaluates, for its run request to name: without
    them Dagster adds every check of the selected assets, the scheduled ones' ops too."""
    return [spec.key for key, table in selected.items() for spec in merge_check_specs(table, key)]


def selected_check_names(check_keys: Iterable[AssetCheckKey]) -> dict[AssetKey, set[str]]:
    """An op run's selected ``check_keys`` as the check names of each asset."""
    names: dict[AssetKey, set[str]] = {}
    for check_key in check_keys:
        names.setdefault(check_key.asset_key, set()).add(check_key.name)
    return names
