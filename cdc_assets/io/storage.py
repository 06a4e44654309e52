"""Where the Delta tables live: ``delta.root`` and ``delta.storage_options``, for both writers.

The one place that turns the config's storage settings into what each writer takes:
- ``delta_rs_options``: delta-rs's ``storage_options`` (its own option names, secrets read now from the
  environment variables the config names);
- ``spark_settings``: Spark's Hadoop file-system settings (S3A, ABFS, GCS connector), secrets as Hadoop
  ``${env.NAME}`` references that the JVM resolves from its own environment, so no secret is ever
  written into Spark's settings, a command line, Dagster's resource config or a log;
- ``spark_path``: the path Spark opens (``s3://`` is ``s3a://``: Hadoop's S3 connector).

Options use delta-rs's names (``endpoint``, ``region``, ``allow_http``, ``account_name``, ...); a secret is
never written inline but named by ``<option>_env: ENV_VAR`` (``secret_access_key_env: AWS_SECRET_ACCESS_KEY``),
as the Kafka secrets are. ``docs/storage.md`` lists them for S3, ADLS and GCS.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Literal
from urllib.parse import urlparse

Store = Literal["local", "s3", "azure", "gcs", "other"]

ENV_SUFFIX = "_env"
# Options that carry a secret: only their ``_env`` form is taken.
_SECRET_OPTION = re.compile(r"(secret|key|token|password|sas|credential)", re.IGNORECASE)
_SCHEMES: dict[str, Store] = {"s3": "s3", "s3a": "s3", "abfss": "azure", "abfs": "azure", "az": "azure",
                              "gs": "gcs"}
# Options by their short name: delta-rs takes each with its store's prefix too (aws_region, azure_storage_...).
_PREFIXES = ("aws_", "azure_storage_", "azure_", "google_")
_S3A = "fs.s3a."
# delta-rs 1.x commits to S3 with a conditional put (If-None-Match: *): options that seem to change that, and why not.
_S3_COMMIT_OPTIONS = {
    "s3_locking_provider": "delta-rs 1.x has no DynamoDB locking provider (it logs an error and ignores the option)",
    "s3_allow_unsafe_rename": "delta-rs 1.x ignores it",
}


class StorageConfigError(ValueError):
    """The storage settings cannot reach the tables; the message names the ``delta`` field."""


def store_of(root: str) -> Store:
    """Which kind of store ``root`` (a Delta root or table path) is on: a URL's scheme, else local disk;
    ``other`` for a scheme the project has no settings for (hdfs://, ...): left to the writers as it is."""
    scheme = urlparse(root).scheme.lower() if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", root) else ""
    if scheme in ("", "file"):
        return "local"
    return _SCHEMES.get(scheme, "other")


def spark_path(path: str) -> str:
    """The path Spark opens for a table path: ``s3://`` as ``s3a://`` (Hadoop's S3 connector); others as they are."""
    return "s3a://" + path[len("s3://"):] if path.startswith("s3://") else path


def _short(name: str) -> str:
    lowered = name.lower()
    for prefix in _PREFIXES:
        if lowered.startswith(prefix):
            return lowered[len(prefix):]
    return lowered


def _option(options: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    """The first option given under one of ``names`` (short names; any store prefix): (its key, value)."""
    for key, value in options.items():
        if _short(key) in names:
            return key, value
    return None


def _secret_env(options: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    """The ``<name>_env`` option naming a secret's environment variable: (its key, the variable's name)."""
    return _option(options, *(name + ENV_SUFFIX for name in names))


def check_storage(root: str, options: Mapping[str, str]) -> None:
    """Refuse settings that cannot work, naming the field: inline secrets, an unknown scheme, half a
    credential, or a store without one. Never reads or shows a secret."""
    for key in options:
        if _SECRET_OPTION.search(key) and not key.lower().endswith(ENV_SUFFIX):
            raise StorageConfigError(f"delta.storage_options.{key} carries a secret: name the environment variable "
                                     f"that holds it ({key}{ENV_SUFFIX}: VAR), never inline")
    store = store_of(root)
    if store == "s3":
        key_id, secret = _secret_env(options, "access_key_id"), _secret_env(options, "secret_access_key")
        if bool(key_id) != bool(secret):
            missing = "secret_access_key_env" if key_id else "access_key_id_env"
            raise StorageConfigError(f"delta.storage_options.{missing} is missing: S3 keys come as a pair "
                                     "(or neither: the AWS default credentials of each writer)")
        _check_s3_commits(options)
    elif store == "azure":
        if not _azure_account(root, options):
            raise StorageConfigError(f"delta.storage_options.account_name is missing: '{root}' does not name the "
                                     "storage account (abfss://<container>@<account>.dfs.core.windows.net/...)")
        if _option(options, "use_azure_cli", "use_emulator") is None and not any(
                _secret_env(options, name) for name in ("account_key", "sas_token", "client_secret")):
            raise StorageConfigError("delta.storage_options: an ADLS root needs a credential: account_key_env, "
                                     "sas_token_env, or client_secret_env with client_id and tenant_id")
        if _secret_env(options, "client_secret"):
            for name in ("client_id", "tenant_id"):
                if _option(options, name) is None:
                    raise StorageConfigError(f"delta.storage_options.{name} is missing: client_secret_env "
                                             "(a service principal) needs client_id and tenant_id")
        _check_azure_endpoint(root, options)
    elif store == "gcs":
        _check_gcs_credentials(options)


def _check_azure_endpoint(root: str, options: Mapping[str, str]) -> None:
    """An ``endpoint`` with a path (an emulator's, ``http://<host>:<port>/<account>``) names the root's
    account: both writers address the account by that path."""
    endpoint = _option(options, "endpoint")
    if endpoint is None:
        return
    url = urlparse(endpoint[1])
    if url.scheme not in ("http", "https") or not url.hostname:
        raise StorageConfigError(f"delta.storage_options.{endpoint[0]}: '{endpoint[1]}' is not an http(s) URL")
    in_path, account = url.path.strip("/"), _azure_account(root, options)
    if in_path and in_path != account:
        raise StorageConfigError(f"delta.storage_options.{endpoint[0]}: its path names account '{in_path}', the "
                                 f"root's account is '{account}' (an emulator's endpoint is http://<host>:<port>/"
                                 "<account>)")


def _check_gcs_credentials(options: Mapping[str, str]) -> None:
    """One GCS credential at most: a key file's path, or its JSON by environment variable (never inline)."""
    key_file = _option(options, "service_account", "service_account_path", "application_credentials")
    key_json = _secret_env(options, "service_account_key")
    if key_file and key_json:
        raise StorageConfigError(f"delta.storage_options: {key_file[0]} and {key_json[0]} both name a credential: "
                                 "give one (a key file serves both writers)")


def _check_s3_commits(options: Mapping[str, str]) -> None:
    """Refuse options that would leave two runs' commits of one S3 table unsafe, or seem to change how
    they are made: delta-rs's conditional put is what makes them safe (docs/storage.md, Commits)."""
    for key, value in options.items():
        why = _S3_COMMIT_OPTIONS.get(_short(key))
        if why is None and _short(key) == "conditional_put" and value.strip().lower() == "disabled":
            why = "without conditional puts delta-rs cannot commit to S3 at all"
        if why is not None:
            raise StorageConfigError(
                f"delta.storage_options.{key}: {why}. Commits to S3 are conditional puts (If-None-Match: *), "
                "which AWS S3 and most S3-compatible stores honour: of two commits of one version one fails. "
                "Remove the option; a store without conditional puts cannot hold these tables safely")


def delta_rs_options(options: Mapping[str, str]) -> dict[str, str]:
    """delta-rs ``storage_options`` for the config's: each ``<option>_env: VAR`` becomes ``<option>``
    with the value of ``$VAR``, read now (a missing variable is named, with its field); an ``http://``
    endpoint allows HTTP unless ``allow_http`` says otherwise."""
    resolved: dict[str, str] = {}
    endpoint = _option(options, "endpoint", "endpoint_url")
    if endpoint and endpoint[1].startswith("http://") and _option(options, "allow_http") is None:
        resolved["allow_http"] = "true"  # the endpoint names plain HTTP itself, as S3A takes it
    for key, value in options.items():
        if key.lower().endswith(ENV_SUFFIX):
            if value not in os.environ:
                raise StorageConfigError(f"delta.storage_options.{key}: environment variable {value} is not set")
            resolved[key[:-len(ENV_SUFFIX)]] = os.environ[value]
        else:
            resolved[key] = value
    return resolved


def _env_reference(variable: str) -> str:
    """A Hadoop setting's value read from the JVM's environment when the setting is read."""
    return "${env." + variable + "}"


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("true", "1", "yes")


def _azure_account(root: str, options: Mapping[str, str]) -> str | None:
    given = _option(options, "account_name")
    if given:
        return given[1]
    host = urlparse(root).hostname or ""
    return host.split(".")[0] if "." in host else None


def spark_settings(root: str, options: Mapping[str, str], session_level: bool = False) -> dict[str, str]:
    """Spark's Hadoop file-system settings for the store of ``root`` (none for local disk), secrets as
    ``${env.VAR}`` references. ``session_level``: for a Spark Connect session of a remote server,
    Hadoop keys as session settings (a session's settings reach its Hadoop configuration); else
    ``spark.hadoop.`` ones, set when the JVM starts."""
    store = store_of(root)
    hadoop = {"s3": _s3a_settings, "azure": _abfs_settings, "gcs": _gcs_settings}.get(store)
    if hadoop is None:
        return {}
    prefix = "" if session_level else "spark.hadoop."
    return {prefix + key: value for key, value in hadoop(root, options).items()}


def _s3a_settings(root: str, options: Mapping[str, str]) -> dict[str, str]:
    settings: dict[str, str] = {}
    endpoint = _option(options, "endpoint", "endpoint_url")
    if endpoint:
        settings[_S3A + "endpoint"] = endpoint[1]
        if endpoint[1].startswith("http://"):
            settings[_S3A + "connection.ssl.enabled"] = "false"
    region = _option(options, "region", "default_region")
    if region:
        settings[_S3A + "endpoint.region"] = region[1]
    if _true((_option(options, "allow_http") or ("", ""))[1]):
        settings[_S3A + "connection.ssl.enabled"] = "false"
    virtual_hosted = _option(options, "virtual_hosted_style_request")
    # delta-rs addresses a bucket by path unless told otherwise; S3A by host name: they must agree.
    if virtual_hosted or endpoint:
        settings[_S3A + "path.style.access"] = str(not _true(virtual_hosted[1] if virtual_hosted else None)).lower()
    key_id, secret = _secret_env(options, "access_key_id"), _secret_env(options, "secret_access_key")
    if key_id and secret:
        settings[_S3A + "access.key"] = _env_reference(key_id[1])
        settings[_S3A + "secret.key"] = _env_reference(secret[1])
        token = _secret_env(options, "session_token", "token")
        if token:
            settings[_S3A + "session.token"] = _env_reference(token[1])
            settings[_S3A + "aws.credentials.provider"] = \
                "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        else:
            settings[_S3A + "aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
    return settings


def _abfs_settings(root: str, options: Mapping[str, str]) -> dict[str, str]:
    account = _azure_account(root, options)
    host = f"{account}.dfs.core.windows.net"
    settings = _abfs_endpoint_settings(options)
    account_key = _secret_env(options, "account_key", "access_key")
    sas = _secret_env(options, "sas_token", "sas_key")
    client_secret = _secret_env(options, "client_secret")
    if account_key:
        settings[f"fs.azure.account.key.{host}"] = _env_reference(account_key[1])
    elif sas:
        settings[f"fs.azure.account.auth.type.{host}"] = "SAS"
        settings[f"fs.azure.sas.token.provider.type.{host}"] = \
            "org.apache.hadoop.fs.azurebfs.sas.FixedSASTokenProvider"
        settings[f"fs.azure.sas.fixed.token.{host}"] = _env_reference(sas[1])
    elif client_secret:
        client_id, tenant_id = _option(options, "client_id"), _option(options, "tenant_id")
        settings[f"fs.azure.account.auth.type.{host}"] = "OAuth"
        settings[f"fs.azure.account.oauth.provider.type.{host}"] = \
            "org.apache.hadoop.fs.azurebfs.oauth2.ClientCredsTokenProvider"
        settings[f"fs.azure.account.oauth2.client.id.{host}"] = client_id[1] if client_id else ""
        settings[f"fs.azure.account.oauth2.client.secret.{host}"] = _env_reference(client_secret[1])
        settings[f"fs.azure.account.oauth2.client.endpoint.{host}"] = \
            f"https://login.microsoftonline.com/{tenant_id[1] if tenant_id else ''}/oauth2/token"
    return settings


def _abfs_endpoint_settings(options: Mapping[str, str]) -> dict[str, str]:
    """ABFS's settings for an ``endpoint`` other than Azure's, ``http[s]://<host>:<port>/<account>`` (an
    emulator such as Azurite, which serves the Blob API only): ABFS takes ``<host>:<port>`` and adds the
    account to the path itself, talks to it through its Blob-endpoint client as to a flat-namespace
    account, and over plain HTTP for an ``http://`` endpoint (its default client speaks only TLS)."""
    endpoint = _option(options, "endpoint")
    url = urlparse(endpoint[1]) if endpoint else None
    if url is None or url.path.strip("/") == "":  # Azure's own host names (private endpoints too): as they are
        return {}
    settings = {"fs.azure.abfs.endpoint": f"{url.hostname}:{url.port or (80 if url.scheme == 'http' else 443)}",
                "fs.azure.account.hns.enabled": "false", "fs.azure.fns.account.service.type": "BLOB"}
    if url.scheme == "http":
        settings["fs.azure.always.use.https"] = "false"
        settings["fs.azure.networking.library"] = "JDK_HTTP_URL_CONNECTION"
    return settings


def _gcs_settings(root: str, options: Mapping[str, str]) -> dict[str, str]:
    settings = {"fs.gs.impl": "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFileSystem",
                "fs.AbstractFileSystem.gs.impl": "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFS"}
    key_file = _option(options, "service_account", "service_account_path", "application_credentials")
    if key_file:
        settings["fs.gs.auth.type"] = "SERVICE_ACCOUNT_JSON_KEYFILE"
        settings["fs.gs.auth.service.account.json.keyfile"] = key_file[1]
    else:
        settings["fs.gs.auth.type"] = "APPLICATION_DEFAULT"
    return settings
