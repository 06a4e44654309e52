"""The fair-share split of a batch's record and byte bounds among its partitions (``fetch.Fetch``):
librdkafka hands out what it fetched partition by partition, so one busy partition must not fill a
batch while the others wait."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence


class Shares:
    """A batch's record and byte bounds shared out among its partitions, in rounds: each round gives every
    partition still below its end an even part of what the batch may still take, so a partition that
    reaches its end with part of its share unused leaves it to the others in the next round."""

    def __init__(self, partitions: list[int], max_records: int, max_bytes: int):
        self.max_records, self.max_bytes = max_records, max_bytes
        self.count = self.size = 0
        self._records = dict.fromkeys(partitions, 0)
        self._bytes = dict.fromkeys(partitions, 0)
        self._record_share = dict.fromkeys(partitions, 0)
        self._byte_share = dict.fromkeys(partitions, 0)

    @property
    def full(self) -> bool:
        """Whether the batch reached a bound."""
        return self.count >= self.max_records or self.size >= self.max_bytes

    @property
    def records_left(self) -> int:
        return self.max_records - self.count

    def records_allowed(self, partition: int) -> int:
        """Records the partition may still take in this round."""
        return max(0, self._record_share[partition] - self._records[partition])

    def takes(self, partition: int) -> bool:
        """Whether the partition may take its next record (the one that crosses its byte share included)."""
        return (not self.full and self._records[partition] < self._record_share[partition]
                and self._bytes[partition] < self._byte_share[partition])

    def active(self, below: list[int]) -> list[int]:
        """The partitions of ``below`` (not at their ends) that may take records; a new round when none may."""
        taking = [p for p in below if self.takes(p)]
        if taking:
            return taking
        # The records the partitions below may hold in all, levelled: one that holds more than its even part
        # already (records carried from the batch before) takes none, the others split the rest exactly, the
        # lowest partitions taking one more: which gets the odd record does not hang on librdkafka's order.
        levelled = sorted(below)
        total = self.records_left + sum(self._records[p] for p in levelled)
        while any(self._records[p] * len(levelled) > total for p in levelled):
            over = [p for p in levelled if self._records[p] * len(levelled) > total]
            total -= sum(self._records[p] for p in over)
            levelled = [p for p in levelled if p not in over]
        records, odd = divmod(total, len(levelled))
        size = -(-(self.max_bytes - self.size) // len(below))
        for partition in below:
            self._record_share[partition] = self._records[partition]
            self._byte_share[partition] = self._bytes[partition] + size
        for rank, partition in enumerate(levelled):
            self._record_share[partition] = records + (rank < odd)
        return list(below)

    def took(self, partition: int, size: int, records: int = 1) -> None:
        """Count ``records`` of ``size`` bytes in all that the partition took."""
        self.count += records
        self.size += size
        self._records[partition] += records
        self._bytes[partition] += size

    def takes_of(self, partition: int, sizes: Sequence[int]) -> int:
        """How many of the records of ``sizes``, in order, the partition may take (``takes`` for each)."""
        records = min(self.max_records - self.count, self._record_share[partition] - self._records[partition])
        room = min(self.max_bytes - self.size, self._byte_share[partition] - self._bytes[partition])
        if records <= 0 or room <= 0 or not sizes:
            return 0
        # A record is taken while the bytes taken before it stay below the room: the one crossing it too.
        before = itertools.accumulate(sizes[:min(records, len(sizes)) - 1])
        return 1 + bisect.bisect_left(list(before), room)


class Kept:
    """A partition's records read past its share, in offset order: their offsets and sizes, from ``head``."""

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.sizes: list[int] = []
        self.head = 0
        self.size = 0

    def __len__(self) -> int:
        return len(self.offsets) - self.head

    def add(self, offset: int, size: int) -> None:
        self.offsets.append(offset)
        self.sizes.append(size)
        self.size += size

    def take(self, shares: Shares, partition: int) -> int | None:
        """Give the partition what its share takes of these records, first first; the offset after the last
        one taken (None: none taken)."""
        count = shares.takes_of(partition, self.sizes[self.head:self.head + shares.max_records])
        if not count:
            return None
        size = sum(self.sizes[self.head:self.head + count])
        shares.took(partition, size, count)
        self.size -= size
        self.head += count
        return self.offsets[self.head - 1] + 1
