"""A run's batches cut to keep primary-key changes whole still come from the source's read ahead: the cut is
applied before the next batch is read ahead, which starts at the cut (the W1 regression of issue 43)."""

import random

from cdc_assets.config import BatchLimits
from cdc_assets.io.delta import DeltaRsWriter
from cdc_assets.io.kafka import KafkaSource
from cdc_assets.merge import merge_micro_batches
from tests.support.key_changes import TOAST_COLUMNS, current_values, pg_change, pk_change, produce_spread
from tests.support.merges import captured_table
from tests.support.topics import new_topic


class _Watched(KafkaSource):
    """A real source that notes each batch asked for, beside the one it was reading ahead then (None: none)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.asks: list[tuple[tuple, tuple | None]] = []

    def _take_ahead(self, request):
        self.asks.append((request, self._ahead[0] if self._ahead is not None else None))
        return super()._take_ahead(request)


def test_batches_cut_for_key_changes_are_read_ahead_and_count_each_record_once(spark, broker, tmp_path):
    """Creates, updates, deletes (each with its tombstone) and key changes on three partitions, drained by
    one run in batches of 20 records: batches stop where the rest holds a delete, the batch read ahead is
    the one the next batch asks for, each record is read once, and the table is the fold of it all."""
    writer = DeltaRsWriter()
    topic = new_topic(broker, "dbserver1.s.t", partitions=3)
    table = captured_table(topic, tmp_path, columns=TOAST_COLUMNS)
    rng = random.Random(5)
    events, state, lsn = [], {}, 100
    for _ in range(400):
        key, draw = rng.randrange(40), rng.random()
        if key not in state or draw < 0.6:
            events += pg_change("u" if key in state else "c", key, lsn, f"text {key}.{lsn}", n=lsn)
            state[key] = (f"text {key}.{lsn}", lsn)
        elif draw < 0.85:
            events += pg_change("d", key, lsn)
            del state[key]
        elif (new := key + 100) not in state:
            events += pk_change(key, new, lsn, n=lsn)  # the create carries the placeholder: the old key's value
            state[new] = (state.pop(key)[0], lsn)
        lsn += 10
    produce_spread(broker, topic, events, 3, rng)
    source = _Watched({"bootstrap.servers": broker.bootstrap_servers, "group.id": "cdc-tests"})
    try:
        limits = BatchLimits(max_records=20, poll_timeout_s=10, max_batches_per_run=1000)
        reports = list(merge_micro_batches(spark, source, writer, table, limits))
    finally:
        source.close()
    assert reports[-1].raw.caught_up
    assert current_values(spark, writer, table) == state
    assert sum(r.events_read for r in reports) == len(events)
    assert any(r.events_read < 20 for r in reports[:-1]), "no batch was cut"
    # Every batch after the first was being read ahead when asked for, unless it is asked for again (prepared
    # ahead, it read the table's values before the commit before it: ``merge.batches._taken``).
    assert [i for i, (request, ahead) in enumerate(source.asks)
            if i > 0 and ahead != request and request not in [r for r, _ in source.asks[:i]]] == []
