"""The project's definitions: every component under ``defs/`` (here the CDC component)."""

from pathlib import Path

import dagster as dg


@dg.definitions
def defs() -> dg.Definitions:
    """What ``defs/`` declares."""
    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
