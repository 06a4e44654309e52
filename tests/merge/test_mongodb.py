"""MongoDB documents rebuilt from reads, patches and deletes (seed 002 formats) and change streams' update
descriptions (Debezium's documentation), on real parts."""

import json
from datetime import datetime, timezone
from decimal import Decimal

import pytest

from cdc_assets.merge import BadEventError
from tests.support.key_changes import scd2_versions
from tests.support.merges import captured_table, read_rows, run_batch, with_merge
from tests.support.topics import new_topic, produce

ID = json.dumps({"$numberLong": "1004"})
KEY = json.dumps({"id": ID}).encode()
AFTER = ('{"_id" : {"$numberLong" : "1004"},"first_name" : "Anne","last_name" : "Kretchmar",'
         '"email" : "annek@noanswer.org"}')


def mongo_event(op, ord_, after=None, patch=None, doc_id=ID, ts=1558965508000, description=None):
    payload = {"op": op, "ts_ms": ts + 7, "source": {"version": "1.1.2.Final", "connector": "mongodb",
                                                    "name": "fulfillment", "ts_ms": ts, "snapshot": op == "r",
                                                    "db": "inventory", "rs": "rs0", "collection": "customers",
                                                    "ord": ord_, "h": 1546547425148721999}}
    if after is not None:
        payload["after"] = after
    if patch is not None:
        payload["patch"] = patch
    if description is not None:  # change streams (Debezium 2.x and later): no patch, no filter
        payload["updateDescription"] = {"removedFields": None, "updatedFields": None, "truncatedArrays": None,
                                        **description}
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
    # MongoDB refuses a field inside a string ("Cannot create field"): the stored document is not the source's.
    (mongo_event("u", 2, patch='{"$set":{"email.domain":"x.org"}}'),
     "'email' holds \"annek@noanswer.org\", not a document or an array .MongoDB would have refused"),
    (mongo_event("u", 2, patch='{"$v":3,"diff":{"u":{"email":"a@b.c"}}}'), r"patch has oplog version \$v 3"),
    (mongo_event("u", 2, patch='{"$v":2,"$set":{"email":"a@b.c"}}'), r"an oplog diff \(\$v 2\) without a diff"),
    (mongo_event("u", 2, patch='{"$v":2,"diff":{"sname":{"u":{"x":1}}}}'), "a sub-diff of 'name', which the stored"),
    (mongo_event("u", 2, patch='{"$inc":{"visits":1}}'), r"patch operator\(s\) \$inc not supported"),
    (mongo_event("u", 2, description={"updatedFields": "{oops"}),
     "updateDescription.updatedFields is not a valid JSON object"),
    (mongo_event("u", 2, description={"truncatedArrays": [{"field": "email", "size": 0}]}),
     "truncatedArrays names 'email', which holds no array"),
    (mongo_event("c", 2, after="[1, 2"), "after is not a valid JSON document"),
    (mongo_event("u", 2), "op 'u' has no after image"),
])
def test_unreadable_mongodb_events_are_reported(spark, broker, writer, tmp_path, value, reason):
    topic = new_topic(broker, "fulfillment.inventory.bad")
    produce(broker, topic, [(KEY, mongo_event("c", 1, after=AFTER)), (KEY, value)])
    with pytest.raises(BadEventError, match=rf"offset 1: .*{reason}"):
        run_batch(spark, broker, writer, captured_table(topic, tmp_path, kind="mongodb"))


NESTED = json.dumps({"_id": {"$numberLong": "1004"}, "name": "Anne",
                     "address": {"city": "Oslo", "zip": "0150", "geo": {"lat": 59.9, "lon": 10.7}},
                     "orders": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": {"$numberLong": "2"}}],
                     "tags": ["x", "y", "z"]})


def test_nested_patches_apply_to_the_stored_document_in_position_order(spark, broker, writer, tmp_path):
    """The seed's patch format on nested paths and array indexes, and MongoDB 5.0's oplog diff, across batches:
    what is in Delta is patched, and a batch's patches of one key apply in position order, not offset order."""
    topic = new_topic(broker, "fulfillment.inventory.nested", partitions=1)
    table = captured_table(topic, tmp_path, kind="mongodb")
    produce(broker, topic, [(KEY, mongo_event("r", 1, after=NESTED))])
    run_batch(spark, broker, writer, table)
    produce(broker, topic, [
        (KEY, mongo_event("u", 3, patch='{"$set":{"address.geo.lat":60.0,"orders.1.qty":{"$numberLong":"5"}}}')),
        # Earlier at the source (ord 2), later in the topic: applied first.
        (KEY, mongo_event("u", 2, patch='{"$set":{"address.city":"Bergen"},"$unset":{"address.zip":true}}')),
        (KEY, mongo_event("u", 4, patch='{"$v":1,"$set":{"prefs.mail.weekly":true,"orders.3":{"sku":"d"}}}')),
        (KEY, mongo_event("u", 5, patch='{"$unset":{"tags.1":true,"nothing.here":true,"orders.9.qty":true}}')),
        # MongoDB 5.0's oplog diff: a field deleted, one updated in a sub-document, an array cut to 2 elements
        # of which the second is diffed, one inserted (last).
        (KEY, mongo_event("u", 6, patch='{"$v":2,"diff":{"d":{"name":false},"saddress":{"u":{"city":"Molde"}},'
                                        '"sorders":{"a":true,"l":2,"s1":{"u":{"sku":"B"}}},"i":{"seen":1}}}')),
    ])
    run_batch(spark, broker, writer, table)
    text = read_rows(spark, writer, table)[(ID,)]["document"]
    assert json.loads(text) == {
        "_id": {"$numberLong": "1004"},
        "address": {"city": "Molde", "geo": {"lat": 60.0, "lon": 10.7}},
        "orders": [{"sku": "a", "qty": 1}, {"sku": "B", "qty": {"$numberLong": "5"}}],
        "tags": ["x", None, "z"], "prefs": {"mail": {"weekly": True}}, "seen": 1}
    assert list(json.loads(text)) == ["_id", "address", "orders", "tags", "prefs", "seen"]  # MongoDB's order


# Debezium's documentation (connectors/mongodb.adoc, "Change streams capture mode"): an update event of the
# customers collection with capture.mode change_streams_update_full_with_pre_image; under plain
# change_streams the same event carries no before and no after.
DOC_BEFORE = ('{"_id": {"$numberLong": "1004"},"first_name": "unknown","last_name": "Kretchmar",'
              '"email": "annek@noanswer.org"}')
DOC_AFTER = DOC_BEFORE.replace('"unknown"', '"Anne Marie"')


def change_stream_event(ord_, after=None, before=None, **description):
    value = json.loads(mongo_event("u", ord_, description=description))
    value["payload"].pop("filter")
    value["payload"].update({key: image for key, image in (("before", before), ("after", after)) if image})
    value["schema"] = CHANGE_STREAM_SCHEMA
    return json.dumps(value).encode()


# The value schema of a change-streams update (MongoDbSchema: updateDescription's struct), trimmed of source.
CHANGE_STREAM_SCHEMA = {"type": "struct", "name": "fulfillment.inventory.customers.Envelope", "optional": False,
                        "fields": [
    {"field": "before", "type": "string", "optional": True, "name": "io.debezium.data.Json", "version": 1},
    {"field": "after", "type": "string", "optional": True, "name": "io.debezium.data.Json", "version": 1},
    {"field": "updateDescription", "type": "struct", "optional": True,
     "name": "io.debezium.connector.mongodb.changestream.updatedescription", "version": 1, "fields": [
         {"field": "removedFields", "type": "array", "items": {"type": "string", "optional": False}, "optional": True},
         {"field": "updatedFields", "type": "string", "optional": True, "name": "io.debezium.data.Json",
          "version": 1},
         {"field": "truncatedArrays", "type": "array", "optional": True, "items": {
             "type": "struct", "optional": False, "name": "io.debezium.connector.mongodb.changestream.truncatedarray",
             "version": 1, "fields": [{"field": "field", "type": "string", "optional": False},
                                      {"field": "size", "type": "int32", "optional": False}]}}]},
    {"field": "op", "type": "string", "optional": True}]}


@pytest.mark.parametrize("mode", ["scd1", "soft_delete"])
def test_change_streams_update_descriptions_apply_as_patches(spark, broker, writer, tmp_path, mode):
    """capture.mode change_streams: updates carry updateDescription (updatedFields as JSON text, with dotted
    paths; removedFields; truncatedArrays) and no after; with full documents, after wins."""
    topic = new_topic(broker, "fulfillment.inventory.customers")
    table = with_merge(captured_table(topic, tmp_path, kind="mongodb"), apply_mode=mode)
    produce(broker, topic, [(KEY, mongo_event("c", 1, after=DOC_BEFORE))])
    run_batch(spark, broker, writer, table)
    produce(broker, topic, [
        (KEY, change_stream_event(2, updatedFields='{"first_name": "Anne Marie"}')),
        (KEY, change_stream_event(3, updatedFields='{"phones": [{"n": "1"}, {"n": "2"}, {"n": "3"}], '
                                                   '"visits": {"$numberLong": "7"}}')),
        (KEY, change_stream_event(4, updatedFields='{"phones.0.n": "0", "created": {"$date": '
                                                   '"2024-08-13T06:56:12.582Z"}}',
                                  removedFields=["email"], truncatedArrays=[{"field": "phones", "size": 2}])),
    ])
    run_batch(spark, broker, writer, table)
    assert document(read_rows(spark, writer, table)) == {
        "_id": {"$numberLong": "1004"}, "first_name": "Anne Marie", "last_name": "Kretchmar",
        "phones": [{"n": "0"}, {"n": "2"}], "visits": {"$numberLong": "7"},
        "created": {"$date": "2024-08-13T06:56:12.582Z"}}
    # change_streams_update_full(_with_pre_image): the documentation's own event; its after replaces the document.
    produce(broker, topic, [(KEY, change_stream_event(5, after=DOC_AFTER, before=DOC_BEFORE,
                                                      updatedFields='{"first_name": "Anne Marie"}'))])
    run_batch(spark, broker, writer, table)
    assert document(read_rows(spark, writer, table)) == json.loads(DOC_AFTER)


def test_scd2_keeps_each_documents_versions(spark, broker, writer, tmp_path):
    topic = new_topic(broker, "fulfillment.inventory.versions", partitions=1)
    table = with_merge(captured_table(topic, tmp_path, kind="mongodb"), apply_mode="scd2")
    doc = {"_id": {"$numberLong": "1004"}, "a": {"b": 1}}
    produce(broker, topic, [(KEY, mongo_event("c", 1, after=json.dumps(doc))),
                            (KEY, mongo_event("u", 2, patch='{"$set":{"a.c":2}}'))])
    run_batch(spark, broker, writer, table)
    produce(broker, topic, [
        (KEY, change_stream_event(4, removedFields=["a.b"])),
        # Older than what the table holds (an earlier second at the source): changes nothing.
        (KEY, mongo_event("u", 9, patch='{"$set":{"late":true}}', ts=1558965507000)),
        (KEY, mongo_event("d", 5)), (KEY, None),
        (KEY, mongo_event("c", 6, after=json.dumps({"_id": doc["_id"], "again": 1}))),
    ])
    run_batch(spark, broker, writer, table)
    [versions] = scd2_versions(spark, writer, table).values()
    assert [(json.loads(v["document"]), v["_cdc_current"]) for v in versions] == [
        (doc, False), ({**doc, "a": {"b": 1, "c": 2}}, False), ({**doc, "a": {"c": 2}}, False),
        ({"_id": doc["_id"], "again": 1}, True)]
    starts = [v["_cdc_valid_from"] for v in versions]
    ends = [v["_cdc_valid_to"] for v in versions]
    assert starts == sorted(starts) and ends[:2] == starts[1:3] and ends[2] < starts[3] and ends[3] is None


def test_document_fields_are_typed_columns_beside_the_document(spark, broker, writer, tmp_path):
    topic = new_topic(broker, "fulfillment.inventory.orders")
    fields = (("status", "string"), ("qty", "bigint"), ("total", "decimal(10,2)"), ("placed", "timestamp"),
              ("missing", "boolean"))
    table = with_merge(captured_table(topic, tmp_path, kind="mongodb"), document_fields=fields)
    order = {"_id": {"$numberLong": "1004"}, "status": "new", "qty": {"$numberLong": "3"},
             "total": {"$numberDecimal": "12.50"}, "placed": {"$date": 1558965508000}}
    produce(broker, topic, [(KEY, mongo_event("c", 1, after=json.dumps(order))),
                            (KEY, change_stream_event(2, updatedFields='{"status": "paid", "qty": 4}'))])
    run_batch(spark, broker, writer, table)
    row = read_rows(spark, writer, table)[(ID,)]
    placed = row["placed"]
    assert {name: row[name] for name, _ in fields} | {"placed": placed.replace(tzinfo=placed.tzinfo or timezone.utc)} \
        == {"status": "paid", "qty": 4, "total": Decimal("12.50"),
            "placed": datetime(2019, 5, 27, 13, 58, 28, tzinfo=timezone.utc), "missing": None}
    orders = spark.read.format("delta").load(table.target.path)
    assert [tuple(r) for r in orders.where("status = 'paid'").select("status", "qty").collect()] == [("paid", 4)]

    # updatedFields in the connector's default (legacy) mode are relaxed extended JSON, where after is strict
    # (Debezium's JsonSerializationModeIT): a date as ISO text, a long as a plain number.
    produce(broker, topic, [(KEY, change_stream_event(3, updatedFields='{"placed": {"$date": '
                                                                      '"2019-05-27T14:00:00.5Z"}, "qty": 123}'))])
    run_batch(spark, broker, writer, table)
    row = read_rows(spark, writer, table)[(ID,)]
    assert row["qty"] == 123 and row["placed"].replace(tzinfo=None) == datetime(2019, 5, 27, 14, 0, 0, 500000)

    produce(broker, topic, [(KEY, change_stream_event(4, updatedFields='{"qty": "three"}'))])
    with pytest.raises(BadEventError, match="offset 3: document field 'qty' value does not fit type bigint"):
        run_batch(spark, broker, writer, table)
