"""Which of the jars that ``scripts/setup`` fetches only on request it fetches this time (``python -m`` prints them).

The base (Delta's jars, Apache Kafka's) serves the demo and any pipeline on local disk. The extras
(``spark.EXTRA_JARS``) are large or serve few: Hadoop's S3 connector with the AWS SDK bundle (about 700 MB),
its ADLS connector, Spark's Kafka connector (the benchmarks' plain-Spark references only). ``scripts/setup``
fetches those named in ``$CDC_SETUP_EXTRAS`` (comma-separated, or ``all``), and the object-store connector the
config in use needs: the one of its ``delta.root``'s store when Spark writes the tables there
(``spark.spark_writes_delta``) or reads them there (``rows_match_source``). ``scripts/setup-tests`` fetches them all.
"""

from __future__ import annotations

import os
import sys

from cdc_assets.config import ConfigError, PipelineConfig, load_config
from cdc_assets.io.spark import EXTRA_JARS, SETUP_EXTRAS_ENV_VAR, spark_writes_delta
from cdc_assets.io.storage import store_of


class SetupExtrasError(ValueError):
    """``$CDC_SETUP_EXTRAS`` names an extra that does not exist."""


def requested_extras(requested: str) -> list[str]:
    """The extras a ``$CDC_SETUP_EXTRAS`` value names (comma- or space-separated; ``all``: every one)."""
    names = [name for name in requested.replace(",", " ").split() if name]
    if "all" in names:
        return list(EXTRA_JARS)
    unknown = [name for name in names if name not in EXTRA_JARS]
    if unknown:
        raise SetupExtrasError(f"{SETUP_EXTRAS_ENV_VAR}: unknown extra {', '.join(unknown)} (expected a "
                               f"comma-separated list of {', '.join(EXTRA_JARS)}, or all)")
    return names


def config_extras(config: PipelineConfig) -> list[str]:
    """The object-store connector ``config`` needs: its ``delta.root``'s store's, when that is S3 or ADLS and a
    session of this installation writes the tables with delta-spark or reads them for ``rows_match_source`` (a
    Spark Connect server brings its own)."""
    store = store_of(config.delta.root)
    writes = spark_writes_delta(config.delta.writer, config.spark.master, config.spark.remote)
    reads = any(connector.rows_match_source is not None for connector in config.connectors)
    return [store] if store in ("s3", "azure") and (writes or reads) and not config.spark.remote else []


def setup_extras(requested: str, config: PipelineConfig | None) -> list[str]:
    """The extras to fetch, in ``EXTRA_JARS``'s order: those ``requested`` names, and those ``config`` (the
    config in use, None if it does not load) needs."""
    wanted = set(requested_extras(requested)) | set(config_extras(config) if config is not None else [])
    return [name for name in EXTRA_JARS if name in wanted]


def main() -> int:
    """Print the extras to fetch, space-separated; a config that does not load is said on stderr, not fatal."""
    requested = os.environ.get(SETUP_EXTRAS_ENV_VAR, "")
    try:
        requested_extras(requested)  # a wrong name stops the set-up before a config is even read
    except SetupExtrasError as error:
        print(f"setup: {error}", file=sys.stderr)
        return 2
    try:
        config: PipelineConfig | None = load_config()
    except ConfigError as error:
        print(f"setup: the config in use does not load, so no object-store connector is chosen for it: {error}",
              file=sys.stderr)
        config = None
    print(" ".join(setup_extras(requested, config)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
