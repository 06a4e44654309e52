"""Snapshot signal jobs: ``execute-snapshot`` (incremental or blocking), ``stop-snapshot``,
``pause-snapshot`` and ``resume-snapshot``.

Each run validates the signal for the connector's Debezium version (nothing is sent when it is
invalid), sends it through the connector's channel (Kafka signal topic or source signal table),
records it in the signals audit table and shows it as output metadata. Signal ids are
``cdc-assets-<run id>-<n>``.
"""

from collections.abc import Sequence
from enum import Enum
from typing import Literal

from dagster import (
    Config,
    DefaultScheduleStatus,
    JobDefinition,
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


class TableFilter(Config):
    """An additional condition for one data collection."""

    table: str = Field(description="the data collection, '<schema>.<table>' (or a regex matching it)")
    filter: str = Field(description="SQL predicate (incremental), or the SELECT statement (blocking)")


class Channel(Enum):
    """The signal channels a connector may have."""

    kafka = "kafka"
    source = "source"


class SignalTarget(Config):
    """Run config of a signal for a whole snapshot (launchpad): pause and resume."""

    connector: str = Field(description="connector name from the pipeline config")
    channel: Channel | None = Field(default=None, description="kafka or source; default: the connector's")


class SnapshotSignalConfig(SignalTarget):
    """Run config of an execute or stop snapshot signal (launchpad)."""

    tables: list[str] = Field(default=[], description="data collections: '<schema>.<table>' names or regexes; "
                                                      "for stop, empty stops the whole snapshot")
    snapshot_type: Literal["incremental", "blocking"] = Field(
        default="incremental", description="blocking: the connector pauses streaming while it snapshots")
    additional_condition: str | None = Field(default=None,
                                             description="one SQL predicate for every listed table (execute)")
    additional_conditions: list[TableFilter] = Field(default=[], description="a filter per table (execute)")
    surrogate_key: str | None = Field(default=None, description="column to chunk by instead of the key")


def _send(context: OpExecutionContext, config: SignalTarget, signal_type: SignalType, kafka: KafkaResource,
          signals: SignalsResource) -> Output[str]:
    version = signals.settings(config.connector).debezium_version
    signal_id = signal_ids(context.run_id, 1)[0]
    if isinstance(config, SnapshotSignalConfig):
        conditions = [(table, config.additional_condition) for table in config.tables
                      if config.additional_condition]
        conditions += [(condition.table, condition.filter) for condition in config.additional_conditions]
        signal = SnapshotSignal(id=signal_id, type=signal_type, data_collections=tuple(config.tables),
                                snapshot_type=config.snapshot_type, additional_conditions=tuple(conditions),
                                surrogate_key=config.surrogate_key, debezium_version=version)
    else:
        signal = SnapshotSignal(id=signal_id, type=signal_type, debezium_version=version)
    signal.validate()
    channel = signals.channel(config.connector, kafka, config.channel.value if config.channel else None)
    channel.send(signal)
    row = audit_signal(signals.audit_path, signals.storage_options, signal, channel.name, config.connector,
                       context.run_id)
    context.log.info(f"sent {signal_type} {signal.id} to connector {config.connector} via {channel.name}")
    return Output(signal.id, metadata={
        "signal_id": signal.id, "channel": channel.name, "connector": config.connector,
        "payload": MetadataValue.json(signal.data()), "sent_at": str(row["sent_at"]),
        "audit_table": MetadataValue.path(signals.audit_path),
    })


def _signal_job(signal_type: SignalType, config_type: type[SignalTarget], op_description: str,
                job_name: str, job_description: str) -> JobDefinition:
    """A one-op job that sends one kind of signal with its typed launchpad config."""
    # Dagster reads the config class from the annotation at run time; a type checker cannot follow a variable there.
    @op(name=f"send_{signal_type.replace('-', '_')}", description=op_description)
    def send(context: OpExecutionContext, config: config_type, kafka: KafkaResource,  # type: ignore[valid-type]
             signals: SignalsResource) -> Output[str]:
        return _send(context, config, signal_type, kafka, signals)

    @job(name=job_name, description=job_description)
    def signal_job() -> None:
        send()

    return signal_job


incremental_snapshot_job = _signal_job(
    "execute-snapshot", SnapshotSignalConfig,
    "Send an execute-snapshot signal (an incremental or blocking snapshot of the given tables).",
    "incremental_snapshot_job",
    "Request a Debezium snapshot of tables, incremental (default) or blocking (execute-snapshot signal).")
stop_snapshot_job = _signal_job(
    "stop-snapshot", SnapshotSignalConfig,
    "Send a stop-snapshot signal (the given tables, or the whole incremental snapshot).",
    "stop_snapshot_job", "Stop a running Debezium incremental snapshot (stop-snapshot signal).")
pause_snapshot_job = _signal_job(
    "pause-snapshot", SignalTarget, "Send a pause-snapshot signal (the running incremental snapshot waits).",
    "pause_snapshot_job", "Pause the running Debezium incremental snapshot (pause-snapshot signal).")
resume_snapshot_job = _signal_job(
    "resume-snapshot", SignalTarget, "Send a resume-snapshot signal (a paused incremental snapshot goes on).",
    "resume_snapshot_job", "Resume a paused Debezium incremental snapshot (resume-snapshot signal).")


def execute_snapshot_run_config(connector: str, tables: list[str], additional_condition: str | None = None,
                                surrogate_key: str | None = None,
                                additional_conditions: Sequence[tuple[str, str]] = ()) -> dict:
    """Run config of ``incremental_snapshot_job`` for these tables; ``additional_conditions``: ``(table,
    filter)`` pairs, a filter per table."""
    settings: dict[str, object] = {"connector": connector, "tables": tables}
    if additional_condition:
        settings["additional_condition"] = additional_condition
    if additional_conditions:
        settings["additional_conditions"] = [{"table": table, "filter": condition}
                                             for table, condition in additional_conditions]
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
