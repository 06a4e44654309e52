"""One run of a table's micro-batch in a process of its own, for the tests that race two runs: it
waits at the ``folded`` point until every racer has folded (files in ``--barrier``), then commits, and
prints what its batch did as one JSON line (``applied``, ``already_applied``, or the ``error``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> int:
    """Run the batch; print its outcome."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--path", required=True)
    parser.add_argument("--storage-options", default="{}")
    parser.add_argument("--writer", choices=("delta-rs", "delta-spark"), required=True)
    parser.add_argument("--spark", required=True, help="the local Spark server's URL")
    parser.add_argument("--barrier", required=True, help="a directory; each racer adds a file once folded")
    parser.add_argument("--racers", type=int, default=2)
    args = parser.parse_args()

    from cdc_assets.catalog import CapturedTable
    from cdc_assets.config import BatchLimits
    from cdc_assets.io.delta import DeltaRsWriter, DeltaSparkWriter, DeltaTarget, DeltaWriterError
    from cdc_assets.io.kafka import KafkaSource
    from cdc_assets.io.spark_server import connect, disconnect
    from cdc_assets.merge import faults, merge_micro_batch

    barrier = Path(args.barrier)

    def wait_for_every_racer(point: str) -> None:
        if point != "folded":
            return
        (barrier / f"racer-{time.monotonic_ns()}").touch()
        deadline = time.monotonic() + 180
        while len(list(barrier.iterdir())) < args.racers:
            if time.monotonic() > deadline:
                raise TimeoutError(f"not every racer folded within 180 s: {list(barrier.iterdir())}")
            time.sleep(0.05)

    session = connect(args.spark)
    table = CapturedTable(connector="test", kind="postgresql", topic_prefix=args.topic.split(".")[0], name="s.t",
                          topic=args.topic, target=DeltaTarget(args.path, json.loads(args.storage_options)))
    writer = DeltaRsWriter() if args.writer == "delta-rs" else DeltaSparkWriter(session)
    source = KafkaSource({"bootstrap.servers": args.bootstrap, "group.id": "race"})
    faults.fault_hook = wait_for_every_racer
    try:
        outcome = merge_micro_batch(session, source, writer, table, BatchLimits()).outcome
        already = outcome is not None and outcome.already_applied  # None: the batch had nothing to apply
        print(json.dumps({"applied": outcome is not None and not already, "already_applied": already}))
    except DeltaWriterError as exc:
        print(json.dumps({"error": str(exc)}))
    finally:
        source.close()
        disconnect(session)
    return 0


if __name__ == "__main__":
    sys.exit(main())
