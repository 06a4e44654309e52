"""The Kafka source reads bounded, contiguous batches from given offsets on the real broker."""

import time

import pytest
from confluent_kafka import Consumer, Producer

from cdc_assets.io.kafka import KafkaSource, SourceError, UnknownTopicError
from tests.support.topics import new_topic, produce


@pytest.fixture
def source(broker):
    kafka = KafkaSource({"bootstrap.servers": broker.bootstrap_servers, "group.id": "source-tests"}, retries=1,
                        backoff_s=0.1)
    yield kafka
    kafka.close()


def records(n, tag="v"):
    return [(f'{{"id": {i}}}'.encode(), f"{tag}{i}".encode()) for i in range(n)]


def test_reads_every_partition_up_to_the_high_watermarks(broker, source):
    topic = new_topic(broker, "src.all", partitions=3)
    for partition in range(3):
        produce(broker, topic, records(5, f"p{partition}-"), partition=partition)
    batch = source.read_batch(topic, None, max_records=1000, max_bytes=10**9, poll_timeout_s=10)
    assert batch.records.num_rows == 15
    assert batch.start_offsets == {0: 0, 1: 0, 2: 0}
    assert batch.end_offsets == batch.high_watermarks == {0: 5, 1: 5, 2: 5}
    assert batch.caught_up


def test_record_bound_keeps_each_partition_contiguous_and_resumes_exactly(broker, source):
    topic = new_topic(broker, "src.bound", partitions=2)
    for partition in range(2):
        produce(broker, topic, records(50), partition=partition)
    seen = {0: [], 1: []}
    offsets = None
    for _ in range(10):
        batch = source.read_batch(topic, offsets, max_records=30, max_bytes=10**9, poll_timeout_s=10)
        assert batch.records.num_rows <= 30
        for partition, offset in zip(batch.records["partition"].to_pylist(), batch.records["offset"].to_pylist(),
                                     strict=True):
            seen[partition].append(offset)
        for partition, end in batch.end_offsets.items():
            assert end == batch.start_offsets[partition] + batch.records["partition"].to_pylist().count(partition)
        offsets = batch.end_offsets
        if batch.caught_up:
            break
    assert seen == {0: list(range(50)), 1: list(range(50))}


def test_tombstones_are_read_as_null_values(broker, source):
    topic = new_topic(broker, "src.tomb")
    produce(broker, topic, [(b'{"id": 1}', b"x"), (b'{"id": 1}', None)])
    batch = source.read_batch(topic, None, 100, 10**9, 10)
    assert batch.records["value"].to_pylist() == [b"x", None]


def test_missing_topic_names_topic_and_broker_at_once(broker, source):
    with pytest.raises(UnknownTopicError,
                       match=rf"^topic 'no.such.topic' does not exist on {broker.bootstrap_servers}; "):
        source.read_batch("no.such.topic", None, 10, 10**9, 5)


def test_nothing_new_reads_nothing(broker, source):
    topic = new_topic(broker, "src.none")
    produce(broker, topic, records(3))
    batch = source.read_batch(topic, {0: 3}, 100, 10**9, 10)
    assert batch.records.num_rows == 0 and batch.end_offsets == {0: 3}


def test_committed_offsets_beyond_the_topic_are_refused(broker, source):
    topic = new_topic(broker, "src.recreated")
    produce(broker, topic, records(2))
    with pytest.raises(SourceError, match=r"committed offset 9 is beyond the high watermark 2"):
        source.read_batch(topic, {0: 9}, 100, 10**9, 10)


def test_consecutive_batches_reuse_the_assignment_and_lose_nothing(broker, source):
    """Batches that continue where the last ended keep the fetched records; any other start re-seeks,
    and records that arrive after a partition was caught up are read by the next batch."""
    topic = new_topic(broker, "src.keep", partitions=2)
    produce(broker, topic, records(40, "a"), partition=0)
    produce(broker, topic, records(5, "b"), partition=1)

    def values(batch):
        return [(p, v.decode()) for p, v in zip(batch.records["partition"].to_pylist(),
                                                batch.records["value"].to_pylist(), strict=True)]

    first = source.read_batch(topic, None, max_records=20, max_bytes=10**9, poll_timeout_s=10)
    second = source.read_batch(topic, first.end_offsets, max_records=20, max_bytes=10**9, poll_timeout_s=10)
    third = source.read_batch(topic, second.end_offsets, max_records=20, max_bytes=10**9, poll_timeout_s=10)
    read = values(first) + values(second) + values(third)
    assert sorted(read) == sorted([(0, f"a{i}") for i in range(40)] + [(1, f"b{i}") for i in range(5)])
    assert third.caught_up

    produce(broker, topic, records(3, "c"), partition=1)  # after partition 1 was caught up
    fourth = source.read_batch(topic, third.end_offsets, max_records=20, max_bytes=10**9, poll_timeout_s=10)
    assert values(fourth) == [(1, "c0"), (1, "c1"), (1, "c2")]

    # An earlier start (a batch that did not commit) is read again: contiguous runs from that start.
    again = source.read_batch(topic, first.end_offsets, max_records=20, max_bytes=10**9, poll_timeout_s=10)
    assert again.records.num_rows == 20
    for partition in (0, 1):
        offsets = [o for p, o in zip(again.records["partition"].to_pylist(), again.records["offset"].to_pylist(),
                                     strict=True) if p == partition]
        assert offsets == list(range(first.end_offsets[partition], first.end_offsets[partition] + len(offsets)))



def test_one_source_reads_topic_after_topic_each_from_its_own_offsets(broker, source):
    """The fetching consumer moves from topic to topic (as a run's worker does over its tables): every
    batch holds exactly its topic's records from its start, never the last topic's, nor records it
    fetched ahead of a batch cut short."""
    first_topic, second_topic = new_topic(broker, "src.turns.a", partitions=2), new_topic(broker, "src.turns.b",
                                                                                        partitions=2)
    for partition in range(2):
        produce(broker, first_topic, records(30, f"a{partition}-"), partition=partition)
        produce(broker, second_topic, records(4, f"b{partition}-"), partition=partition)

    def values(batch):
        return sorted(v.decode() for v in batch.records["value"].to_pylist())

    cut = source.read_batch(first_topic, None, max_records=20, max_bytes=10**9, poll_timeout_s=10)
    assert not cut.caught_up and cut.records.num_rows == 20
    whole = source.read_batch(second_topic, None, max_records=1000, max_bytes=10**9, poll_timeout_s=10)
    assert values(whole) == sorted(f"b{p}-{i}" for p in range(2) for i in range(4)) and whole.caught_up
    rest = source.read_batch(first_topic, cut.end_offsets, max_records=1000, max_bytes=10**9, poll_timeout_s=10)
    assert sorted(values(cut) + values(rest)) == sorted(f"a{p}-{i}" for p in range(2) for i in range(30))
    assert rest.caught_up
    produce(broker, second_topic, records(2, "c"), partition=1)
    new = source.read_batch(second_topic, whole.end_offsets, max_records=1000, max_bytes=10**9, poll_timeout_s=10)
    assert values(new) == ["c0", "c1"]


def test_a_batch_read_ahead_is_taken_only_where_it_starts(broker, source):
    """The next batch is read while this one is applied; a batch asked from anywhere else (this one
    failed, say) is read anew, and other calls wait for the read ahead first."""
    topic = new_topic(broker, "src.ahead", partitions=2)
    produce(broker, topic, records(30, "a"), partition=0)
    produce(broker, topic, records(30, "b"), partition=1)

    def read(start):
        return source.read_batch(topic, start, max_records=25, max_bytes=10**9, poll_timeout_s=10, read_ahead=True)

    def runs(batch):
        """Each partition's offsets, checked contiguous from the batch's start."""
        by_partition = {}
        for p, o in zip(batch.records["partition"].to_pylist(), batch.records["offset"].to_pylist(), strict=True):
            by_partition.setdefault(p, []).append(o)
        for p, offsets in by_partition.items():
            assert offsets == list(range(batch.start_offsets[p], batch.end_offsets[p]))
        return by_partition

    first = read(None)
    assert source._ahead is not None  # reading the second batch already
    second = read(first.end_offsets)  # the one read ahead
    assert second.start_offsets == first.end_offsets
    retried = read(first.end_offsets)  # second "failed": asked again, read anew from the same start
    # Read anew: the same start and bound (how the partitions share the bound depends on what each
    # fetch brought), each partition a contiguous run from its start.
    runs(retried)
    assert retried.start_offsets == second.start_offsets
    assert retried.records.num_rows == second.records.num_rows == 25
    assert source.partitions(topic) == [0, 1]  # waits for the read ahead, then uses the consumer
    rest = read(second.end_offsets)
    seen = sorted((p, o) for batch in (first, second, rest) for p, offsets in runs(batch).items() for o in offsets)
    assert seen == sorted([(0, o) for o in range(30)] + [(1, o) for o in range(30)])
    assert rest.caught_up and source._ahead is None  # nothing left to read ahead


def _by_partition(batch):
    runs = {}
    for p, o in zip(batch.records["partition"].to_pylist(), batch.records["offset"].to_pylist(), strict=True):
        runs.setdefault(p, []).append(o)
    return runs


def test_a_partition_that_keeps_receiving_records_does_not_hold_up_the_others(broker, source):
    """Each partition's part of a batch ends at the high watermark seen when the batch began, and the
    partitions fetch together: one that keeps receiving records cannot keep another's records waiting."""
    topic = new_topic(broker, "src.fair", partitions=2)
    produce(broker, topic, records(200, "a"), partition=0)
    produce(broker, topic, records(20, "b"), partition=1)
    offsets, batches = None, 0
    while offsets is None or offsets[1] < 20:
        batch = source.read_batch(topic, offsets, max_records=50, max_bytes=10**9, poll_timeout_s=10)
        assert all(batch.end_offsets[p] <= high for p, high in batch.high_watermarks.items())
        for partition, run in _by_partition(batch).items():
            assert run == list(range(batch.start_offsets[partition], batch.end_offsets[partition]))
        offsets, batches = batch.end_offsets, batches + 1
        produce(broker, topic, records(200, "late"), partition=0)  # partition 0 keeps receiving
        assert batches <= 5, "partition 1 waited behind partition 0's new records"


@pytest.mark.parametrize("max_records", [4, 7, 16, 50])
def test_batches_read_every_record_once_in_contiguous_runs(broker, source, max_records):
    """Whatever the bound, with every partition fetching at once (read ahead too): each batch holds
    contiguous runs from its start offsets, and the batches together every record once."""
    topic = new_topic(broker, f"src.every{max_records}", partitions=3)
    sizes = {0: 37, 1: 5, 2: 61}
    for partition, size in sizes.items():
        produce(broker, topic, records(size, f"p{partition}-"), partition=partition)
    batches = _drain(source, topic, max_records)
    assert all(0 < batch.records.num_rows <= max_records for batch in batches)
    assert sorted(_records_of(batches)) == [(p, o) for p, size in sizes.items() for o in range(size)]


def _drain(source, topic, max_records, cut=None, most=200):
    """The batches that read ``topic`` from its start to its end (read ahead), each checked to hold contiguous
    runs from its start offsets, and each to start where the one before it ended."""
    batches, offsets = [], None
    for _ in range(most):
        batch = source.read_batch(topic, offsets, max_records=max_records, max_bytes=10**9, poll_timeout_s=10,
                                  read_ahead=True, cut=cut)
        assert offsets is None or batch.start_offsets == offsets
        for partition, run in _by_partition(batch).items():
            assert run == list(range(batch.start_offsets[partition], batch.end_offsets[partition]))
        batches.append(batch)
        offsets = batch.end_offsets
        if batch.caught_up:
            break
    return batches


def _records_of(batches):
    """The (partition, offset) of every record the ``batches`` hold."""
    return [(p, o) for batch in batches for p, run in _by_partition(batch).items() for o in run]


def test_a_byte_bound_reached_mid_fetch_loses_nothing(broker, source):
    """The consume call hands out more records than the byte bound lets the batch take: the ones
    left over are not counted as read (their offsets are not passed), the next batch reads them."""
    topic = new_topic(broker, "src.bytes")
    produce(broker, topic, [(b"k", b"x" * 99) for _ in range(10)])  # 100 bytes a record
    offsets, seen = None, []
    for _ in range(10):
        batch = source.read_batch(topic, offsets, max_records=1000, max_bytes=250, poll_timeout_s=10)
        assert batch.records.num_rows == batch.end_offsets[0] - batch.start_offsets[0] == 3 or batch.caught_up
        seen += batch.records["offset"].to_pylist()
        offsets = batch.end_offsets
        if batch.caught_up:
            break
    assert seen == list(range(10))


def _counts(batch):
    return {p: len(run) for p, run in _by_partition(batch).items()}


def test_a_bounded_batch_takes_from_every_partition_with_pending_records(broker, source):
    """librdkafka hands out what it fetched partition by partition: a batch bounded by records shares
    its bound out evenly, so every partition with pending records is in it, and one partition's fewer
    records leave their part to the others. The batches read every record once, in each partition's order."""
    topic = new_topic(broker, "src.share", partitions=3)
    sizes = {0: 900, 1: 600, 2: 40}
    for partition, size in sizes.items():
        produce(broker, topic, records(size, f"p{partition}-"), partition=partition)
    first = source.read_batch(topic, {0: 0, 1: 0, 2: 0}, max_records=500, max_bytes=10**9, poll_timeout_s=10)
    assert _counts(first) == {0: 230, 1: 230, 2: 40}  # 500 shared out: partition 2's 40, then 230 each
    even = source.read_batch(topic, {0: 0, 1: 0, 2: 40}, max_records=301, max_bytes=10**9, poll_timeout_s=10)
    assert _counts(even) == {0: 151, 1: 150}  # 301 shared out exactly: the odd record to the lowest partition
    seen, offsets = {0: [], 1: [], 2: []}, None
    for _ in range(20):
        batch = source.read_batch(topic, offsets, max_records=150, max_bytes=10**9, poll_timeout_s=10,
                                  read_ahead=True)
        counts = _counts(batch)
        pending = {p: high - batch.start_offsets[p] for p, high in batch.high_watermarks.items()
                   if batch.start_offsets[p] < high}
        assert sorted(counts) == sorted(pending) and sum(counts.values()) == min(150, sum(pending.values()))
        assert all(counts[p] >= min(left, 150 // len(pending)) for p, left in pending.items())  # a fair share
        for partition, run in _by_partition(batch).items():
            seen[partition] += run
        offsets = batch.end_offsets
        if batch.caught_up:
            break
    assert seen == {p: list(range(size)) for p, size in sizes.items()}


def test_a_byte_bound_is_shared_out_among_the_partitions(broker, source):
    """A batch bounded by bytes takes about as many bytes from each partition (the record that crosses
    a partition's share included), and the batches read every record once."""
    topic = new_topic(broker, "src.sharebytes", partitions=3)
    for partition, width in enumerate((99, 49, 9)):  # records of 100, 50 and 10 bytes
        produce(broker, topic, [(b"k", b"x" * width) for _ in range(100)], partition=partition)
    batch = source.read_batch(topic, {0: 0, 1: 0, 2: 0}, max_records=10**6, max_bytes=3000, poll_timeout_s=10)
    assert _counts(batch) == {0: 10, 1: 20, 2: 100}  # 1000 bytes each; partition 2's whole 1000
    seen, offsets = [], None
    for _ in range(30):
        batch = source.read_batch(topic, offsets, max_records=10**6, max_bytes=3000, poll_timeout_s=10)
        assert batch.bytes_read <= 3000 + 100 * 3
        seen += [(p, o) for p, run in _by_partition(batch).items() for o in run]
        offsets = batch.end_offsets
        if batch.caught_up:
            break
    assert sorted(seen) == [(p, o) for p in range(3) for o in range(100)]


def test_a_busy_partition_does_not_starve_the_others(broker, source):
    topic = new_topic(broker, "src.busy", partitions=3)
    produce(broker, topic, records(5000, "busy"), partition=0)
    produce(broker, topic, records(3, "b"), partition=1)
    produce(broker, topic, records(2, "c"), partition=2)
    batch = source.read_batch(topic, None, max_records=100, max_bytes=10**9, poll_timeout_s=10)
    assert _counts(batch) == {0: 95, 1: 3, 2: 2}


def test_the_assignment_is_kept_where_a_shared_out_batch_ends(broker, source):
    """Records handed out past a partition's share are kept, not sought back (a seek drops what librdkafka
    fetched ahead): the next batch, starting where this one ends, takes them first and keeps the
    assignment, fetching none of them again."""
    topic = new_topic(broker, "src.sharekeep", partitions=3)
    for partition in range(3):
        produce(broker, topic, records(400, f"p{partition}-"), partition=partition)
    batch = source.read_batch(topic, None, max_records=90, max_bytes=10**9, poll_timeout_s=10)
    assert batch.end_offsets == {0: 30, 1: 30, 2: 30} and _by_partition(batch) == {p: list(range(30)) for p in range(3)}
    consumer = source._consumer
    assert sorted(tp.partition for tp in consumer.assignment()) == [0, 1, 2]
    positions = {tp.partition: tp.offset if tp.offset >= 0 else source._assigned_at[tp.partition]
                 for tp in consumer.position(consumer.assignment())}
    assert all(30 <= position <= 60 for position in positions.values()), positions  # a share kept at most
    unassigned = []
    unassign_all = source._unassign_all
    source._unassign_all = lambda consumer: (unassigned.append(consumer), unassign_all(consumer))
    following = source.read_batch(topic, batch.end_offsets, max_records=90, max_bytes=10**9, poll_timeout_s=10)
    assert unassigned == []  # the assignment went on where the records handed out ended
    assert _by_partition(following) == {p: list(range(30, 60)) for p in range(3)}
    # A read from elsewhere lets the kept records go and reads from where it is asked to.
    again = source.read_batch(topic, batch.end_offsets, max_records=90, max_bytes=10**9, poll_timeout_s=10)
    assert _by_partition(again) == {p: list(range(30, 60)) for p in range(3)}


def test_a_batch_stops_before_until(broker, source):
    """``until`` leaves a partition's later records out (a partition bounded at its start is not read),
    and what it leaves to the others goes to them."""
    topic = new_topic(broker, "src.until", partitions=3)
    for partition in range(3):
        produce(broker, topic, records(50, f"p{partition}-"), partition=partition)
    batch = source.read_batch(topic, None, max_records=60, max_bytes=10**9, poll_timeout_s=10, until={0: 5, 1: 0})
    assert _counts(batch) == {0: 5, 2: 50}
    assert batch.end_offsets == {0: 5, 1: 0, 2: 50} and not batch.caught_up
    rest = source.read_batch(topic, batch.end_offsets, max_records=1000, max_bytes=10**9, poll_timeout_s=10)
    assert _counts(rest) == {0: 45, 1: 50} and rest.caught_up
    assert [o for p, o in zip(rest.records["partition"].to_pylist(), rest.records["offset"].to_pylist(),
                              strict=True) if p == 0] == list(range(5, 50))


class _CountingSource(KafkaSource):
    """A real source whose fetching consumer counts every record it hands out, by (partition, offset)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.handed_out: dict[tuple[int, int], int] = {}

    def _client(self):
        if self._consumer is None:
            handed_out = self.handed_out

            class Counting(Consumer):
                def consume(self, *args, **kwargs):
                    messages = super().consume(*args, **kwargs)
                    for message in messages:
                        if message.error() is None:
                            coordinates = (message.partition(), message.offset())
                            handed_out[coordinates] = handed_out.get(coordinates, 0) + 1
                    return messages

            self._consumer = Counting(dict(self._settings))
        return self._consumer


@pytest.fixture
def counting(broker):
    kafka = _CountingSource({"bootstrap.servers": broker.bootstrap_servers, "group.id": "source-tests"}, retries=1,
                            backoff_s=0.1)
    yield kafka
    kafka.close()


def test_a_cut_batch_s_next_batch_is_read_ahead_from_the_cut_without_fetching_its_records_again(broker, counting):
    """A caller's cut (three records before each batch's end) is applied before the next batch is read
    ahead: that batch starts at the cut, takes the records past it as they were read (not fetched again),
    and is the one the next call gets. The batches hold every record once and count each once."""
    topic = new_topic(broker, "src.cutahead")
    produce(broker, topic, records(100))
    cuts = []

    def three_before_the_end(batch):
        cuts.append(dict(batch.end_offsets))
        return None if batch.caught_up else {0: batch.end_offsets[0] - 3}

    batches, offsets = [], None
    for _ in range(30):
        batch = counting.read_batch(topic, offsets, max_records=20, max_bytes=10**9, poll_timeout_s=10,
                                    read_ahead=True, cut=three_before_the_end)
        batches.append(batch)
        offsets = batch.end_offsets
        if batch.caught_up:
            break
    assert batches[-1].caught_up
    for batch in batches:
        assert _by_partition(batch).get(0, []) == list(range(batch.start_offsets[0], batch.end_offsets[0]))
        assert batch.records_read == batch.records.num_rows
    # Each batch read 20 records (3 of them carried from the batch before) and kept 17.
    assert [b.end_offsets[0] - b.start_offsets[0] for b in batches[:-1]] == [17] * (len(batches) - 1)
    assert [c[0] - b.start_offsets[0] for c, b in zip(cuts[:-1], batches[:-1], strict=True)] == \
        [20] * (len(batches) - 1)
    assert all("read_ahead_s" in b.timings for b in batches[1:])  # every batch after the first was read ahead
    assert sorted(o for b in batches for o in _by_partition(b).get(0, [])) == list(range(100))
    assert sum(b.records_read for b in batches) == 100
    assert counting.handed_out == {(0, o): 1 for o in range(100)}  # no record fetched twice


def test_a_cut_on_several_partitions_loses_and_repeats_nothing(broker, source):
    """With the partitions sharing the bounds, a cut in each partition: the batches from the read ahead
    start exactly at the cuts, and together hold every record once."""
    topic = new_topic(broker, "src.cutparts", partitions=3)
    sizes = {0: 70, 1: 45, 2: 90}
    for partition, size in sizes.items():
        produce(broker, topic, records(size, f"p{partition}-"), partition=partition)

    def half_of_each_partition_s_part(batch):
        return {p: end - (end - batch.start_offsets[p]) // 2 for p, end in batch.end_offsets.items()}

    batches = _drain(source, topic, 24, cut=half_of_each_partition_s_part, most=100)
    assert sorted(_records_of(batches)) == [(p, o) for p, size in sizes.items() for o in range(size)]
    assert sum(b.records_read for b in batches) == sum(sizes.values())
    assert sum("read_ahead_s" in b.timings for b in batches) == len(batches) - 1


def test_a_cut_that_keeps_nothing_reads_on_without_fetching_again(broker, counting):
    """A cut at the batch's start (its caller cannot end it anywhere yet) reads the batch on, bounds
    doubled, from where it ended; the records it read are kept, not fetched again."""
    topic = new_topic(broker, "src.cutnothing")
    produce(broker, topic, records(60))
    asked = []

    def not_before_offset_45(batch):
        asked.append(batch.end_offsets[0])
        return None if batch.end_offsets[0] > 45 else dict(batch.start_offsets)

    batch = counting.read_batch(topic, None, max_records=10, max_bytes=10**9, poll_timeout_s=10, read_ahead=True,
                                cut=not_before_offset_45)
    assert asked == [10, 20, 40, 60]  # 10, then doubled bounds: 20, 40, 80 (the topic's 60)
    assert _by_partition(batch) == {0: list(range(60))} and batch.caught_up and batch.records_read == 60
    assert counting.handed_out == {(0, o): 1 for o in range(60)}


def _transactional_producer(broker, topic):
    """A producer writing in transactions, as Kafka Connect does with ``exactly.once.source.support``."""
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": f"tx-{topic}"})
    producer.init_transactions(30)
    return producer


@pytest.mark.parametrize(("max_records", "until"), [(4, None), (1000, {0: 6})])
def test_a_stop_offset_on_a_transaction_marker_ends_the_batch_at_once(broker, source, max_records, until):
    """A transactional producer's commit marker takes an offset that no record shows: a partition whose
    consumer position passed it is read to its end, also when records follow the marker (a batch stopped
    before them by ``until``, or by a high watermark read while the producer goes on), and the next batch
    starts past it."""
    topic = new_topic(broker, "src.txmarker", partitions=2)
    producer = _transactional_producer(broker, topic)
    for partition, count in ((0, 5), (1, 3), (0, 2)):
        producer.begin_transaction()
        for key, value in records(count, f"p{partition}-"):
            producer.produce(topic, key=key, value=value, partition=partition)
        producer.commit_transaction(30)
    # Partition 0: records 0-4, a marker at 5, records 6-7, a marker at 8; partition 1: records 0-2, a marker at 3.
    started, batches, offsets = time.monotonic(), [], None
    while not batches or not batches[-1].caught_up:
        batches.append(source.read_batch(topic, offsets, max_records, 10**9, poll_timeout_s=10, read_ahead=True,
                                         until=until))
        assert offsets is None or batches[-1].start_offsets == offsets
        offsets = batches[-1].end_offsets
        if until is not None:
            break
    assert time.monotonic() - started < 5  # not the poll timeout (10 s)
    if until is not None:
        # Partitions are read concurrently: only the order within a partition is promised.
        assert offsets == {0: 6, 1: 4}
        assert sorted(_records_of(batches)) == [(0, o) for o in range(5)] + [(1, o) for o in range(3)]
        return
    assert offsets == batches[-1].high_watermarks == {0: 9, 1: 4}
    assert sorted(_records_of(batches)) == [(0, o) for o in [*range(5), 6, 7]] + [(1, o) for o in range(3)]
    again = source.read_batch(topic, offsets, 1000, 10**9, poll_timeout_s=10)
    assert again.records.num_rows == 0 and again.end_offsets == {0: 9, 1: 4}


def test_a_batch_notes_the_records_with_a_key_change_header_wherever_it_is_split(broker, source):
    """Debezium's key-change headers (``__debezium.newkey`` on a key change's delete and tombstone,
    ``__debezium.oldkey`` on its create) are noted by (partition, offset) for the batch that holds the record:
    through bounds shared out, records kept past a share, cuts and batches read ahead."""
    topic = new_topic(broker, "src.keyheaders", partitions=2)
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    marked = set()
    for partition in range(2):
        for offset, (key, value) in enumerate(records(40, f"p{partition}-")):
            headers = [("__debezium.context.taskId", b"0")]
            if offset % 7 == partition:
                headers.append(("__debezium.newkey" if offset % 2 else "__debezium.oldkey", key))
                marked.add((partition, offset))
            producer.produce(topic, key=key, value=value, partition=partition, headers=headers)
    assert producer.flush(30) == 0

    def two_thirds(batch):
        return {p: end - (end - batch.start_offsets[p]) // 3 for p, end in batch.end_offsets.items()}

    batches = _drain(source, topic, 15, cut=two_thirds)
    assert sorted(_records_of(batches)) == [(p, o) for p in range(2) for o in range(40)]
    for batch in batches:
        assert batch.key_change_halves == {(p, o) for p, o in marked
                                           if batch.start_offsets[p] <= o < batch.end_offsets[p]}
