"""MongoDB's update rules on documents as Python values (MongoDB extended JSON parsed by ``json``), and the
replay of one key's events onto its stored document.

Standard library only: ``core.mongodb`` ships this module by value to Spark's Python workers, which then
need nothing of this project installed (a remote Spark Connect server included).

An update is a dict of operators, applied in this order:
- ``$truncate`` (a list of ``{"field": path, "size": n}``, change streams' ``truncatedArrays``): the array at
  the path keeps its first n elements; change streams report truncations before the fields set after them;
- ``$unset`` (an object whose keys are paths, or a list of paths: ``removedFields``): removes the field;
- ``$set`` (an object of path -> value, as ``updatedFields`` too): sets the field.
A path is dotted (``"a.b"``, ``"items.2.qty"``); a part is an array index where the value there is an array.
MongoDB 5.0's oplog (``$v: 2``) writes an update as one ``diff`` instead (``diffed_document``).
Where MongoDB itself would refuse the update (``UpdateConflict``), the stored document is not the source's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# The operators of an update: MongoDB oplog patches (``$v`` 1) use $set and $unset only; the decode writes
# change streams' ``updateDescription`` with ``$truncate`` beside them (``core.envelope``). An oplog diff
# (``$v`` 2) is ``{"$v": 2, "diff": ...}``.
OPERATORS = ("$set", "$unset", "$truncate", "$v")


class UpdateConflict(ValueError):
    """An update that MongoDB would refuse on the stored document (its path crosses a value that is not a
    document or an array, or names a field of an array)."""

    consequence = "MongoDB would have refused this update: the stored document differs from the source's"


class DiffMismatch(UpdateConflict):
    """An oplog diff whose sub-diff meets another value than the one it was computed on."""

    consequence = "the diff was computed on another document: the stored document differs from the source's"


def _is_container(value: Any) -> bool:
    """Whether a path can go on through ``value``: an embedded document or an array. An extended-JSON type
    wrapper (``{"$numberLong": "5"}``, ``{"$date": ...}``) is one BSON value, not a document."""
    if isinstance(value, list):
        return True
    return isinstance(value, dict) and not (value and next(iter(value)).startswith("$"))


def _index(part: str) -> int | None:
    return int(part) if part.isdigit() else None


def _padded(array: list[Any], index: int) -> None:
    """MongoDB pads an array with nulls up to an index set beyond its end."""
    if index >= len(array):
        array.extend([None] * (index + 1 - len(array)))


def set_path(document: dict[str, Any], path: str, value: Any) -> None:
    """``$set`` of ``path``: a missing parent is created as an embedded document, as MongoDB creates it (an
    array is never created: a numeric part of a missing parent is a field name)."""
    parts = path.split(".")
    node: Any = document
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        if isinstance(node, dict):
            if last:
                node[part] = value
                return
            if part not in node:
                node[part] = {}
            child = node[part]
        else:
            index = _index(part)
            if index is None:
                raise UpdateConflict(f"$set of '{path}': '{part}' is not an index of the array at "
                                     f"'{'.'.join(parts[:depth])}'")
            beyond = index >= len(node)
            _padded(node, index)
            if last:
                node[index] = value
                return
            if beyond:  # MongoDB creates the document at a new index (not in a null that was there)
                node[index] = {}
            child = node[index]
        if not _is_container(child):
            raise UpdateConflict(f"$set of '{path}': '{'.'.join(parts[:depth + 1])}' holds {json.dumps(child)}, "
                                 "not a document or an array")
        node = child


def _walk(document: dict[str, Any], parts: Sequence[str]) -> Any:
    """The value at ``parts`` (None where the path does not reach one)."""
    node: Any = document
    for part in parts:
        if isinstance(node, dict) and _is_container(node):
            node = node.get(part)
        elif isinstance(node, list) and (index := _index(part)) is not None and index < len(node):
            node = node[index]
        else:
            return None
    return node


def unset_path(document: dict[str, Any], path: str) -> None:
    """``$unset`` of ``path``: removes a field; an array element becomes null, as MongoDB keeps the array's
    length and positions; a path that names nothing changes nothing, as in MongoDB."""
    *parents, last = path.split(".")
    node = _walk(document, parents)
    if isinstance(node, dict) and _is_container(node):
        node.pop(last, None)
    elif isinstance(node, list) and (index := _index(last)) is not None and index < len(node):
        node[index] = None


def truncate_array(document: dict[str, Any], path: str, size: int) -> None:
    """A change stream's truncation: the array at ``path`` keeps its first ``size`` elements."""
    node = _walk(document, path.split("."))
    if not isinstance(node, list):
        raise UpdateConflict(f"truncatedArrays names '{path}', which holds no array in the stored document")
    del node[size:]


def _diffed(value: Any, diff: Mapping[str, Any], path: str) -> Any:
    """``value`` (at ``path``) with a sub-diff applied: an array diff (``"a": true``) to an array, a document
    diff to a document. Anything else was not the value the diff was computed on (MongoDB, which may apply an
    oplog entry again, writes null there and counts on a later entry to set it; here it is a ``DiffMismatch``)."""
    if diff.get("a") is True:
        if not isinstance(value, list):
            raise DiffMismatch(f"oplog diff: an array diff of '{path}', which holds {json.dumps(value)}")
        return diffed_array(value, diff, path)
    if not (isinstance(value, dict) and _is_container(value)):
        raise DiffMismatch(f"oplog diff: a document diff of '{path}', which holds {json.dumps(value)}")
    return diffed_document(value, diff, path)


def diffed_document(document: Mapping[str, Any], diff: Mapping[str, Any], path: str = "") -> dict[str, Any]:
    """``document`` with an oplog v2 document diff applied, as MongoDB applies it: its fields in their order,
    less those deleted (``d``: name -> false) and those inserted (``i``: name -> value, moved to the end), an
    updated one (``u``: name -> value) in its place, one with a sub-diff (``s<name>``) diffed; then the updated
    fields it did not have and the inserted ones, in the diff's order. A sub-diff of a field it lacks is refused
    (``_diffed``). ``path``: where the document is, for messages."""
    deleted, updated, inserted = (diff.get(part) or {} for part in ("d", "u", "i"))
    nested = {name[1:]: entry for name, entry in diff.items() if name.startswith("s")}
    missing = [name for name in nested if name not in document]
    if missing:
        raise DiffMismatch(f"oplog diff: a sub-diff of '{'.'.join(filter(None, (path, missing[0])))}', which "
                           "the stored document does not have")
    out: dict[str, Any] = {}
    for name, value in document.items():
        if name in deleted or name in inserted:
            continue
        if name in updated:
            out[name] = updated[name]
        else:
            out[name] = _diffed(value, nested[name], ".".join(filter(None, (path, name)))) if name in nested \
                else value
    for name, value in [*updated.items(), *inserted.items()]:
        out.setdefault(name, value)
    return out


def diffed_array(array: Sequence[Any], diff: Mapping[str, Any], path: str) -> list[Any]:
    """``array`` with an oplog v2 array diff (``"a": true``) applied, as MongoDB applies it: resized to ``l``
    when the diff has it, element ``N`` replaced (``uN``: value) or diffed (``sN``: a sub-diff), an index past
    its end padded with nulls up to the last one the diff names."""
    changes = {int(name[1:]): (name[0], entry) for name, entry in diff.items()
               if name[:1] in ("u", "s") and name[1:].isdigit()}
    size = diff.get("l")
    length = int(size) if size is not None else max(len(array), max(changes, default=-1) + 1)
    out: list[Any] = []
    for index in range(length):
        kind, entry = changes.get(index, ("", None))
        if kind == "u":
            out.append(entry)
        elif kind == "s":
            if index >= len(array):
                raise DiffMismatch(f"oplog diff: a sub-diff of '{path}.{index}', past the end of the array")
            out.append(_diffed(array[index], entry, f"{path}.{index}"))
        else:
            out.append(array[index] if index < len(array) else None)
    return out


def apply_update(document: dict[str, Any], update: Mapping[str, Any]) -> None:
    """Apply an update (operators or an oplog diff, module docstring) to ``document`` in place."""
    if "diff" in update:
        diffed = diffed_document(document, update["diff"])
        document.clear()
        document.update(diffed)
        return
    for truncation in update.get("$truncate") or ():
        truncate_array(document, truncation["field"], int(truncation["size"]))
    for path in update.get("$unset") or ():
        unset_path(document, path)
    for path, value in (update.get("$set") or {}).items():
        set_path(document, path, value)


def is_update(patch: Mapping[str, Any]) -> bool:
    """Whether a patch is an update (operators), not a replacement document."""
    return any(name.startswith("$") for name in patch)


ORPHAN_REASON = "op 'u' patches a document never seen (no create or read before it, nothing in Delta)"


def _text(document: dict[str, Any] | None) -> str | None:
    return None if document is None else json.dumps(document, ensure_ascii=False, separators=(",", ":"))


def replay(stored: str | None, events: Iterable[Mapping[str, Any]]) -> list[tuple[str | None, str | None]]:
    """One key's events (``op``, ``document``: a full document's text or null, ``patch``: an update's or a
    replacement's text), in position order, applied to its ``stored`` document: per event, the document
    after it (null after a delete) and why it could not be applied (null if it was). An event that cannot be
    applied leaves the document as it was."""
    current: dict[str, Any] | None = None if stored is None else json.loads(stored)
    text = stored
    out: list[tuple[str | None, str | None]] = []
    for event in events:
        op, full, patch = event["op"], event["document"], event["patch"]
        if op == "d":
            current, text = None, None
        elif full is not None:
            current = json.loads(full)
            text = _text(current)
        else:
            operators = json.loads(patch)
            if not is_update(operators):
                current = operators
            elif current is None:
                out.append((text, ORPHAN_REASON))
                continue
            else:
                try:
                    apply_update(current, operators)
                except UpdateConflict as exc:
                    current = json.loads(text) if text is not None else None  # undo a partial application
                    out.append((text, f"{exc} ({exc.consequence})"))
                    continue
            text = _text(current)
        out.append((text, None))
    return out
