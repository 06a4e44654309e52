"""Records read past a batch's end, carried to the batch that goes on from there instead of being fetched
again: what a partition's share could not take, what a caller's cut left out, what a cut batch read on.

One slot (``Carry``) holds them, with what they are records of (topic, ``until``, decode) and where they
start; the next read takes them when it starts there, and leaves what it reads past its own end in turn.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc

from cdc_assets.io.kafka.batch import Cut, RawBatch, ReadRequest

# How often a batch whose cut keeps nothing reads its topic's watermarks again while nothing more is there.
_READ_ON_WAIT_S = 0.1


def split(batch: RawBatch, ends: Mapping[int, int]) -> tuple[RawBatch, RawBatch]:
    """``batch`` up to ``ends`` (each partition's offset its part stops before), and the records from there."""
    records = batch.records
    before = pc.less(records["partition"], 0)  # none
    for partition, end in ends.items():
        before = pc.or_(before, pc.and_(pc.equal(records["partition"], partition), pc.less(records["offset"], end)))
    past = pc.invert(before)
    # The records before the first one past the cut are all kept: sliced, not copied.
    first = pc.index(past, True).as_py()
    first = records.num_rows if first < 0 else first  # none past it: a cut over offsets no record holds
    kept = pa.concat_tables([records.slice(0, first), records.slice(first).filter(before.slice(first))])
    rest = records.filter(past)
    size = sum(pc.sum(pc.binary_length(kept[name])).as_py() or 0 for name in ("key", "value"))
    halves = frozenset(h for h in batch.key_change_halves if h[0] in ends and h[1] < ends[h[0]])
    return (replace(batch, records=kept, end_offsets=dict(ends), records_read=kept.num_rows, bytes_read=size,
                    key_change_halves=halves),
            replace(batch, records=rest, start_offsets=dict(ends), records_read=rest.num_rows,
                    bytes_read=batch.bytes_read - size, timings={},
                    key_change_halves=batch.key_change_halves - halves))


def _joined(first: RawBatch, then: RawBatch | None) -> RawBatch:
    """``first`` and the records of ``then`` when they continue it, each partition from where ``first`` ends
    (records that do not continue it are let go)."""
    if then is None or then.start_offsets != first.end_offsets:
        return first
    return replace(first, records=pa.concat_tables([first.records, then.records]), end_offsets=then.end_offsets,
                   records_read=first.records_read + then.records_read, bytes_read=first.bytes_read + then.bytes_read,
                   key_change_halves=first.key_change_halves | then.key_change_halves)


class Carry:
    """The records read past the end of a source's last batch (None: none), and what they are records of."""

    def __init__(self) -> None:
        self._held: tuple[tuple, RawBatch] | None = None

    def keep(self, request: ReadRequest, records: RawBatch | None) -> None:
        """Hold ``records``, read for ``request`` past its batch (None: let go what is held)."""
        self._held = None if records is None else (request.records_of, records)

    def put_before(self, request: ReadRequest, records: RawBatch) -> None:
        """Hold ``records`` followed by what is held, if it continues them (a batch's part past a cut, or a
        whole batch read on from its start)."""
        held = self._held[1] if self._held is not None and self._held[0] == request.records_of else None
        self._held = (request.records_of, _joined(records, held))

    def take(self, request: ReadRequest) -> RawBatch | None:
        """The records held, if ``request`` starts with them (the consumer is positioned at their end offsets);
        let go either way."""
        held, self._held = self._held, None
        if held is None or held[0] != request.records_of or held[1].start_offsets != (request.start_offsets or {}):
            return None
        return held[1]

    def clear(self) -> None:
        """Let go what is held (a batch read ahead that no one took read them)."""
        self._held = None


def cut_batch(batch: RawBatch, request: ReadRequest, cut: Cut, read: Callable[[ReadRequest], RawBatch],
              carry: Carry) -> RawBatch:
    """``batch``, read for ``request``, ended where ``cut`` says (``KafkaSource.read_batch``), the records past
    it carried on. A cut that keeps nothing has the batch read on (``read``), taking it first, its bounds doubled
    each time, until the cut keeps something or nothing more comes for the poll timeout (then it is whole)."""
    idle_since: float | None = None  # since when reading on has found nothing more
    while True:
        asked = cut(batch)
        ends = {p: (asked or {}).get(p, end) for p, end in batch.end_offsets.items()}
        if ends == batch.end_offsets:
            return batch
        if ends != batch.start_offsets:
            kept, rest = split(batch, ends)
            carry.put_before(request, rest)
            return kept
        if idle_since is None:
            request = request.doubled()
        carry.put_before(request, batch)  # read on from the batch's start, taking it first
        further = read(request.from_(batch.start_offsets))
        if further.end_offsets != batch.end_offsets:
            idle_since = None
        elif idle_since is None:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since >= request.poll_timeout_s:
            return batch  # nothing more to read: whole
        else:
            # What the cut waits for may be a moment behind what was read (a key change's other event,
            # produced to another partition): the watermarks are read again until the poll timeout.
            time.sleep(_READ_ON_WAIT_S)
        batch = replace(further, timings={k: batch.timings.get(k, 0.0) + further.timings.get(k, 0.0)
                                          for k in {*batch.timings, *further.timings}})
