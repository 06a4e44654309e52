"""The preflight of a pipeline config: every connection its runs need, checked before the first run
(``cdc-assets preflight``, and ``cdc_preflight_job`` in the UI). What each check does is in
``cdc_assets.io.preflight``; here, what the config asks to check and the config field behind each."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cdc_assets.catalog import resolve_tables, schema_registry_settings
from cdc_assets.config import ConnectorConfig, PipelineConfig
from cdc_assets.io.preflight import (
    CheckResult,
    bounded,
    broker_topics,
    probe_write,
    registry_subjects,
    side_by_side,
    signal_table,
    tcp_reachable,
    topic_problem,
)
from cdc_assets.resources import kafka_client_settings

_COLUMNS = ("check", "target", "result", "detail", "config field")


def run_preflight(config: PipelineConfig) -> list[CheckResult]:
    """Check every connection ``config`` names, side by side, each within its bound: the broker with the
    configured security, each table's topic, each Avro connector's schema registry and subjects, the Delta
    root (a probe write and delete) and each signal channel. The results in that order."""
    checks: list[Callable[[], list[CheckResult]]] = [lambda: _kafka_checks(config)]
    checks += [lambda connector=connector: [_registry_check(config, connector)]  # type: ignore[misc]
               for connector in config.connectors if connector.format == "avro"]
    delta = config.delta
    checks.append(lambda: [bounded("delta root", delta.root, _field(config, "delta.root", "delta.storage_options"),
                                   lambda: probe_write(delta.root, delta.storage_options))])
    checks += [lambda connector=connector: [_source_signal_check(connector)]  # type: ignore[misc]
               for connector in config.connectors if connector.signal is not None
               and connector.signal.channel == "source"]
    return side_by_side(checks)


def _field(config: PipelineConfig, *fields: str) -> str:
    """The config fields behind a check, each with the environment variables it reads."""
    return ", ".join(field + "".join(f" (${name})" for name in config.variables_of(field)) for field in fields)


def _kafka_checks(config: PipelineConfig) -> list[CheckResult]:
    """The broker, then (from one metadata answer) each connector's table topics and Kafka signal topic."""
    kafka = config.kafka
    field = _field(config, "kafka.bootstrap_servers", *(f"kafka.{name}" for name in (
        "security_protocol", "sasl_mechanism", "sasl_username_env", "sasl_password_env", "ssl_ca_location")
        if getattr(kafka, name) is not None))
    topics: dict[str, str | None] = {}

    def broker() -> str:
        address = tcp_reachable(kafka.bootstrap_servers)
        topics.update(broker_topics(kafka_client_settings(kafka, require_secrets=True)))
        return f"{address} answers; {sum(not name.startswith('_') for name in topics)} topic(s)"

    results = [bounded("broker", kafka.bootstrap_servers, field, broker)]
    reached = not results[0].failed
    tables = resolve_tables(config, list_topics=lambda: topics)
    for connector in config.connectors:
        mine = [table for table in tables if table.connector == connector.name]
        where = f"connectors[{connector.name}]"
        signal = connector.signal
        signal_topic = signal.topic if signal is not None and signal.channel == "kafka" else None
        if not reached:
            results.append(CheckResult("topics", f"{connector.topic_prefix}.*", "skipped", "the broker did not answer",
                                       f"{where}.topic.prefix, .tables"))
            if signal_topic:
                results.append(CheckResult("signal channel", signal_topic, "skipped", "the broker did not answer",
                                           f"{where}.signal.topic"))
            continue
        missing = [(table, problem) for table in mine if (problem := topic_problem(table.topic, topics))]
        results += [CheckResult("topic", table.topic, "FAILED", problem, f"{where}.tables[{table.name}]" + (
            " (with topic.prefix)" if table.topic == f"{connector.topic_prefix}.{table.name}" else ".topic"))
                    for table, problem in missing]
        if len(missing) < len(mine):
            results.append(CheckResult("topics", f"{connector.topic_prefix}.*", "ok",
                                       f"{len(mine) - len(missing)} of {len(mine)} table topic(s) exist",
                                       f"{where}.topic.prefix, .tables"))
        if signal_topic:
            problem = topic_problem(signal_topic, topics)
            results.append(CheckResult("signal channel", signal_topic, "FAILED" if problem else "ok",
                                       problem or "the signal topic exists", f"{where}.signal.topic"))
    return results


def _registry_check(config: PipelineConfig, connector: ConnectorConfig) -> CheckResult:
    settings = schema_registry_settings(connector)
    assert settings is not None  # an avro connector has one (config validation)
    subjects = [f"{table.topic}-value" for table in resolve_tables(config, list_topics=list)
                if table.connector == connector.name]
    return bounded("schema registry", settings.url, f"connectors[{connector.name}].schema_registry.url",
                   lambda: registry_subjects(settings, subjects))


def _source_signal_check(connector: ConnectorConfig) -> CheckResult:
    signal = connector.signal
    assert signal is not None and signal.table and signal.dsn_env  # the source channel's (config validation)
    dsn_env, table = signal.dsn_env, signal.table
    return bounded("signal channel", f"{table} (${dsn_env})",
                   f"connectors[{connector.name}].signal.dsn_env, .table", lambda: signal_table(dsn_env, table))


def results_table(results: Sequence[CheckResult]) -> str:
    """The results as a plain-text table, one row per check."""
    rows = [_COLUMNS, *((r.check, r.target, r.status, r.detail, r.field) for r in results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS) - 1)]
    return "\n".join("  ".join([*(cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)),
                                row[-1]]).rstrip() for row in rows)


def summary(config: PipelineConfig, results: Sequence[CheckResult]) -> str:
    """One line: how many checks failed, of which config."""
    failed = sum(result.failed for result in results)
    verdict = f"{failed} of {len(results)} check(s) FAILED" if failed else f"all {len(results)} check(s) passed"
    return f"preflight of {config.source}: {verdict}"
