"""Kafka for the pipeline, on confluent-kafka: bounded batches of a topic (``KafkaSource``), a look at
topics as they are now (``TopicProbe``), and control topics read event by event (``read_control``)."""

from cdc_assets.io.kafka.batch import KEY_CHANGE_HEADERS, RAW_SCHEMA, Cut, Decode, RawBatch, ReadRequest
from cdc_assets.io.kafka.clients import LIBRDKAFKA_LOGGER
from cdc_assets.io.kafka.control import ControlRead, ControlRecord, read_control, read_control_if_exists
from cdc_assets.io.kafka.errors import SourceError, UnknownTopicError, lost_to_retention
from cdc_assets.io.kafka.probe import TopicProbe
from cdc_assets.io.kafka.source import KafkaSource

__all__ = [
    "KEY_CHANGE_HEADERS",
    "LIBRDKAFKA_LOGGER",
    "RAW_SCHEMA",
    "ControlRead",
    "ControlRecord",
    "Cut",
    "Decode",
    "KafkaSource",
    "RawBatch",
    "ReadRequest",
    "SourceError",
    "TopicProbe",
    "UnknownTopicError",
    "lost_to_retention",
    "read_control",
    "read_control_if_exists",
]
