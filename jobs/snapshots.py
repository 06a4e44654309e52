"""Incremental-snapshot jobs: send Debezium ``execute-snapshot`` / ``stop-snapshot`` signals.

Each run validates the signal (nothing is sent when it is invalid), sends it through the
connector's channel (Kafka signal topic or source signal table), records it in the signals audit
table and shows it as output metadata. Signal ids are ``cdc-assets-<run id>-<n>``.
"""

from dagster import (
    Config,
    DefaultScheduleStatus,
    MetadataValue,
    OpExecutionContext,
    Output,
    ScheduleDefinition,
    job,
    op,
)
from pydantic import Field

from cdc_assets.config import PipelineConfig
from cdc_assets.io.signals import SignalType, SnapshotSignal, audit_signal, signal_ids
from cdc_assets.resources import KafkaResource, SignalsResource


class SnapshotSignalConfig(Config):
    """Run config of a snapshot signal (launchpad)."""

    connector: str = Field(description="connector name from the pipeline config")
    tables: list[str] = Field(default=[], description="data collections: '<schema>.<table>' names or regexes; "
                                                      "for stop, empty stops the whole snapshot")
    additional_condition: str | None = Field(default=None, description="SQL predicate, execute only")
    surrogate_key: str | None = Field(default=None, description="column to chunk by instead of the key")
    channel: str | None = Field(default=None, description="kafka or source; default: the connector's")


def _send(context: OpExecutionContext, config: SnapshotSignalConfig, signal_type: SignalType,
          kafka: KafkaResource, signals: SignalsResource) -> Output[str]:
    signal = SnapshotSignal(
        id=signal_ids(context.run_id, 1)[0],
        type=signal_type,
        data_collections=tuple(config.tables),
        additional_condition=config.additional_condition,
        surrogate_key=config.surrogate_key,
    )
    signal.validate()
    channel = signals.channel(config.connector, kafka, config.channel)
    channel.send(signal)
    row = audit_signal(signals.audit_path, signals.storage_options, signal, channel.name, config.connector,
                       context.run_id)
    context.log.info(f"sent {signal_type} {signal.id} to connector {config.connector} via {channel.name}")
    return Output(signal.id, metadata={
        "signal_id": signal.id, "channel": channel.name, "connector": config.connector,
        "payload": MetadataValue.json(signal.data()), "sent_at": str(row["sent_at"]),
        "audit_table": MetadataValue.path(signals.audit_path),
    })


@op(description="Send an execute-snapshot signal (incremental snapshot of the given tables).")
def send_execute_snapshot(context: OpExecutionContext, config: SnapshotSignalConfig, kafka: KafkaResource,
                          signals: SignalsResource) -> Output[str]:
    return _send(context, config, "execute-snapshot", kafka, signals)


@op(description="Send a stop-snapshot signal (the given tables, or the whole snapshot).")
def send_stop_snapshot(context: OpExecutionContext, config: SnapshotSignalConfig, kafka: KafkaResource,
                       signals: SignalsResource) -> Output[str]:
    return _send(context, config, "stop-snapshot", kafka, signals)


@job(description="Request a Debezium incremental snapshot of tables (execute-snapshot signal).")
def incremental_snapshot_job() -> None:
    send_execute_snapshot()


@job(description="Stop a running Debezium incremental snapshot (stop-snapshot signal).")
def stop_snapshot_job() -> None:
    send_stop_snapshot()


def execute_snapshot_run_config(connector: str, tables: list[str], additional_condition: str | None = None,
                                surrogate_key: str | None = None) -> dict:
    """Run config of ``incremental_snapshot_job`` for these tables."""
    settings: dict[str, object] = {"connector": connector, "tables": tables}
    if additional_condition:
        settings["additional_condition"] = additional_condition
    if surrogate_key:
        settings["surrogate_key"] = surrogate_key
    return {"ops": {"send_execute_snapshot": {"config": settings}}}


def build_snapshot_schedules(config: PipelineConfig) -> list[ScheduleDefinition]:
    """One schedule per configured snapshot schedule; stopped unless the config says running."""
    return [
        ScheduleDefinition(
            name=f"{connector.name}_{schedule.name}",
            job=incremental_snapshot_job,
            cron_schedule=schedule.cron,
            execution_timezone=schedule.timezone,
            run_config=execute_snapshot_run_config(connector.name, schedule.tables, schedule.additional_condition,
                                                   schedule.surrogate_key),
            default_status=DefaultScheduleStatus.RUNNING if schedule.running else DefaultScheduleStatus.STOPPED,
            description=f"Incremental snapshot of {schedule.tables} ({connector.name})",
        )
        for connector in config.connectors
        for schedule in connector.snapshot_schedules
    ]
