"""Topic names: what to suggest when a topic does not exist (a typo in a table's topic, most often)."""

from __future__ import annotations

import difflib

from confluent_kafka import Consumer, KafkaException


def unknown_topic_message(topic: str, client: Consumer, timeout_s: float, bootstrap_servers: str) -> str:
    """The message for a topic that does not exist: the closest topics of its prefix (its first dotted
    part: a Debezium connector's topic.prefix), else of the whole broker."""
    prefix = topic.split(".")[0]
    try:
        names = [name for name in client.list_topics(timeout=timeout_s).topics if not name.startswith("_")]
    except KafkaException:
        names = []
    mine = [name for name in names if name.split(".")[0] == prefix]
    closest = difflib.get_close_matches(topic, mine or names, n=3, cutoff=0.5)
    where = f"of prefix '{prefix}'" if mine else "on the broker"
    found = f"the closest topics {where}: {', '.join(closest)}" if closest else \
        f"no topic {where} is close to it ({len(mine or names)} topic(s) {where})"
    return f"topic '{topic}' does not exist on {bootstrap_servers}; {found}"
