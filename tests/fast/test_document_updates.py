"""MongoDB's update rules on documents (``core.document_updates``), on the examples of MongoDB's manual."""

import json

import pytest

from cdc_assets.core.document_updates import ORPHAN_REASON, UpdateConflict, apply_update, replay


def updated(document, update):
    document = json.loads(json.dumps(document))
    apply_update(document, update)
    return document


# The products document of MongoDB's $set and $unset manual pages.
PRODUCT = {"_id": 100, "quantity": 250, "instock": True, "reorder": False,
           "details": {"model": "14QQ", "make": "Clothes Corp"}, "tags": ["apparel", "clothing"],
           "ratings": [{"by": "Customer007", "rating": 4}]}


def test_set_on_top_level_nested_and_array_paths_as_the_manual_shows():
    assert updated(PRODUCT, {"$set": {"quantity": 500, "details": {"model": "2600", "make": "Fashionaires"},
                                      "tags": ["coats", "outerwear", "clothing"]}}) == {
        **PRODUCT, "quantity": 500, "details": {"model": "2600", "make": "Fashionaires"},
        "tags": ["coats", "outerwear", "clothing"]}
    assert updated(PRODUCT, {"$set": {"details.make": "Kustom Kidz"}})["details"] == {
        "model": "14QQ", "make": "Kustom Kidz"}
    after = updated(PRODUCT, {"$set": {"tags.1": "rain gear", "ratings.0.rating": 2}})
    assert after["tags"] == ["apparel", "rain gear"] and after["ratings"] == [{"by": "Customer007", "rating": 2}]


def test_set_creates_missing_parents_as_documents_and_pads_arrays_with_nulls():
    assert updated({"_id": 1}, {"$set": {"a.b.c": 1}}) == {"_id": 1, "a": {"b": {"c": 1}}}
    # A numeric part of a missing parent is a field name: MongoDB creates documents, never arrays.
    assert updated({"_id": 1}, {"$set": {"a.0.b": 1}}) == {"_id": 1, "a": {"0": {"b": 1}}}
    assert updated({"_id": 1, "a": [1]}, {"$set": {"a.3": 4}}) == {"_id": 1, "a": [1, None, None, 4]}
    assert updated({"_id": 1, "a": [1]}, {"$set": {"a.2.x": 4}}) == {"_id": 1, "a": [1, None, {"x": 4}]}
    # A new field goes last; a field set again keeps its place.
    assert list(updated({"_id": 1, "a": 1, "b": 2}, {"$set": {"c": 3, "a": 0}})) == ["_id", "a", "b", "c"]


def test_unset_removes_fields_nulls_array_elements_and_ignores_missing_paths():
    assert updated(PRODUCT, {"$unset": {"quantity": "", "instock": ""}}) == {
        k: v for k, v in PRODUCT.items() if k not in ("quantity", "instock")}
    assert updated(PRODUCT, {"$unset": {"details.make": ""}})["details"] == {"model": "14QQ"}
    assert updated(PRODUCT, {"$unset": {"tags.0": ""}})["tags"] == [None, "clothing"]
    for missing in ("nope", "nope.deeper", "details.nope", "tags.7", "tags.x", "quantity.x", "ratings.0.nope"):
        assert updated(PRODUCT, {"$unset": {missing: ""}}) == PRODUCT
    assert updated(PRODUCT, {"$unset": ["details.model", "tags"]}) == {  # removedFields: a list
        **{k: v for k, v in PRODUCT.items() if k != "tags"}, "details": {"make": "Clothes Corp"}}


def test_truncated_arrays_then_removed_then_updated_fields():
    document = {"_id": 1, "a": [1, 2, 3, 4], "b": {"c": [5, 6]}, "d": 0}
    update = {"$truncate": [{"field": "a", "size": 2}, {"field": "b.c", "size": 0}], "$unset": ["d"],
              "$set": {"a.1": 9, "e": {"$date": "2024-08-13T06:56:12.582Z"}}}
    assert updated(document, update) == {"_id": 1, "a": [1, 9], "b": {"c": []},
                                         "e": {"$date": "2024-08-13T06:56:12.582Z"}}


@pytest.mark.parametrize(("document", "update", "problem"), [
    ({"a": 1}, {"$set": {"a.b": 2}}, "'a' holds 1, not a document or an array"),
    ({"a": [1]}, {"$set": {"a.x": 2}}, "'x' is not an index of the array at 'a'"),
    ({"a": [None]}, {"$set": {"a.0.b": 2}}, "'a.0' holds null"),
    ({"q": {"$numberLong": "5"}}, {"$set": {"q.x": 2}}, "'q' holds"),  # an extended-JSON value is not a document
    ({"a": {"b": 1}}, {"$truncate": [{"field": "a", "size": 0}]}, "holds no array"),
])
def test_updates_mongodb_would_refuse_are_conflicts(document, update, problem):
    with pytest.raises(UpdateConflict, match=problem):
        updated(document, update)


def test_replay_applies_a_keys_events_in_order_and_names_the_ones_it_cannot_apply():
    def event(op, document=None, patch=None):
        return {"op": op, "document": None if document is None else json.dumps(document),
                "patch": None if patch is None else json.dumps(patch)}

    out = replay(None, [
        event("u", patch={"$set": {"a": 1}}),  # never seen
        event("c", {"_id": 1, "a": {"b": 1}}),
        event("u", patch={"$set": {"a.b.c": 1}}),  # refused by MongoDB: the document stays
        event("u", patch={"$set": {"a.c": 2}, "$unset": {"a.b": True}}),
        event("u", patch={"_id": 1, "z": 0}),  # a replacement
        event("d"),
        event("u", patch={"$unset": {"z": True}}),  # after the delete: never seen again
    ])
    texts = [None if text is None else json.loads(text) for text, _ in out]
    assert texts == [None, {"_id": 1, "a": {"b": 1}}, {"_id": 1, "a": {"b": 1}}, {"_id": 1, "a": {"c": 2}},
                     {"_id": 1, "z": 0}, None, None]
    problems = [problem for _, problem in out]
    assert problems[0] == problems[6] == ORPHAN_REASON and "MongoDB would have refused" in problems[2]
    assert problems[1] is problems[3] is problems[4] is problems[5] is None
    # Replayed onto the document the table holds.
    assert json.loads(replay('{"_id":1,"n":{"k":[1]}}', [event("u", patch={"$set": {"n.k.1": 2}})])[0][0]) == {
        "_id": 1, "n": {"k": [1, 2]}}


# MongoDB 5.0's oplog (``$v: 2``): pre-image, the entry's diff and the document after it, as MongoDB's own test
# of its update oplog entries (jstests/replsets/oplog_format.js) asserts them.
MONGODB_OPLOG_FORMAT = [
    ({"_id": 1, "a": 2}, {"u": {"a": 3}, "i": {"b": 2}}, {"_id": 1, "a": 3, "b": 2}),
    ({"_id": 1, "c": 0}, {"i": {"a": 1, "b": 2}}, {"_id": 1, "c": 0, "a": 1, "b": 2}),
    ({"_id": 1, "a": {"b": [1, 2], "c": [1, 2]}}, {"sa": {"u": {"b": [1], "c": [1]}}},
     {"_id": 1, "a": {"b": [1], "c": [1]}}),
    ({"_id": 1, "a": 1, "b": 1}, {"u": {"a": 2, "b": 2}}, {"_id": 1, "a": 2, "b": 2}),
    ({"_id": 1, "a": [2]}, {"sa": {"a": True, "u0": 3}}, {"_id": 1, "a": [3]}),
    ({"_id": 1, "a": "foo"}, {"i": {"c": [18]}}, {"_id": 1, "a": "foo", "c": [18]}),
    ({"_id": 1, "a": {"b": [18]}}, {"sa": {"u": {"b": [1, 2]}}}, {"_id": 1, "a": {"b": [1, 2]}}),
    ({"_id": 1, "a": [{"b": 2}, {"b": 1}]}, {"u": {"a": [{"b": 1}, {"b": 2}]}}, {"_id": 1, "a": [{"b": 1}, {"b": 2}]}),
]


@pytest.mark.parametrize(("document", "diff", "after"), MONGODB_OPLOG_FORMAT)
def test_oplog_diffs_apply_as_in_mongodb_s_own_oplog_tests(document, diff, after):
    assert json.dumps(updated(document, {"$v": 2, "diff": diff})) == json.dumps(after)  # the fields' order too


def test_oplog_diffs_delete_insert_resize_pad_and_recurse_as_mongodb_s_diff_applier():
    """The rules of MongoDB's ``document_diff_applier``: a deleted field goes, an inserted one goes last (moved
    there if it was present), an updated one stays in place (last if it was absent); an array diff resizes to
    ``l``, replaces (``uN``) or recurses (``sN``) into elements, and pads the indexes it skips with nulls."""
    document = {"_id": 1, "a": 1, "b": {"c": [1, {"d": 2}, 3], "e": 0}, "f": 2, "g": [9, 8]}
    diff = {"d": {"a": False, "nope": False}, "u": {"f": 3, "new": 4}, "i": {"b2": 5, "g": [7]},
            "sb": {"sc": {"a": True, "l": 2, "s1": {"u": {"d": 20}, "i": {"x": 1}}}, "d": {"e": False}}}
    assert json.dumps(updated(document, {"$v": 2, "diff": diff})) == json.dumps(
        {"_id": 1, "b": {"c": [1, {"d": 20, "x": 1}]}, "f": 3, "new": 4, "b2": 5, "g": [7]})
    assert updated({"l": [1]}, {"$v": 2, "diff": {"sl": {"a": True, "u3": 4}}}) == {"l": [1, None, None, 4]}
    assert updated({"l": [1]}, {"$v": 2, "diff": {"sl": {"a": True, "l": 3}}}) == {"l": [1, None, None]}
    assert updated({"l": [[1, 2]]}, {"$v": 2, "diff": {"sl": {"a": True, "s0": {"a": True, "l": 1}}}}) == {"l": [[1]]}
    assert updated({"a": 1}, {"$v": 2, "diff": {}}) == {"a": 1}


@pytest.mark.parametrize(("document", "diff", "problem"), [
    ({"a": 1}, {"sb": {"u": {"c": 1}}}, "a sub-diff of 'b', which the stored document does not have"),
    ({"a": 1}, {"sa": {"u": {"c": 1}}}, "a document diff of 'a', which holds 1"),
    ({"a": {"b": 1}}, {"sa": {"a": True, "u0": 1}}, "an array diff of 'a'"),
    ({"a": [1]}, {"sa": {"a": True, "s2": {"u": {"c": 1}}}}, "a sub-diff of 'a.2', past the end"),
    ({"a": [{"$date": 5}]}, {"sa": {"a": True, "s0": {"u": {"c": 1}}}}, "a document diff of 'a.0'"),
])
def test_oplog_diffs_on_another_document_than_theirs_are_conflicts(document, diff, problem):
    """A sub-diff meets the value it was computed on; MongoDB, which may apply an entry twice, writes null where
    it does not and waits for a later entry: here the stored document is not the source's, and that is named."""
    with pytest.raises(UpdateConflict, match=problem):
        updated(document, {"$v": 2, "diff": diff})
