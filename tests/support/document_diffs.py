"""MongoDB 5.0's oplog diffs (``{"$v": 2, "diff": ...}``) computed from a document before and after an update, in
the form MongoDB's diff calculator writes them, for random histories whose reference is the document after."""

from __future__ import annotations

import json
import random
from typing import Any


def is_document(value: Any) -> bool:
    """Whether ``value`` is an embedded document, not an extended-JSON value (``{"$numberLong": "5"}``)."""
    return isinstance(value, dict) and not next(iter(value), "").startswith("$")


def _same(left: Any, right: Any) -> bool:
    return json.dumps(left) == json.dumps(right)  # the fields' order too


def _sub_diff(old: Any, new: Any, rng: random.Random) -> dict[str, Any] | None:
    """A sub-diff of ``old`` to ``new`` where both are documents or both arrays and the draw says so; None where
    the new value is written whole."""
    if rng.random() < 0.3:
        return None
    if is_document(old) and is_document(new):
        return document_diff(old, new, rng)
    if isinstance(old, list) and isinstance(new, list):
        return _array_diff(old, new, rng)
    return None


def _array_diff(old: list[Any], new: list[Any], rng: random.Random) -> dict[str, Any]:
    """Resized (``l``) when shorter, at random when longer; each changed element replaced (``uN``) or diffed
    (``sN``); a null past the old end left to the resize's padding at random."""
    diff: dict[str, Any] = {"a": True}
    if len(new) < len(old) or (len(new) > len(old) and rng.random() < 0.5):
        diff["l"] = len(new)
    for index, value in enumerate(new):
        if index >= len(old):
            if not (value is None and "l" in diff and rng.random() < 0.5):
                diff[f"u{index}"] = value
        elif not _same(old[index], value):
            sub = _sub_diff(old[index], value, rng)
            diff[f"s{index}" if sub is not None else f"u{index}"] = sub if sub is not None else value
    return diff


def document_diff(before: dict[str, Any], after: dict[str, Any], rng: random.Random) -> dict[str, Any] | None:
    """The diff of ``before`` to ``after`` (deleted ``d``, updated ``u``, inserted ``i``, sub-diffs ``s<name>``),
    or None where ``after`` does not keep ``before``'s fields in their order with the new ones last (a field
    moved: written whole by the caller)."""
    kept = [name for name in after if name in before]
    if kept != [name for name in before if name in after] or list(after)[:len(kept)] != kept:
        return None
    updated: dict[str, Any] = {}
    nested: dict[str, Any] = {}
    for name in kept:
        if not _same(before[name], after[name]):
            sub = _sub_diff(before[name], after[name], rng)
            if sub is None:
                updated[name] = after[name]
            else:
                nested[f"s{name}"] = sub
    parts = {"d": dict.fromkeys([name for name in before if name not in after], False), "u": updated,
             "i": {name: value for name, value in after.items() if name not in before}}
    return {**{part: entries for part, entries in parts.items() if entries}, **nested}
