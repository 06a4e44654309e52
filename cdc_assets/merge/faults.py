"""Fault injection at named points of a batch's merge: ``consumed`` (its records read), ``folded`` (about to
commit) and ``committed``.

Tests and ``benchmarks/crash_trials.py`` set ``fault_hook`` (this module's attribute, read at each point) to
stop, kill or hold the process there.
"""

from __future__ import annotations

from collections.abc import Callable

fault_hook: Callable[[str], None] | None = None


def checkpoint(point: str) -> None:
    """Call ``fault_hook`` (if set) at the named ``point``."""
    if fault_hook is not None:
        fault_hook(point)
