"""Primary-key changes: the values a key change's create left unavailable, and the batch cut that keeps
a key change's two events in one batch.

A primary-key change (``UPDATE t SET id = new WHERE id = old``) reaches the topic as a delete of the old
key and a create of the new key, emitted one after the other from one source change: both carry the same
source position (``core.position``), on the partitions of their keys. A column the UPDATE left alone and
the source stored out of line (PostgreSQL TOAST under ``REPLICA IDENTITY DEFAULT``, Oracle LOBs) carries
the connector's placeholder in the create. Such a create can only be a key change's (an INSERT sends every
value), and its value is the old key's: the latest the batch knew for the old key before its delete, else
the one the table holds for the old key, read before the MERGE deletes it (``KeyChanges.source_of``; the
fold marks such rows with ``_cdc_origin``, the create's source position).

The old key's values are found only if the batch holds the delete: ``key_change_cut`` keeps the two
events of a key change in one batch.
"""

from __future__ import annotations

import json
from bisect import bisect_left, bisect_right
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdc_assets.core.arrow import to_arrow
from cdc_assets.core.envelope import ERROR_COLUMN, json_payload
from cdc_assets.core.layout import OP_COLUMN, POSITION_COLUMN, UNAVAILABLE_COLUMN, ChangeEventLayout
from cdc_assets.core.position import position_source_part, source_position_of
from cdc_assets.core.types import placeholder_needles

# Folded rows and scd2 versions (never a table): the source position of the key change whose old key
# holds the values still listed in ``_cdc_unavailable``.
ORIGIN_COLUMN = "_cdc_origin"
# The position beside a value in the fold's structs (hidden: no row column is named so).
POSITION_FIELD = "_cdc_at"

Source = tuple[Literal["value", "stored", "unknown"], object]


def key_change_create(op: Column, unavailable: Column) -> Column:
    """Whether an event is a primary-key change's create that left columns unavailable."""
    return (op == "c") & (F.size(unavailable) > 0)


@dataclass(frozen=True)
class _Event:
    key: tuple[object, ...]
    op: str
    at: str  # position
    part: str  # source part of the position
    left: frozenset[str]
    values: Mapping[str, object]


class KeyChanges:
    """The key changes of a batch's decoded events, read on demand: only a batch whose fold left a key
    change's create with unavailable values queries its events again (the old keys' events)."""

    def __init__(self, decoded: DataFrame, layout: ChangeEventLayout):
        self._decoded, self._layout = decoded, layout
        self._asked: set[str] = set()
        self._deletes: dict[str, list[_Event]] = {}
        self._events: dict[tuple[object, ...], list[_Event]] = {}

    def _load(self, part: str) -> None:
        """The events of the old keys deleted at ``part``, and of the keys those keys changed from, in
        rounds (a chain of key changes in one batch)."""
        pending = {part} - self._asked
        keys = list(self._layout.key_columns)
        names = [name for name in self._layout.unchanged_columns if name not in keys]
        while pending:
            self._asked |= pending
            good = self._decoded.where(F.col(ERROR_COLUMN).isNull())
            at = F.col(POSITION_COLUMN)
            olds = good.where((F.col(OP_COLUMN) == "d") & position_source_part(at).isin(*sorted(pending)))
            found = to_arrow(good.join(olds.select(*keys).distinct(), keys, "left_semi").select(
                *keys, OP_COLUMN, POSITION_COLUMN, position_source_part(at).alias("_cdc_part"), UNAVAILABLE_COLUMN,
                *names)).to_pylist()
            pending = set()
            fresh: dict[tuple[object, ...], list[_Event]] = {}
            for row in found:
                key = tuple(row[k] for k in keys)
                if key in self._events:
                    continue  # loaded in an earlier round
                event = _Event(key, row[OP_COLUMN], row[POSITION_COLUMN], row["_cdc_part"],
                               frozenset(row[UNAVAILABLE_COLUMN] or ()), {n: row[n] for n in names})
                fresh.setdefault(key, []).append(event)
                if event.op == "d":
                    self._deletes.setdefault(event.part, []).append(event)
                elif event.op == "c" and event.left and event.part not in self._asked:
                    pending.add(event.part)
            for key, events in fresh.items():
                self._events[key] = sorted(events, key=lambda e: e.at)

    def source_of(self, part: str, name: str) -> Source:
        """Where the value of column ``name`` of the key change at source position ``part`` comes from:
        ``("value", v)`` known in the batch, ``("stored", old_key)`` the table's row of the old key, or
        ``("unknown", None)`` when the batch holds no single delete at that position."""
        followed: set[str] = set()
        while part not in followed:  # a cycle of key changes without a known value ends the chain
            followed.add(part)
            self._load(part)
            deletes = self._deletes.get(part, [])
            if len(deletes) != 1:
                return "unknown", None
            delete = deletes[0]
            earlier = [e for e in self._events[delete.key] if e.at < delete.at]
            known = next((e for e in reversed(earlier) if e.op != "d" and name not in e.left), None)
            anchor = next((e for e in reversed(earlier) if e.op == "c" and e.left), None)
            if anchor is not None and (known is None or anchor.at > known.at):
                part = anchor.part  # the old key was itself a key change's create: follow it
                continue
            if known is not None:
                return "value", known.values[name]
            return "stored", delete.key
        return "unknown", None


def emission_order(value: bytes, kind: str) -> str | None:
    """A text that sorts the change events of a connector as it emitted them (and as each partition holds
    them); None for a value that is no change event."""
    try:
        payload = json_payload(value)
    except ValueError:
        return None
    source = payload.get("source") if isinstance(payload, Mapping) else None
    if not isinstance(source, Mapping):
        return None
    if kind != "postgresql":
        return source_position_of(source, kind)  # the other connectors' positions follow their commit order
    # PostgreSQL emits transactions in commit order while their changes interleave in the WAL: the LSN alone
    # does not follow the emission, `sequence` (["<last commit LSN>", "<LSN>"]) does.
    try:
        sequence = json.loads(source["sequence"]) if isinstance(source.get("sequence"), str) else [None, None]
        commit, lsn = sequence[0], source.get("lsn") if source.get("lsn") is not None else sequence[1]
        return f"{int(commit or 0):016x}{int(lsn or 0):016x}"
    except (ValueError, TypeError, IndexError):
        return None


_KEY_CHANGE_HALF = r'"op"\s*:\s*"d"'
_CREATE = r'"op"\s*:\s*"c"'


def unfinished_partitions(end_offsets: Mapping[int, int], high_watermarks: Mapping[int, int]) -> list[int]:
    """The partitions a batch did not read to their end: only there can a key change's second event be
    unread (a batch read to the end of every partition is never cut)."""
    return [p for p, end in end_offsets.items() if end < high_watermarks.get(p, end)]


def key_change_cut(records: pa.Table, end_offsets: Mapping[int, int], high_watermarks: Mapping[int, int],
                   kind: str, placeholder: str | None, halves: Collection[tuple[int, int]] = ()
                   ) -> dict[int, int] | None:
    """The end offsets that keep a primary-key change's delete and create in one batch, for a batch of raw
    ``records`` (``partition``, ``offset``, ``value``; tombstones null) stopped at its limits; None: the
    batch is kept whole. ``halves``: the (partition, offset) of the records that carry Debezium's key-change
    headers (``io.kafka.KEY_CHANGE_HEADERS``).

    The two events are emitted one after the other, so one may still be unread only on a partition the
    batch did not read to its end, past the last event read there. The batch keeps what was emitted up to
    the earliest of those last events (``emission_order``; the two events of a key change share theirs),
    and leaves the rest for the next batch, only when the rest holds a delete, or a create carrying the
    placeholder. Where that earliest last event is a delete, whose create may follow it on its own
    partition, the batch ends before it. Where the batch read no event of such a partition (tombstones
    only), nothing read elsewhere is known to come before its next event: the batch keeps that
    partition's tombstones alone. A cut at the batch's start offsets keeps nothing: the batch must be
    read further (a delete emitted before everything else read, its create not read yet).

    A partition read to its high watermark may miss one too: the watermarks are read one partition at a
    time, so a key change written between two of those reads may have one event below its partition's
    watermark and the other above its own. A half of a key change (``halves``) whose other half the batch
    does not hold ends the batch before it, wherever the batch read to."""
    unfinished = unfinished_partitions(end_offsets, high_watermarks)
    if not unfinished and not halves:
        return None
    values = records["value"]
    by_partition: dict[int, tuple[list[int], _Ordered]] = {}
    firsts: dict[int, int] = {}
    for partition in end_offsets:
        mine = pc.equal(records["partition"], partition)
        if pc.any(mine).as_py():
            firsts[partition] = pc.min(pc.filter(records["offset"], mine)).as_py()
        # Indices into the batch, not copies: a binary search reads a few values, the cut's tail is searched.
        indices = pc.indices_nonzero(pc.and_(mine, pc.is_valid(values)))
        offsets = pc.take(records["offset"], indices)
        if len(offsets) > 1 and not pc.all(pc.greater(offsets[1:], offsets[:-1])).as_py():
            order = pc.sort_indices(offsets)
            indices, offsets = pc.take(indices, order), pc.take(offsets, order)
        by_partition[partition] = (offsets.to_pylist(), _Ordered(values, indices, kind))
    cut = _unread_half_cut(by_partition, firsts, values, unfinished, end_offsets, placeholder) if unfinished \
        else None
    bound = _open_half(by_partition, halves)
    if bound is None:
        return cut
    before = {p: offsets[i] if (i := bisect_left(ordered, bound)) < len(offsets) else end_offsets[p]
              for p, (offsets, ordered) in by_partition.items()}
    return before if cut is None else {p: min(end, cut[p]) for p, end in before.items()}


def _unread_half_cut(by_partition: Mapping[int, tuple[list[int], _Ordered]], firsts: Mapping[int, int],
                     values: pa.ChunkedArray, unfinished: Sequence[int], end_offsets: Mapping[int, int],
                     placeholder: str | None) -> dict[int, int] | None:
    """``key_change_cut`` for the partitions the batch did not read to their end (``unfinished``)."""
    if any(not by_partition[p][1] for p in unfinished):
        if not _holds_key_change_half(pc.filter(values, pc.is_valid(values)), placeholder):
            return None
        return {p: firsts.get(p, end) if by_partition[p][1] else end for p, end in end_offsets.items()}
    lasts = {p: by_partition[p][1][-1] for p in unfinished}
    bound = min((last for last in lasts.values() if last), default=None)
    if bound is None:
        return None
    last_deletes = [by_partition[p][1].value(-1) for p, last in lasts.items() if last == bound]
    at_bound = [ordered.value(i) for _, ordered in by_partition.values()
                if (i := bisect_left(ordered, bound)) < len(ordered) and ordered[i] == bound]
    # A delete at the bound whose create was read is whole; one whose create was not may have it next.
    open_delete = _holds_key_change_half(pa.array(last_deletes, pa.binary()), None, creates=False) and \
        not _holds_create(pa.array(at_bound, pa.binary()))
    firsts_after: dict[int, int] = {}
    cut: dict[int, int] = {}
    for partition, (offsets, ordered) in by_partition.items():
        # Each partition holds its events in emission order: a binary search parses a few of them.
        first = bisect_left(ordered, bound) if open_delete else bisect_right(ordered, bound)
        firsts_after[partition] = first
        cut[partition] = offsets[first] if first < len(offsets) else end_offsets[partition]
    tails = [ordered.values_from(firsts_after[p]) for p, (_, ordered) in by_partition.items()]
    return cut if _holds_key_change_half(pa.chunked_array(tails, pa.binary()), placeholder) else None


def _open_half(by_partition: Mapping[int, tuple[list[int], _Ordered]], halves: Collection[tuple[int, int]]
               ) -> str | None:
    """The emission order of the earliest key change of which the batch holds one event only (its delete or
    its create, among the events at ``halves``); None: none."""
    ops: dict[str, set[str]] = {}
    for partition, offset in halves:
        if partition not in by_partition:
            continue
        offsets, ordered = by_partition[partition]
        i = bisect_left(offsets, offset)
        if i == len(offsets) or offsets[i] != offset or not ordered[i]:
            continue  # a tombstone (a key change's delete is followed by one), or no change event
        value = pa.array([ordered.value(i)], pa.binary())
        op = "d" if _holds_key_change_half(value, None, creates=False) else "c" if _holds_create(value) else None
        if op is not None:
            ops.setdefault(ordered[i], set()).add(op)
    return min((at for at, seen in ops.items() if len(seen) == 1), default=None)


class _Ordered(Sequence[str]):
    """A partition's values (``indices`` into the batch's ``values``) as their emission orders (``""``: not a
    change event), parsed only where a binary search looks."""

    def __init__(self, values: pa.ChunkedArray, indices: pa.Array, kind: str):
        self._values, self._indices, self._kind = values, indices, kind

    def __len__(self) -> int:
        return len(self._indices)

    def __getitem__(self, index: int) -> str:  # type: ignore[override]
        return emission_order(self.value(index), self._kind) or ""

    def value(self, index: int) -> bytes:
        """The raw value at ``index``."""
        return self._values[self._indices[index].as_py()].as_py()

    def values_from(self, index: int) -> pa.Array:
        """The raw values from ``index`` on."""
        return pc.take(self._values, self._indices[index:]).combine_chunks() if index < len(self) else \
            pa.array([], pa.binary())


def _holds_create(values: pa.Array) -> bool:
    """Whether raw ``values`` may hold a create."""
    return bool(len(values)) and bool(pc.any(pc.match_substring_regex(values, _CREATE)).as_py())


def _holds_key_change_half(values: pa.Array | pa.ChunkedArray, placeholder: str | None, creates: bool = True
                           ) -> bool:
    """Whether raw ``values`` may hold half of a key change that matters: a delete, or (``creates``) a create
    carrying the placeholder (a search of the raw text: a value's own text escapes its quotes)."""
    if not len(values):
        return False
    if pc.any(pc.match_substring_regex(values, _KEY_CHANGE_HALF)).as_py():
        return True
    if not creates:
        return False
    created = pc.filter(values, pc.match_substring_regex(values, _CREATE))
    if not len(created):
        return False
    needles = placeholder_needles(placeholder) if placeholder is not None else None
    if needles is None:
        return True
    return any(pc.any(pc.match_substring(created, needle.decode())).as_py() for needle in needles)
