"""What every check result shares: durations as a person reads them, and a check that could not look."""

from dagster import AssetCheckResult, AssetCheckSeverity, AssetKey


def duration_text(seconds: float) -> str:
    """``seconds`` as a person reads a duration: "0.4 s", "42 s", "3 min 5 s", "1 h 26 min", "2 d 3 h"."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    for unit, size, smaller, smaller_size in (("d", 86400, "h", 3600), ("h", 3600, "min", 60), ("min", 60, "s", 1)):
        if whole >= size:
            rest = (whole % size) // smaller_size
            return f"{whole // size} {unit}" + (f" {rest} {smaller}" if rest else "")
    return f"{whole} s"


NOT_MATERIALIZED = "cannot evaluate: {name} has no materialization yet (materialize it, or run cdc_merge_job)"


def not_evaluated(key: AssetKey, check_name: str, why: str) -> AssetCheckResult:
    """A check that could not look: a warning that says why, never a pass."""
    return AssetCheckResult(asset_key=key, check_name=check_name, passed=False, severity=AssetCheckSeverity.WARN,
                            description=why, metadata={"evaluated": False})
