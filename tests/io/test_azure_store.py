"""Delta tables on Azure storage, for both writers, against a real Azure Blob server (Azurite,
``tests/support/azurite.py``): the writer suite gives what it gives on local disk, each writer reads and merges
the other's tables, and the server refuses another key. Azurite serves the Blob API only: delta-spark
reaches it through ABFS's Blob-endpoint client, as it reaches a flat-namespace account (docs/storage.md)."""

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from cdc_assets.config import ConfigError, parse_config
from cdc_assets.io.delta import DeltaRsWriter, DeltaSparkWriter, DeltaTarget
from cdc_assets.io.spark import spark_config
from cdc_assets.io.spark_server import connect, disconnect, ensure_local_server
from cdc_assets.io.storage import StorageConfigError, spark_settings
from tests.support.azurite import ACCOUNT_KEY_ENV, Azurite
from tests.support.delta import SCD1, batch, commit, table_rows, writer_named, writer_run


@pytest.fixture(scope="module")
def azure_spark(azurite: Azurite) -> Iterator[SparkSession]:
    """A session on the local Spark server for an ADLS root of the session's Azurite: the settings a run
    with such a ``delta`` config gets."""
    session = connect(ensure_local_server(spark_config(delta_root=azurite.root("any", "cdc"),
                                                       storage_options=azurite.storage_options())))
    yield session
    disconnect(session)


@pytest.fixture
def container(azurite: Azurite) -> str:
    """A fresh container of the session's Azurite."""
    return azurite.create_container(f"lake-{uuid.uuid4().hex[:12]}")


@pytest.mark.parametrize("writer_name", ["delta-rs", "delta-spark"])
def test_the_writer_suite_on_adls_gives_what_it_gives_on_local_disk(azure_spark, azurite, container, writer_name,
                                                                    tmp_path):
    writer = writer_named(writer_name, azure_spark)
    on_azure = writer_run(azure_spark, writer, DeltaTarget(azurite.root(container, "t"), azurite.storage_options()))
    on_disk = writer_run(azure_spark, writer, DeltaTarget(str(tmp_path / "t")))
    assert on_azure == on_disk
    assert on_azure[-1] == [(1, "a2", "u", "03", None), (3, "c", "c", "05", None)]
    assert on_azure[2][3]  # the repeated batch was recognised, not applied
    log = azurite.blobs(container, "t/_delta_log/")
    assert [name for name in log if name.endswith(".json")] == [f"t/_delta_log/{v:020d}.json" for v in range(4)]


def test_both_writers_read_each_others_tables_on_adls(azure_spark, azurite, container):
    target = DeltaTarget(azurite.root(container, "shared"), azurite.storage_options())
    rs, spark_writer = DeltaRsWriter(), DeltaSparkWriter(azure_spark)
    rs.merge(target, batch(azure_spark, (1, "a", "c", "01")), ["My Id"], commit(1, {0: 1}), SCD1)
    spark_writer.merge(target, batch(azure_spark, (2, "b", "c", "02")), ["My Id"], commit(2, {0: 2}), SCD1)
    assert rs.read_progress(target, "cdc_assets:t").offsets == {0: 2}
    assert table_rows(azure_spark, rs, target) == table_rows(azure_spark, spark_writer, target) == [
        (1, "a", "c", "01", None), (2, "b", "c", "02", None)]


def test_another_account_key_is_refused_by_the_server(azurite, container, monkeypatch):
    # Azurite checks Shared Key signatures: so the tests above show the key named by variable reaches it.
    target = DeltaTarget(azurite.root(container, "t"), azurite.storage_options())
    monkeypatch.setenv(ACCOUNT_KEY_ENV, Azurite().account_key)
    with pytest.raises(Exception, match=r"(?i)403|authenticat|authoriz"):
        DeltaRsWriter().merge(target, batch(None, (1, "a", "c", "01")), ["My Id"], commit(1, {0: 1}), SCD1)
    monkeypatch.delenv(ACCOUNT_KEY_ENV)
    with pytest.raises(StorageConfigError, match=f"account_key_env: environment variable {ACCOUNT_KEY_ENV} is not set"):
        DeltaRsWriter().read_progress(target, "cdc_assets:t")


def test_spark_gets_an_emulators_endpoint_and_azures_own_hosts_as_they_are(azurite):
    options = azurite.storage_options()
    emulator = spark_settings(azurite.root("c", "cdc"), options, session_level=True)
    host = "cdctests.dfs.core.windows.net"
    assert emulator == {
        "fs.azure.abfs.endpoint": f"127.0.0.1:{azurite.port}", "fs.azure.account.hns.enabled": "false",
        "fs.azure.fns.account.service.type": "BLOB", "fs.azure.always.use.https": "false",
        "fs.azure.networking.library": "JDK_HTTP_URL_CONNECTION",
        f"fs.azure.account.key.{host}": "${env." + ACCOUNT_KEY_ENV + "}"}
    assert azurite.account_key not in str(emulator)  # names only, never a secret
    azure = spark_settings("abfss://c@acct.dfs.core.windows.net/cdc",
                           {"endpoint": "https://acct.blob.core.windows.net", "sas_token_env": "AZ_SAS"})
    assert azure == {"spark.hadoop.fs.azure.account.auth.type.acct.dfs.core.windows.net": "SAS",
                     "spark.hadoop.fs.azure.sas.token.provider.type.acct.dfs.core.windows.net":
                         "org.apache.hadoop.fs.azurebfs.sas.FixedSASTokenProvider",
                     "spark.hadoop.fs.azure.sas.fixed.token.acct.dfs.core.windows.net": "${env.AZ_SAS}"}
    on_adls = spark_config(delta_root=azurite.root("c", "cdc"), storage_options=options)
    classpath = on_adls["spark.driver.extraClassPath"]
    assert "hadoop-azure-" in classpath and "hadoop-aws" not in classpath


def load(delta: str) -> None:
    parse_config(f"kafka: {{bootstrap_servers: x}}\ndelta: {delta}\n"
                 "connectors: [{name: c, kind: postgresql, topic.prefix: p, tables: [{name: s.t}]}]\n", "p.yaml")


def test_azure_and_gcs_settings_are_refused_at_load_naming_the_field():
    with pytest.raises(ConfigError, match=re.escape("delta.storage_options.account_key carries a secret")):
        load("{root: 'abfss://c@acct.dfs.core.windows.net/cdc', storage_options: {account_key: inline}}")
    with pytest.raises(ConfigError, match=re.escape("delta.storage_options.account_name is missing")):
        load("{root: 'az://c/cdc', storage_options: {account_key_env: K}}")
    with pytest.raises(ConfigError, match=re.escape("delta.storage_options.endpoint: its path names account "
                                                    "'other', the root's account is 'acct'")):
        load("{root: 'abfs://c@acct.dfs.core.windows.net/cdc', "
             "storage_options: {endpoint: 'http://127.0.0.1:10000/other', account_key_env: K}}")
    with pytest.raises(ConfigError, match=re.escape("delta.storage_options.endpoint: '127.0.0.1:10000' is not")):
        load("{root: 'abfs://c@acct.dfs.core.windows.net/cdc', "
             "storage_options: {endpoint: '127.0.0.1:10000', account_key_env: K}}")
    load("{root: 'az://c/cdc', storage_options: {account_name: devstoreaccount1, use_emulator: 'true'}}")
    with pytest.raises(ConfigError, match=re.escape("delta.root: 'az://c/cdc' is delta-rs's scheme")):
        load("{root: 'az://c/cdc', writer: delta-spark, storage_options: {account_name: a, account_key_env: K}}")
    with pytest.raises(ConfigError, match=re.escape("delta.storage_options.service_account_key carries a secret")):
        load("{root: 'gs://b/cdc', storage_options: {service_account_key: '{\"private_key\": \"x\"}'}}")
    with pytest.raises(ConfigError, match=re.escape("service_account_path and service_account_key_env both name")):
        load("{root: 'gs://b/cdc', storage_options: {service_account_path: /k.json, service_account_key_env: K}}")
    load("{root: 'gs://b/cdc', storage_options: {service_account_key_env: GCS_KEY}}")


DOCS = Path(__file__).resolve().parents[2] / "docs" / "storage.md"


def test_the_storage_docs_adls_config_works_as_written(monkeypatch):
    # The ADLS block of docs/storage.md, pointed at an Azurite holding its account by the variables it
    # reads, commits a batch to its root as written (delta-rs: the docs' abfss:// is TLS for ABFS).
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), re.DOTALL) if "abfss://" in b)
    with Azurite(account="myaccount") as server:
        monkeypatch.setenv("AZURE_STORAGE_ENDPOINT", server.endpoint)
        monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", server.account_key)
        delta = parse_config(block, "docs/storage.md").delta
        assert delta.root == "abfss://lake@myaccount.dfs.core.windows.net/cdc"
        server.create_container("lake")
        target = DeltaTarget(f"{delta.root}/t", delta.storage_options)
        DeltaRsWriter().merge(target, batch(None, (1, "a", "c", "01")), ["My Id"], commit(1, {0: 1}), SCD1)
        assert DeltaRsWriter().read_progress(target, "cdc_assets:t").offsets == {0: 1}
        assert "cdc/t/_delta_log/00000000000000000000.json" in server.blobs("lake", "cdc/t/")  # on the server
