"""MongoDB documents rebuilt from reads, patches and deletes (seed 002 formats), on real parts."""

import json

import pytest

from cdc_assets.merge import BadEventError
from tests.support.merges import captured_table, read_rows, run_batch
from tests.support.topics import new_topic, produce

ID = json.dumps({"$numberLong": "1004"})
KEY = json.dumps({"id": ID}).encode()
AFTER = ('{"_id" : {"$numberLong" : "1004"},"first_name" : "Anne","last_name" : "Kretchmar",'
         '"email" : "annek@noanswer.org"}')


def mongo_event(op, ord_, after=None, patch=None, doc_id=ID, ts=1558965508000):
    payload = {"op": op, "ts_ms": ts + 7, "source": {"version": "1.1.2.Final", "connector": "mongodb",
                                                    "name": "fulfillment", "ts_ms": ts, "snapshot": op == "r",
                                                    "db": "inventory", "rs": "rs0", "collection": "customers",
                                                    "ord": ord_, "h": 1546547425148721999}}
    if after is not None:
        payload["after"] = after
    if patch is not None:
        payload["patch"] = patch
    if op in ("u", "d"):
        payload["filter"] = json.dumps({"_id": json.loads(doc_id)})
    return json.dumps({"schema": {"type": "struct"}, "payload": payload}).encode()


def document(rows, doc_id=ID):
    row = rows.get((doc_id,))
    return None if row is None or row["document"] is None else json.loads(row["document"])


def test_seed_read_patch_delete_across_batches(spark, broker, writer, tmp_path):
    topic = new_topic(broker, "fulfillment.inventory.customers")
    table = captured_table(topic, tmp_path, kind="mongodb")
    produce(broker, topic, [(KEY, mongo_event("r", 31, after=AFTER))])
    run_batch(spark, broker, writer, table)
    assert document(read_rows(spark, writer, table))["first_name"] == "Anne"

    # The seed's update: a $set patch, applied to the document already in Delta.
    produce(broker, topic, [(KEY, mongo_event("u", 32, patch='{"$set":{"first_name":"Anne Marie"}}')),
                            (KEY, mongo_event("u", 33, patch='{"$unset":{"email":true}}'))])
    run_batch(spark, broker, writer, table)
    assert document(read_rows(spark, writer, table)) == {
        "_id": {"$numberLong": "1004"}, "first_name": "Anne Marie", "last_name": "Kretchmar"}

    produce(broker, topic, [(KEY, mongo_event("d", 34)), (KEY, None)])
    report = run_batch(spark, broker, writer, table)
    assert read_rows(spark, writer, table) == {} and report.outcome.deleted == 1


def test_patches_within_one_batch_and_replacement_documents(spark, broker, writer, tmp_path):
    topic = new_topic(broker, "fulfillment.inventory.people")
    other = json.dumps({"$oid": "5f1e0c3a9b1e8a0001a1b2c3"})
    other_key = json.dumps({"id": other}).encode()
    produce(broker, topic, [
        (KEY, mongo_event("c", 1, after=AFTER)),
        (KEY, mongo_event("u", 2, patch='{"$set":{"visits":{"$numberLong":"3"},"tags":["a","b"]}}')),
        (KEY, mongo_event("u", 3, patch='{"$set":{"first_name":"A."}}')),
        (other_key, mongo_event("c", 4, after=json.dumps({"_id": json.loads(other), "n": 1}), doc_id=other)),
        (other_key, mongo_event("u", 5, patch=json.dumps({"_id": json.loads(other), "n": 2, "fresh": True}),
                                doc_id=other)),
    ])
    table = captured_table(topic, tmp_path, kind="mongodb")
    run_batch(spark, broker, writer, table)
    rows = read_rows(spark, writer, table)
    assert document(rows) == {"_id": {"$numberLong": "1004"}, "first_name": "A.", "last_name": "Kretchmar",
                              "email": "annek@noanswer.org", "visits": {"$numberLong": "3"}, "tags": ["a", "b"]}
    assert document(rows, other) == {"_id": {"$oid": "5f1e0c3a9b1e8a0001a1b2c3"}, "n": 2, "fresh": True}


def test_a_patch_for_a_document_never_seen_is_a_bad_event(spark, broker, writer, tmp_path):
    topic = new_topic(broker, "fulfillment.inventory.orphans")
    produce(broker, topic, [(KEY, mongo_event("u", 9, patch='{"$set":{"first_name":"Ghost"}}'))])
    table = captured_table(topic, tmp_path, kind="mongodb")
    with pytest.raises(BadEventError, match=rf"{topic} partition 0 offset 0: op 'u' patches a document never seen"):
        run_batch(spark, broker, writer, table)


@pytest.mark.parametrize(("value", "reason"), [
    (mongo_event("u", 2, patch="{not json"), "patch is not a valid JSON object"),
    (mongo_event("u", 2, patch='{"$set":{"address.city":"Oslo"}}'), "changes a nested path"),
    (mongo_event("c", 2, after="[1, 2"), "after is not a valid JSON document"),
    (mongo_event("u", 2), "op 'u' has no after image"),
])
def test_unreadable_mongodb_events_are_reported(spark, broker, writer, tmp_path, value, reason):
    topic = new_topic(broker, "fulfillment.inventory.bad")
    produce(broker, topic, [(KEY, mongo_event("c", 1, after=AFTER)), (KEY, value)])
    with pytest.raises(BadEventError, match=rf"offset 1: .*{reason}"):
        run_batch(spark, broker, writer, captured_table(topic, tmp_path, kind="mongodb"))
