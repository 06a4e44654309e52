"""How long the code location takes to load with many tables, as a run worker or `dagster definitions
validate` loads it: a fresh Python process imports ``cdc_assets.definitions`` on a config of N tables
whose Delta tables exist (so a per-table storage read would show), and resolves the asset graph.

    python -m benchmarks.code_location_load --tables 200 2000

The reference, measured in the same run, is the same process importing Dagster and the project's
modules with an empty pipeline (one table): what any load costs before the tables. Figures go to
docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

LOAD = textwrap.dedent("""
    import json, time
    started = time.perf_counter()
    from cdc_assets.definitions import defs
    graph = defs.resolve_asset_graph()
    checks = len(list(graph.asset_check_keys))
    print(json.dumps({"seconds": time.perf_counter() - started, "assets": len(list(graph.get_all_asset_keys())),
                      "checks": checks}))
""")


def write_config(root: Path, tables: int) -> Path:
    """A pipeline of ``tables`` tables over 10 connectors, each table's Delta target created."""
    lines = ["kafka: {bootstrap_servers: '127.0.0.1:9'}", f"delta: {{root: '{root / 'delta'}'}}", "connectors:"]
    per_connector = max(1, tables // 10)
    for connector in range(max(1, tables // per_connector)):
        lines += [f"  - name: c{connector}", "    kind: postgresql", f"    topic.prefix: p{connector}",
                  "    tables:"]
        for table in range(per_connector):
            lines.append(f"      - {{name: s.t{table}}}")
            write_deltalake(str(root / "delta" / f"p{connector}" / "s" / f"t{table}"),
                            pa.table({"id": pa.array([1], pa.int64())}))
    path = root / f"pipeline-{tables}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def load(config: Path) -> dict[str, float]:
    """One load in a fresh process."""
    run = subprocess.run([sys.executable, "-c", LOAD], capture_output=True, text=True, check=True,
                         env={"CDC_ASSETS_CONFIG": str(config), "PATH": "/usr/bin:/bin"})
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", type=int, nargs="+", default=[200, 2000])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        reference = statistics.median(load(write_config(root / "ref", 1))["seconds"] for _ in range(args.runs))
        print(f"reference (1 table): {reference:.2f} s")
        for tables in args.tables:
            config = write_config(root / str(tables), tables)
            results = [load(config) for _ in range(args.runs)]
            seconds = statistics.median(r["seconds"] for r in results)
            print(f"{tables} tables: {seconds:.2f} s load ({results[0]['assets']} assets, {results[0]['checks']} "
                  f"checks), {seconds / reference:.2f}x the reference, "
                  f"{(seconds - reference) / tables * 1000:.2f} ms per table")


if __name__ == "__main__":
    main()
