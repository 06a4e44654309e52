"""How long the code location takes to load with many tables, as `dagster definitions validate` and the
code server load it: a fresh Python process loads ``cdc_assets.definitions.defs`` on a config of N tables
whose Delta tables exist (so a per-table storage read would show), builds the repository with its
jobs (what a run worker builds too) and the repository snapshot the code server serves the UI.

    python -m benchmarks.code_location_load --tables 200 2000

The reference, measured in the same run, is the same load of a pipeline of one table: what any load
costs before the tables (importing Dagster and the project's modules). The load is one thread, so
its CPU seconds are what it takes on an idle core; wall seconds grow with whatever else runs.
Figures go to docs/performance.md.
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
    started, cpu_started = time.perf_counter(), time.process_time()
    from cdc_assets.definitions import defs as load_defs
    defs = load_defs()
    imported = time.perf_counter()
    from dagster._core.remote_representation.external_data import RepositorySnap
    repository = defs.get_repository_def()
    jobs = repository.get_all_jobs()
    RepositorySnap.from_def(repository)
    graph = defs.resolve_asset_graph()
    print(json.dumps({"seconds": time.perf_counter() - started, "import_seconds": imported - started,
                      "cpu_seconds": time.process_time() - cpu_started,
                      "assets": len(list(graph.get_all_asset_keys())), "checks": len(list(graph.asset_check_keys)),
                      "ops": len({node.name for job in jobs for node in job.graph.nodes})}))
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
        reference_config = write_config(root / "ref", 1)
        references = [load(reference_config) for _ in range(args.runs)]
        reference = statistics.median(r["seconds"] for r in references)
        reference_cpu = statistics.median(r["cpu_seconds"] for r in references)
        print(f"reference (1 table): {reference:.2f} s ({reference_cpu:.2f} s CPU)")
        for tables in args.tables:
            config = write_config(root / str(tables), tables)
            results = [load(config) for _ in range(args.runs)]
            seconds = statistics.median(r["seconds"] for r in results)
            imported = statistics.median(r["import_seconds"] for r in results)
            cpu = statistics.median(r["cpu_seconds"] for r in results)
            print(f"{tables} tables: {seconds:.2f} s load ({imported:.2f} s of it the import; {results[0]['assets']} "
                  f"assets, {results[0]['checks']} checks, {results[0]['ops']} ops in the jobs), "
                  f"{seconds / reference:.2f}x the reference, "
                  f"{(seconds - reference) / tables * 1000:.2f} ms per table; CPU {cpu:.2f} s, "
                  f"{cpu / reference_cpu:.2f}x the reference's")


if __name__ == "__main__":
    main()
