"""The transaction sensor of a connector: follows the ENDs of ``<topic.prefix>.transaction`` and, when
transactions complete, requests one merge run for exactly the tables they touched.

Many small transactions completed since the last tick make one run; its run key is
``transactions:<topic>:<partition>:<first END offset>-<last END offset>`` (ranges of several
partitions joined by ``,``), so a re-evaluated tick launches nothing twice. The cursor holds the
next offset per partition. An END needs no BEGIN before it: on a topic of several partitions the two
are in different ones (PostgreSQL's ids, the record keys, differ), and a restarted connector emits
both again. An unknown status or malformed data collections stop their partition's cursor before the
event (the other partitions read on); the tick fails naming its offset (or logs it, when it also
requested a run for transactions completed elsewhere or before it).
"""

import json
from collections.abc import Mapping, Sequence
from typing import Any

from dagster import RunRequest, SensorDefinition, SensorEvaluationContext, SensorResult, sensor

from cdc_assets.catalog import CapturedTable, schema_registry_settings
from cdc_assets.checks import merge_run_checks
from cdc_assets.config import ConnectorConfig
from cdc_assets.core.transactions import TransactionEventError, parse_transaction_event, touched_tables
from cdc_assets.io.avro import record_decoder
from cdc_assets.io.kafka import KafkaSource, read_control_if_exists
from cdc_assets.io.transactions import TransactionLogError
from cdc_assets.translator import CdcTranslator, dagster_name

MAX_EVENTS_PER_TICK = 10_000


def make_transaction_sensor(connector: ConnectorConfig, tables: Sequence[CapturedTable],
                            kafka_settings: Mapping[str, Any], merge_job: Any,
                            minimum_interval_seconds: int = 15,
                            translator: CdcTranslator | None = None) -> SensorDefinition:
    """The transaction sensor of ``connector``, requesting ``merge_job`` runs for touched tables
    (their assets as the translator, default ``CdcTranslator()``, names them)."""
    topic = connector.transaction_topic or f"{connector.topic_prefix}.transaction"
    translator = translator or CdcTranslator()
    keys = {table.name: translator.get_asset_key(table) for table in tables if not table.retired}
    by_name = {table.name: table for table in tables}

    @sensor(name=f"{dagster_name(connector.name)}_transaction_sensor", job=merge_job,
            minimum_interval_seconds=minimum_interval_seconds,
            description=f"Merge runs for the tables touched by completed transactions of {connector.name}. Cursor: the "
                        "next offset to read of each transaction-topic partition")
    def transaction_sensor(context: SensorEvaluationContext) -> SensorResult:
        cursor = json.loads(context.cursor) if context.cursor else {"offsets": {}}
        offsets = {int(p): o for p, o in cursor["offsets"].items()}
        source = KafkaSource(dict(kafka_settings), retries=0)
        try:
            read = read_control_if_exists(source, topic, offsets, MAX_EVENTS_PER_TICK,
                                          decode=record_decoder(schema_registry_settings(connector)))
        finally:
            source.close()
        if read is None:
            return SensorResult(run_requests=[], cursor=context.cursor)
        completed: list[tuple[int, int, dict[str, int]]] = []
        for record, event in read.events(parse_transaction_event, TransactionEventError):
            if event.status == "END":
                completed.append((record.partition, record.offset, event.collections))
        problems = read.problems
        if problems and not completed:
            raise TransactionLogError("malformed transaction event(s), cursor kept before them: "
                                      + "; ".join(problems))
        for problem in problems:
            context.log.error(f"malformed transaction event, cursor kept before it: {problem}")
        requests = []
        touched = touched_tables([collections for _, _, collections in completed], keys)
        if touched:
            ranges: dict[int, tuple[int, int]] = {}
            for partition, offset, _ in completed:
                ranges[partition] = (ranges.get(partition, (offset, offset))[0], offset)
            selected = {keys[name]: by_name[name] for name in sorted(touched)}
            requests.append(RunRequest(
                run_key=f"transactions:{topic}:" + ",".join(f"{p}:{a}-{b}" for p, (a, b) in sorted(ranges.items())),
                asset_selection=list(selected), asset_check_keys=merge_run_checks(selected),
                tags={"cdc_assets/transactions": str(len(completed))}))
        new_cursor = {"offsets": {str(p): o for p, o in read.next_offsets.items()}}
        return SensorResult(run_requests=requests, cursor=json.dumps(new_cursor, sort_keys=True))

    return transaction_sensor
