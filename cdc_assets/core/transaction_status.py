"""What a transaction-consistent batch found about the table's transactions (``cdc_assets.merge.transactions``):
the status its commit records in the Delta log, its report carries and its materialization shows.

The status is written to and read from JSON here only (``to_metadata`` / ``from_metadata``): commits made by
earlier versions, which recorded neither ``waiting_s``, ``stalled`` nor ``applied_in``, read the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# At most this many waiting transactions are listed (the oldest ids first): the status rides in every commit.
LISTED_WAITING = 20


@dataclass(frozen=True)
class TransactionCount:
    """A transaction that waits: its events for the table the batch holds (``seen``), those its END announces
    (``expected``; None: no END names the table yet) and, once it stalls the table, the seconds it has waited
    since its first event's source time."""

    seen: int
    expected: int | None
    waiting_s: float | None = None

    def to_metadata(self) -> dict[str, Any]:
        """As JSON: ``{seen, expected}``, with ``waiting_s`` where it is known."""
        recorded: dict[str, Any] = {"seen": self.seen, "expected": self.expected}
        if self.waiting_s is not None:
            recorded["waiting_s"] = self.waiting_s
        return recorded

    @classmethod
    def from_metadata(cls, recorded: Mapping[str, Any]) -> TransactionCount:
        """The count ``to_metadata`` wrote."""
        return cls(int(recorded["seen"]), None if recorded["expected"] is None else int(recorded["expected"]),
                   None if recorded.get("waiting_s") is None else float(recorded["waiting_s"]))


@dataclass(frozen=True)
class TransactionStatus:
    """The transactions of one batch of a table cut to whole transactions.

    ``applied_end``: the commit position of the last transaction the table applied (this batch or before);
    ``applied_in``: per partition of the table's topic, the greatest commit position of a transaction the table
    applied with events there (this batch or before: ``core.transactions.cut_batch`` tells events delivered again
    by it);
    ``horizon``: the greatest commit position at which the table is exact (``core.transactions.exact_horizon``;
    below ``applied_end`` when it is exact nowhere);
    ``applied``: the transactions this batch applied whole; ``waiting``: the first ``LISTED_WAITING`` that wait,
    with ``waiting_s`` the seconds each has waited since its first event's source time; ``incomplete``: those
    whose END announces more events than the whole topic holds for the table; ``stalled``: those that keep the
    batch from applying anything past the table's ``transaction_timeout_s``."""

    applied_end: int
    horizon: int
    applied: int = 0
    waiting: Mapping[str, TransactionCount] = field(default_factory=dict)
    waiting_s: Mapping[str, float] = field(default_factory=dict)
    incomplete: Mapping[str, TransactionCount] = field(default_factory=dict)
    stalled: Mapping[str, TransactionCount] = field(default_factory=dict)
    applied_in: Mapping[int, int] = field(default_factory=dict)

    def to_metadata(self) -> dict[str, Any]:
        """The JSON a commit records (``CommitRequest.transactions``) and a materialization shows."""
        return {
            "applied_end": self.applied_end,
            "horizon": self.horizon,
            "applied": self.applied,
            "waiting": _counts_metadata(self.waiting),
            "waiting_s": dict(self.waiting_s),
            "incomplete": _counts_metadata(self.incomplete),
            "stalled": _counts_metadata(self.stalled),
            "applied_in": {str(partition): position for partition, position in sorted(self.applied_in.items())},
        }

    @classmethod
    def from_metadata(cls, recorded: Mapping[str, Any]) -> TransactionStatus:
        """The status a commit recorded (``TableProgress.transactions``, a Delta log entry's), by any version."""
        return cls(
            applied_end=int(str(recorded["applied_end"])),
            horizon=int(str(recorded["horizon"])),
            applied=int(str(recorded.get("applied", 0))),
            waiting=counts_from_metadata(recorded.get("waiting")),
            waiting_s={tx: float(s) for tx, s in (recorded.get("waiting_s") or {}).items()},
            incomplete=counts_from_metadata(recorded.get("incomplete")),
            stalled=counts_from_metadata(recorded.get("stalled")),
            applied_in={int(p): int(position) for p, position in (recorded.get("applied_in") or {}).items()},
        )


def _counts_metadata(counts: Mapping[str, TransactionCount]) -> dict[str, dict[str, Any]]:
    return {tx: count.to_metadata() for tx, count in counts.items()}


def counts_from_metadata(recorded: Mapping[str, Mapping[str, Any]] | None) -> dict[str, TransactionCount]:
    """Waiting transactions as ``TransactionStatus.to_metadata`` wrote them (None: none)."""
    return {tx: TransactionCount.from_metadata(count) for tx, count in (recorded or {}).items()}
