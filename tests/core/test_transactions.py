"""Where a batch that can apply nothing reads its first transaction whole (``core.transactions.read_on``)."""

from cdc_assets.core.transactions import cut_batch, exact_horizon, read_on

START = {0: 0, 1: 0, 2: 0}


def blocked(end, stop, seen, ends):
    """``read_on`` for a batch from ``START`` read up to ``end``, its ENDs given as (offset, events of s.a)."""
    collections = {tx: (offset, {"db.s.a": count}) for tx, (offset, count) in ends.items()}
    cut = cut_batch("s.a", START, end, seen, collections, {})
    assert cut.end_offsets == START  # nothing applicable
    return read_on(cut, START, end, stop, seen, collections)


def test_later_transactions_are_left_out_and_the_partition_holding_the_rest_is_read_on():
    """Transaction 1 (8 events) has 4 of them read in partition 0, whose stop is further on, and one
    each in partitions 1 and 2, followed there by transaction 2's: a batch stopped at transaction 2's
    first events in 1 and 2 leaves partition 0 the room they took."""
    seen = {"1": (6, {0: 0, 1: 0, 2: 0}), "2": (6, {1: 1, 2: 1})}
    found = blocked({0: 4, 1: 4, 2: 4}, {0: 20, 1: 20, 2: 20}, seen, {"1": (5, 8), "2": (9, 6)})
    assert (found.transaction, found.seen, found.expected) == ("1", 6, 8)
    assert found.until == {0: 20, 1: 1, 2: 1} and found.open == (0,) and found.helps


def test_a_partition_that_starts_with_a_later_transaction_is_not_read():
    """Partition 2 starts with transaction 2, committed after transaction 1 (its END is later): none of
    transaction 1 is there."""
    seen = {"1": (3, {0: 0, 1: 0}), "2": (2, {2: 0})}
    found = blocked({0: 2, 1: 1, 2: 2}, {0: 9, 1: 1, 2: 9}, seen, {"1": (3, 5), "2": (6, 4)})
    assert found.transaction == "1" and found.until == {0: 9, 1: 1, 2: 0} and found.helps


def test_a_transaction_that_fills_the_batch_alone_does_not_fit():
    """Nothing of a later transaction read, partition 0 stopped by the limits: reading again changes
    nothing (``helps`` False), the transaction does not fit."""
    found = blocked({0: 7, 1: 0, 2: 0}, {0: 12, 1: 0, 2: 0}, {"1": (5, {0: 0})}, {"1": (3, 6)})
    assert found.open == (0,) and not found.helps and found.until == {0: 12, 1: 0, 2: 0}


def test_reads_again_stop_no_later_than_the_read_before():
    """A read again bounded by ``until`` that still misses events: its bounds are the next read's, so
    each read again stops earlier in some partition or is the last."""
    seen = {"1": (4, {0: 0, 1: 0}), "2": (1, {1: 2})}
    found = blocked({0: 3, 1: 3, 2: 0}, {0: 3, 1: 5, 2: 0}, seen, {"1": (3, 6), "2": (7, 1)})
    assert found.until == {0: 3, 1: 2, 2: 0} and found.open == () and not found.helps


def test_a_first_transaction_without_a_known_end_waits():
    """Partition 1 starts with transaction 2 whose END is not in the log: it may have committed first."""
    seen = {"1": (2, {0: 0}), "2": (2, {1: 0})}
    collections = {"1": (3, {"s.a": 5})}
    cut = cut_batch("s.a", START, {0: 2, 1: 2, 2: 0}, seen, collections, {})
    assert read_on(cut, START, {0: 2, 1: 2, 2: 0}, {0: 9, 1: 9, 2: 0}, seen, collections) is None


def test_a_whole_transaction_behind_a_cut_in_one_partition_is_not_applied_in_another():
    """Transaction 2 is whole, but in partition 1 it comes after transaction 1, which waits: applying
    its events in partition 0 would leave it half applied, so partition 0 is cut before it too."""
    seen = {"1": (1, {1: 0}), "2": (2, {0: 0, 1: 1}), "3": (1, {2: 0})}
    cut = cut_batch("s.a", START, {0: 1, 1: 2, 2: 1}, seen, {"1": (1, {"s.a": 2}), "2": (2, {"s.a": 2}),
                                                            "3": (3, {"s.a": 1})}, {})
    assert cut.end_offsets == {0: 0, 1: 0, 2: 1}
    assert cut.applied == ("3",) and list(cut.waiting) == ["1"]
    # The table then holds transaction 3 without 1: exact at no commit position, not up to 3's.
    ends = {"1": (1, {"s.a": 2}), "2": (2, {"s.a": 2}), "3": (3, {"s.a": 1})}
    assert exact_horizon(3, 9, cut, ends) == 0 < 3
    # Once nothing committed earlier waits, the horizon is the log's.
    later = cut_batch("s.a", START, {0: 0, 1: 0, 2: 1}, {"3": (1, {2: 0})}, ends, {})
    assert exact_horizon(3, 9, later, ends) == 9


def test_a_transaction_applied_before_and_delivered_again_in_part_is_not_waited_for():
    """Transaction 1 (3 events) was applied with events in partition 1 (``applied_in``); a restarted connector
    delivered 2 of them again, ahead of transaction 2: nothing waits for the rest of 1, and 2 is applied. A
    partition that has applied only earlier transactions proves nothing: there it would wait."""
    seen = {"1": (2, {1: 0}), "2": (2, {0: 0, 1: 2})}
    ends = {"1": (5, {"s.a": 3}), "2": (7, {"s.a": 2})}
    cut = cut_batch("s.a", START, {0: 1, 1: 3, 2: 0}, seen, ends, {0: 3, 1: 5})
    assert cut.again == ("1",) and cut.applied == ("2",) and cut.waiting == {}
    assert cut.end_offsets == {0: 1, 1: 3, 2: 0}
    held = cut_batch("s.a", START, {0: 1, 1: 3, 2: 0}, seen, ends, {0: 3, 1: 4})
    assert held.again == () and held.waiting == {"1": (2, 3)} and held.end_offsets == {0: 0, 1: 0, 2: 0}


def test_events_delivered_again_do_not_bound_the_read_on_of_the_first_transaction():
    """Transaction 2 (6 events) has 2 read in partition 0 and 1 in partition 1, where transaction 1, applied
    before, comes again after it: the read on stops before transaction 3 in partition 1, not before 1's events."""
    seen = {"1": (1, {1: 1}), "2": (3, {0: 0, 1: 0}), "3": (1, {1: 2})}
    ends = {"1": (4, {"s.a": 2}), "2": (6, {"s.a": 6}), "3": (8, {"s.a": 1})}
    cut = cut_batch("s.a", START, {0: 2, 1: 3, 2: 0}, seen, ends, {1: 4})
    assert cut.end_offsets == START and cut.again == ("1",)
    found = read_on(cut, START, {0: 2, 1: 3, 2: 0}, {0: 9, 1: 9, 2: 0}, seen, ends)
    assert found is not None and found.transaction == "2" and found.until == {0: 9, 1: 2, 2: 0}
