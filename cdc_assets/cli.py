"""``cdc-assets``: the project's command line. ``cdc-assets preflight`` checks every connection of the pipeline
config the code location loads (``CDC_ASSETS_CONFIG``, else the demo's) and exits 1 when one fails."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from cdc_assets.config import CONFIG_ENV_VAR, ConfigError, load_config
from cdc_assets.preflight import results_table, run_preflight, summary


def main(argv: Sequence[str] | None = None) -> int:
    """Run the subcommand ``argv`` names; its exit status."""
    parser = argparse.ArgumentParser(prog="cdc-assets", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    preflight = commands.add_parser(
        "preflight", help="check the broker, topics, schema registry, Delta root and signal channels",
        description="Check every connection the pipeline config names, each within a time bound; exit 1 when "
                    "one fails.")
    preflight.add_argument("--config", help=f"the pipeline config (default: ${CONFIG_ENV_VAR}, else the demo's)")
    arguments = parser.parse_args(argv)
    try:
        config = load_config(arguments.config)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    results = run_preflight(config)
    print(results_table(results))
    print(summary(config, results))
    return 1 if any(result.failed for result in results) else 0


if __name__ == "__main__":
    sys.exit(main())
