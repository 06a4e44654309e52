"""scripts/setup, run for real into a venv of the test's own: the base (Delta's jars, Apache Kafka's) always, the
extras only when asked or when the config in use needs them; a session that needs a missing one names the command
that fetches it. The venv takes its packages from this one (a .pth file) and the class archive is named by
CDC_SPARK_CLASS_ARCHIVE, so the run does Maven's fetches only (from ~/.m2 once scripts/setup-tests has run)."""

import os
import subprocess
from pathlib import Path

from tests.support.venvs import venv_of_this_ones_packages

ROOT = Path(__file__).resolve().parents[2]
ADLS_CONFIG = """
kafka: {bootstrap_servers: "b:9092"}
delta: {root: "abfss://c@acct.dfs.core.windows.net/cdc", writer: delta-spark, storage_options: {account_key_env: K}}
connectors:
  - {name: c, kind: postgresql, topic.prefix: c, tables: [{name: s.t}]}
"""
# What a session of the venv says of the store's jars: their names, or the error naming the command.
JARS_OF = """
import sys
from cdc_assets.io.spark import object_store_jars
try:
    print(",".join(jar.rsplit("/", 1)[-1] for jar in object_store_jars(sys.argv[1]).split(",")))
except Exception as error:
    print(f"{type(error).__name__}: {error}")
"""


def test_setup_fetches_the_extras_only_when_asked_or_needed(tmp_path):
    venv = tmp_path / "venv"
    python = venv_of_this_ones_packages(venv)
    archive = tmp_path / "classes.jsa"
    archive.touch()
    unset = ("CDC_SETUP_EXTRAS", "CDC_SETUP_TESTS", "CDC_ASSETS_CONFIG", "VIRTUAL_ENV")  # a user's shell has none
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update(CDC_VENV=str(venv), CDC_SPARK_CLASS_ARCHIVE=str(archive), PYTHONPATH=str(ROOT))
    share = venv / "share" / "cdc-assets"

    def setup(**extra: str) -> str:
        run = subprocess.run(["bash", str(ROOT / "scripts" / "setup")], env={**env, **extra}, capture_output=True,
                             text=True, timeout=900)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert "\x1b" not in run.stdout + run.stderr  # no terminal codes from Maven
        return run.stderr

    def jars_of(root: str) -> str:
        return subprocess.run([str(python), "-c", JARS_OF, root], env=env, capture_output=True, text=True,
                              timeout=120, check=True).stdout.strip()

    said = setup()  # the demo's path: the bundled config, nothing asked
    assert "fetching Delta's jars" in said and "fetching Apache Kafka" in said
    assert {path.name for path in share.iterdir()} == {"delta-jars", "kafka"}
    assert list((share / "delta-jars").glob("delta-spark_*.jar")) and (share / "kafka" / ".installed").exists()
    assert jars_of("abfss://c@acct.dfs.core.windows.net/cdc") == (
        f"StorageConfigError: delta.root 'abfss://c@acct.dfs.core.windows.net/cdc' is on azure, where Spark opens "
        f"the Delta tables (delta.writer delta-spark, or rows_match_source's reads), and Spark needs Hadoop's "
        f"connector for it: no jars in {share / 'hadoop-azure-jars'} (run `CDC_SETUP_EXTRAS=azure scripts/setup`)")

    config = tmp_path / "adls.yaml"
    config.write_text(ADLS_CONFIG)
    said = setup(CDC_ASSETS_CONFIG=str(config), CDC_SETUP_EXTRAS="spark-kafka")  # the config's store, one asked
    assert "fetching Delta's jars" not in said and "hadoop-azure" in said
    assert {path.name for path in share.iterdir()} == {"delta-jars", "kafka", "hadoop-azure-jars", "spark-kafka-jars"}
    assert "hadoop-azure-" in jars_of("abfss://c@acct.dfs.core.windows.net/cdc")
    assert list((share / "spark-kafka-jars").glob("spark-sql-kafka-0-10_2.13-*.jar"))
    assert jars_of("s3://bucket/cdc").endswith("(run `CDC_SETUP_EXTRAS=s3 scripts/setup`)")
    assert not (share / "hadoop-aws-jars").exists()
