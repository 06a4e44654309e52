"""The schema-change sensor: reads each connector's schema-change topic (``<topic.prefix>``) and
requests an ``apply_schema_change_job`` run for every CREATE, ALTER or DROP of a captured table (but a
snapshot's DROP: ``SchemaChangeEvent.acted_on``). The runs may finish in any order: the job applies
changes in source order (``core.schema_evolution``).

Run keys are ``schema-change:<topic>:<partition>:<offset>:<n>``, so a re-evaluated tick never
launches a change twice. The cursor (``{topic: {partition: next offset}}``) only moves past events
that were acted on: a malformed event stops its topic there. The tick fails with the event's
coordinates when nothing before it was requested; otherwise it logs the error and requests those runs.
"""

import functools
import json
from collections.abc import Callable

from dagster import JobDefinition, RunRequest, SensorDefinition, SensorEvaluationContext, SensorResult, sensor

from cdc_assets.catalog import CapturedTable, captures, schema_registry_settings
from cdc_assets.config import PipelineConfig
from cdc_assets.core.schema_change import SchemaChangeError, parse_schema_change
from cdc_assets.core.schema_evolution import AnnouncedChange
from cdc_assets.io.avro import record_decoder
from cdc_assets.io.kafka import KafkaSource, read_control_if_exists
from cdc_assets.resources import kafka_client_settings
from cdc_assets.translator import CdcTranslator
from jobs.schema_changes import SchemaChangeConfig

MAX_EVENTS_PER_TICK = 500


def make_schema_change_sensor(config: PipelineConfig, table_for: Callable[[str, str], CapturedTable],
                              apply_job: JobDefinition, minimum_interval_seconds: int = 30,
                              translator: CdcTranslator | None = None) -> SensorDefinition:
    """A sensor over every connector's schema-change topic that requests ``apply_job`` runs (for the
    assets the translator, default ``CdcTranslator()``, names); ``table_for(connector, table)``: a
    table's capture (``catalog.table_finder``)."""
    translator = translator or CdcTranslator()

    @sensor(name="schema_change_sensor", job=apply_job, minimum_interval_seconds=minimum_interval_seconds,
            description="CREATE/ALTER/DROP of captured tables from Debezium schema-change topics. Cursor: the next "
                        "offset to read of each schema-change topic's partitions; each event's run has a run key of "
                        "its topic, partition and offset, so a restarted daemon launches none twice")
    def schema_change_sensor(context: SensorEvaluationContext) -> SensorResult:
        cursor: dict[str, dict[str, int]] = json.loads(context.cursor) if context.cursor else {}
        requests: list[RunRequest] = []
        problems: list[str] = []
        source = KafkaSource(kafka_client_settings(config.kafka), retries=0,
                             address_source=config.where_set("kafka.bootstrap_servers"))
        try:
            for connector in config.connectors:
                topic = connector.topic_prefix
                offsets = {int(p): o for p, o in cursor.get(topic, {}).items()}
                read = read_control_if_exists(source, topic, offsets, MAX_EVENTS_PER_TICK,
                                              decode=record_decoder(schema_registry_settings(connector)))
                if read is None:
                    continue  # no DDL captured yet
                parse = functools.partial(parse_schema_change, kind=connector.kind)
                for record, event in read.events(parse, SchemaChangeError):
                    partition, offset = record.partition, record.offset
                    for index, change in enumerate(event.changes):
                        if change not in event.acted_on or not captures(connector, change.name):
                            continue
                        table = table_for(connector.name, change.name)
                        announced = AnnouncedChange(connector.name, change, event.source_position, topic,
                                                    partition, offset, table.merge.apply_mode)
                        run_config = SchemaChangeConfig.of(announced, translator.get_asset_key(table),
                                                           table.target.path).run_config()
                        requests.append(RunRequest(
                            run_key=f"schema-change:{topic}:{partition}:{offset}:{index}", run_config=run_config,
                            tags={"cdc_assets/schema_change": f"{change.type} {connector.name}/{change.name}"}))
                problems += read.problems
                cursor[topic] = {str(p): o for p, o in read.next_offsets.items()}
        finally:
            source.close()
        if problems and not requests:
            raise SchemaChangeError("malformed schema-change event(s), cursor kept before them: "
                                    + "; ".join(problems))
        for problem in problems:
            context.log.error(f"malformed schema-change event, cursor kept before it: {problem}")
        return SensorResult(run_requests=requests, cursor=json.dumps(cursor, sort_keys=True))

    return schema_change_sensor
