"""The public API without Dagster: a table spec and one call apply a topic's pending events, with the
Spark session and Kafka source made for the caller; the example script does the same."""

import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

import cdc_assets
from cdc_assets import BadEventError, BatchLimits, TableSpec, apply_pending
from cdc_assets.demo.events import encode_key, envelope, postgres_source
from tests.support.topics import new_topic, produce

ROOT = Path(__file__).resolve().parents[2]


def events(keys, lsn0):
    return [(encode_key({"id": k}), envelope("c", None, {"id": k, "v": f"v{k}"},
                                             postgres_source(lsn0 + k, 1_700_000_000_000, "s", "t"), lsn0 + k))
            for k in keys]


def test_a_spec_and_one_call_apply_pending_events_in_batches_then_nothing(broker, tmp_path):
    topic = new_topic(broker, "api.s.t")
    produce(broker, topic, events(range(25), 100))
    spec = TableSpec(kind="postgresql", topic=topic, target=str(tmp_path / "t"))
    reports = apply_pending(spec, kafka=broker.bootstrap_servers, limits=BatchLimits(max_records=10))
    assert [r.events_read for r in reports] == [10, 10, 5] and reports[-1].raw.caught_up
    assert DeltaTable(str(tmp_path / "t")).count() == 25
    again = apply_pending(spec, kafka={"bootstrap.servers": broker.bootstrap_servers})
    assert [r.events_read for r in again] == [0]

    produce(broker, topic, [(encode_key({"id": 99}), b"not json")])
    with pytest.raises(BadEventError, match=rf"{topic}.*partition 0.*offset 25"):
        apply_pending(spec, kafka=broker.bootstrap_servers)


def test_the_public_names_are_exported_and_documented():
    for name in cdc_assets.__all__:
        exported = getattr(cdc_assets, name)
        assert exported.__doc__, f"cdc_assets.{name} has no docstring"
    with pytest.raises(AttributeError):
        cdc_assets.not_a_name  # noqa: B018


def test_the_example_script_applies_a_topic(broker, tmp_path):
    topic = new_topic(broker, "example.s.t")
    produce(broker, topic, events(range(3), 10))
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "without_dagster.py"), broker.bootstrap_servers,
                          topic, str(tmp_path / "t")], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "batch 1: 3 events read" in run.stdout
    assert DeltaTable(str(tmp_path / "t")).count() == 3
