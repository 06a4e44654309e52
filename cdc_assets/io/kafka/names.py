"""Topic names: what to suggest when a topic does not exist (a typo in a table's topic, most often)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from confluent_kafka import Consumer, KafkaException


def closest_topics(topic: str, names: Iterable[str]) -> str:
    """What to tell a user whose ``topic`` is not among the broker's topic ``names``: the closest ones of its
    prefix (its first dotted part: a Debezium connector's topic.prefix), else of the whole broker."""
    prefix = topic.split(".")[0]
    names = [name for name in names if not name.startswith("_")]
    mine = [name for name in names if name.split(".")[0] == prefix]
    closest = difflib.get_close_matches(topic, mine or names, n=3, cutoff=0.5)
    where = f"of prefix '{prefix}'" if mine else "on the broker"
    return f"the closest topics {where}: {', '.join(closest)}" if closest else \
        f"no topic {where} is close to it ({len(mine or names)} topic(s) {where})"


def unknown_topic_message(topic: str, client: Consumer, timeout_s: float, bootstrap_servers: str) -> str:
    """The message for a topic that does not exist, with the closest topics (``closest_topics``)."""
    try:
        names = list(client.list_topics(timeout=timeout_s).topics)
    except KafkaException:
        names = []
    return f"topic '{topic}' does not exist on {bootstrap_servers}; {closest_topics(topic, names)}"
