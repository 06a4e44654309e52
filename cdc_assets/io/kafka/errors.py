"""What goes wrong reading Kafka, and the policy for it: which failures are retried, and the one-line
messages that name the broker (and the setting to fix when no broker is there)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from confluent_kafka import KafkaError, KafkaException

T = TypeVar("T")
# Errors of a source's first request that mean no broker is there (refused, unresolvable): not retried. A
# timeout is retried: a broker busy starting up answers late.
_UNREACHABLE = (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE)
# Where the address comes from, for the message that says it is wrong, when the caller does not know the config
# (``PipelineConfig.where_set`` says the file and the variable of the config loaded).
DEFAULT_ADDRESS_SOURCE = "the pipeline config's kafka.bootstrap_servers"


class SourceError(RuntimeError):
    """The topic cannot be read as asked; the message names broker, topic and partition."""


class UnknownTopicError(SourceError):
    """The topic does not exist on the broker (not retried); the message lists the closest topics there."""


def lost_to_retention(topic: str, partition: int, committed: int | None, earliest: int) -> SourceError | None:
    """The error of a partition whose offset ``committed`` (the next one a table would merge) is below its
    ``earliest`` retained offset: events were deleted before they were merged, and no merge can apply them."""
    if committed is None or committed >= earliest:
        return None
    return SourceError(f"{topic}[{partition}]: committed offset {committed} is below the earliest retained offset "
                       f"{earliest}: events were deleted by retention before they were applied")


class Retrying:
    """Runs a source's metadata and watermark requests, retrying Kafka errors and timeouts ``retries`` times
    with exponential backoff from ``backoff_s``; then a clear ``SourceError``. Not retried: an unknown topic,
    and a broker that never answered (a wrong address, or none running: retrying would only hide it)."""

    def __init__(self, bootstrap_servers: str, retries: int, backoff_s: float,
                 address_source: str = DEFAULT_ADDRESS_SOURCE):
        """``address_source``: where a user sets the address (``PipelineConfig.where_set``), for the message."""
        self._bootstrap_servers = bootstrap_servers
        self._address_source = address_source
        self._retries, self._backoff_s = retries, backoff_s
        self._reached = False  # whether a request was ever answered

    def __call__(self, action: Callable[[], T], what: str) -> T:
        """``action``'s result; ``what``: the request, for the message when it fails."""
        attempts = self._retries + 1
        for attempt in range(attempts):
            try:
                result = action()
                self._reached = True
                return result
            except UnknownTopicError:
                self._reached = True
                raise
            except (KafkaException, SourceError) as exc:
                error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                if not self._reached and error is not None and error.code() in _UNREACHABLE:
                    raise SourceError(f"cannot reach Kafka at {self._bootstrap_servers} ({what}: {error.str()}): "
                                      "is a broker running there? If not this address, set it in "
                                      f"{self._address_source}") from exc
                if attempt + 1 == attempts:
                    raise SourceError(f"{what} on Kafka at {self._bootstrap_servers} failed after {attempts} "
                                      f"attempt(s): {exc}") from exc
                time.sleep(self._backoff_s * 2**attempt)
        raise AssertionError("unreachable")
