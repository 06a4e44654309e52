"""The Dagster UI in a real browser, following the README's tour: `scripts/demo --ui` (a local broker, the
sample, a merge, `dagster dev`), a round of changes (`scripts/demo --changes`) materialized from the UI,
driven by headless Chromium. The tour's screenshots land in docs/images/."""

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cdc_assets.demo.broker import free_port
from tests.support.ui import until_ui

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "docs" / "images"
ARTIFACTS = ROOT / "tests" / "artifacts"  # the last page seen, for a failure's diagnosis
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.browser


@pytest.fixture
def tour(tmp_path):
    """The tour's first terminal: `scripts/demo --ui` on a `.cdc-demo` and ports of the test's own (the env
    vars it reads), until Ctrl-C at the end; yields the UI's URL and the demo's environment."""
    if not Path(CHROMIUM).exists():
        pytest.skip("Chromium is not installed (scripts/setup-tests installs Debian's chromium)")
    port = free_port()
    env = {**os.environ, "CDC_DEMO_DIR": str(tmp_path / ".cdc-demo"), "CDC_DEMO_UI_PORT": str(port),
           "CDC_DEMO_BROKER_PORT": str(free_port()), "PYTHONPATH": str(ROOT)}
    env.pop("CDC_ASSETS_CONFIG", None)
    demo = subprocess.Popen(["scripts/demo", "--ui"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        until_ui(demo, port)
        yield f"http://127.0.0.1:{port}", env
    finally:
        os.killpg(demo.pid, signal.SIGINT)  # Ctrl-C
        try:
            demo.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(demo.pid, signal.SIGKILL)
            raise


def metadata_value(body: str, key: str) -> str:
    """The value shown next to a metadata key in the asset page's metadata table."""
    index = body.find(key)
    assert index >= 0, f"metadata '{key}' is not shown on the asset page"
    cells = [line.strip() for line in body[index:index + 300].splitlines() if line.strip()]
    return cells[2]  # key, timestamp, value


def graph_when_loaded(page, timeout_s: float = 60.0) -> str:
    """The asset graph's text once no node is still fetching its status."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = page.locator("body").inner_text()
        if "fetching statuses" not in text and "Loading" not in text:
            return text
        assert time.monotonic() < deadline, f"the graph's statuses did not load: {text[-3000:]}"
        page.wait_for_timeout(500)


def test_the_tour_in_the_ui(tour):
    from playwright.sync_api import sync_playwright

    base, env = tour
    IMAGES.mkdir(parents=True, exist_ok=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    location = f"{base}/locations/__repository__@cdc_assets.definitions/jobs"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        try:
            # The demo's instance turns Dagster's "Join the community" dialog off: should it open, it is skipped
            # (so that the tour goes on) and counted (so that the test fails at its end).
            skip, dialogs = page.get_by_role("button", name="Skip"), []
            page.add_locator_handler(skip, lambda: (dialogs.append(page.url), skip.click()))

            # Step 1: the demo's merge is already there, with its materializations.
            page.goto(base + "/assets/dbserver1/inventory/products")
            page.get_by_text("rows_inserted").first.wait_for(timeout=60_000)
            assert int(metadata_value(page.locator("body").inner_text(), "rows_inserted")) == 10

            # Step 2: a round of changes, materialized from the UI.
            changes = subprocess.run(["scripts/demo", "--changes"], cwd=ROOT, env=env, capture_output=True, text=True,
                                     timeout=300)
            assert changes.returncode == 0 and "change round 1: published" in changes.stdout, changes.stderr
            page.goto(base + "/asset-groups")
            materialize_all = page.get_by_role("button", name="Materialize all")
            materialize_all.wait_for(timeout=60_000)
            for group in ("inventory", "sales"):
                assert page.get_by_text(group, exact=True).first.is_visible()
            # Every group expanded (the graph's own shortcut, ⌥E, kept in the page's address: the reload lays the
            # expanded graph out to fit), then each asset's status loaded: the tables materialized, the topics
            # observed by the demo (none "Never observed").
            page.keyboard.press("Alt+KeyE")
            page.wait_for_url("**expanded=*", timeout=60_000)
            page.reload()
            page.get_by_text("orders", exact=True).first.wait_for(timeout=60_000)
            graph = graph_when_loaded(page)
            assert "Never observed" not in graph and graph.count("Observed") >= 3, graph[-3000:]
            page.screenshot(path=str(IMAGES / "asset_graph.png"))

            # Wait for the launch request's answer: leaving the page before it arrives would cancel the launch.
            def launch(response):
                return "graphql" in response.url and "LaunchPipelineExecution" in (response.request.post_data or "")

            with page.expect_response(launch, timeout=120_000) as launched:
                materialize_all.click()
            # The UI runs the first job (by name) holding the selected tables, with that job's checks of them:
            # CDC_merge_from_UI, each table's blocking checks only (not the 15 of Dagster's own asset job): the key
            # check, and on PostgreSQL's tables the unavailable values' check.
            selector = json.loads(launched.value.request.post_data)["variables"]["executionParams"]["selector"]
            assert selector["pipelineName"] == "CDC_merge_from_UI", selector
            checks = selector["assetCheckSelection"]
            assert sorted((check["name"], "/".join(check["assetKey"]["path"])) for check in checks) == [
                ("primary_key", "dbserver1/inventory/customers"), ("primary_key", "dbserver1/inventory/products"),
                ("primary_key", "server1/dbo/orders"),
                ("unavailable_values_kept", "dbserver1/inventory/customers"),
                ("unavailable_values_kept", "dbserver1/inventory/products")], checks
            page.goto(base + "/assets/dbserver1/inventory/products")
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                body = page.locator("body").inner_text()
                if "delta_version" in body and int(metadata_value(body, "delta_version")) == 2:
                    break
                page.wait_for_timeout(3000)
                page.reload()
            page.get_by_text("captured by postgresql connector").first.wait_for(timeout=60_000)
            page.screenshot(path=str(IMAGES / "products_asset.png"), full_page=True)
            body = page.locator("body").inner_text()
            assert int(metadata_value(body, "delta_version")) == 2  # the round's insert, update and delete
            assert int(metadata_value(body, "rows_inserted")) == 1 and int(metadata_value(body, "rows_deleted")) == 1

            page.goto(base + "/runs")
            page.wait_for_timeout(3000)
            page.screenshot(path=str(IMAGES / "runs.png"))
            runs = page.locator("body").inner_text()
            assert "Failure" not in runs, f"a run failed: {runs[:2000]}"

            # The checks the freshness schedule runs, launched now from its job's launchpad: they pass, with
            # the lag as a duration.
            page.goto(f"{location}/cdc_freshness_job/playground")
            launch_run = page.get_by_role("button", name="Launch Run")
            launch_run.wait_for(timeout=60_000)
            launch_run.click()
            page.wait_for_timeout(5000)
            page.goto(base + "/assets/dbserver1/inventory/products?view=checks")
            page.get_by_text("capture_lag", exact=True).first.click()
            page.get_by_text("within the bound of 1 h").first.wait_for(timeout=120_000)
            page.screenshot(path=str(IMAGES / "capture_lag_check.png"), full_page=True)
            page.goto(base + "/assets/dbserver1/inventory/products?view=checks")
            page.get_by_text("freshness", exact=True).first.click()
            page.get_by_text("events_waiting").first.wait_for(timeout=60_000)
            page.screenshot(path=str(IMAGES / "freshness_check.png"), full_page=True)
            shown = page.locator("body").inner_text()
            assert "Live, on its own schedule" in shown and "nothing waits" in shown

            # The merge job's launchpad: the config a user sets, without the machine's jars and JVM flags.
            page.goto(f"{location}/cdc_merge_job/playground")
            page.get_by_role("button", name="Launch Run").wait_for(timeout=60_000)
            page.get_by_text("resources", exact=False).first.wait_for(timeout=60_000)
            page.screenshot(path=str(IMAGES / "cdc_merge_job_launchpad.png"))
            launchpad = page.locator("body").inner_text()
            assert not [key for key in ("spark.jars", "extraClassPath", "extraJavaOptions") if key in launchpad]

            # The signal jobs' launchpads: typed config for each Debezium signal.
            for job in ("incremental_snapshot_job", "pause_snapshot_job"):
                page.goto(f"{location}/{job}/playground")
                page.get_by_role("button", name="Launch Run").wait_for(timeout=60_000)
                page.get_by_text("send_", exact=False).first.wait_for(timeout=60_000)
                page.screenshot(path=str(IMAGES / f"{job}_launchpad.png"))
            assert not dialogs, f"Dagster's onboarding dialog opened on {dialogs}"
        finally:
            page.screenshot(path=str(ARTIFACTS / "last_page.png"))
            browser.close()


def test_the_components_assets_and_automation_in_the_ui(tmp_path):
    """`dg dev` on the component's example project (examples/dg_project): the asset graph shows each topic
    upstream of its Delta table, in the group the translation names; the automation page lists Dagster's
    automation sensor beside the project's sensors and schedules. Screenshots land in docs/images/."""
    from playwright.sync_api import sync_playwright

    from tests.support.component import EXAMPLE_TABLES, copy_of_example, dg_dev

    if not Path(CHROMIUM).exists():
        pytest.skip("Chromium is not installed (scripts/setup-tests installs Debian's chromium)")
    IMAGES.mkdir(parents=True, exist_ok=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with dg_dev(copy_of_example(tmp_path), tmp_path) as (base, nodes), sync_playwright() as playwright:
        assert {"/".join(node["assetKey"]["path"]) for node in nodes} >= EXAMPLE_TABLES
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        try:
            skip = page.get_by_role("button", name="Skip")  # Dagster's "Join the community" dialog

            def settled(url: str, text: str) -> str:
                """The page at ``url`` once ``text`` shows and the community dialog (which a screenshot
                does not dismiss) is gone: its text."""
                page.goto(url)
                page.get_by_text(text, exact=True).first.wait_for(timeout=60_000)
                page.wait_for_timeout(2000)  # the graph's layout settles; the dialog may open
                if skip.is_visible():
                    skip.click()
                    skip.wait_for(state="hidden")
                return page.locator("body").inner_text()

            # The graph of the translated group: each table with its topic upstream (two "products" nodes).
            settled(base + "/asset-groups/bronze_inventory", "products")
            page.screenshot(path=str(IMAGES / "component_assets.png"))
            overview = settled(base + "/assets/dbserver1/inventory/products", "products")
            # Its overview names the topic upstream, and the condition the example's post_processing set.
            assert "Upstream assets\nkafka / dbserver1 / inventory / products" in overview, overview[-3000:]
            assert "on_cron(*/5 * * * *, UTC)" in overview, overview[-3000:]
            settled(base + "/assets/dbserver1/inventory/products?view=lineage", "products")
            page.screenshot(path=str(IMAGES / "component_lineage.png"))

            # Automation: Dagster's own automation sensor (what evaluates the tables' eager conditions) and
            # the project's sensors and schedules, each with its status.
            automation = settled(base + "/automation", "events_waiting_sensor")
            page.screenshot(path=str(IMAGES / "automation.png"), full_page=True)
            for name in ("default_automation_condition_sensor", "schema_change_sensor", "cdc_freshness_schedule"):
                assert name in automation, automation[:3000]
        finally:
            page.screenshot(path=str(ARTIFACTS / "last_page.png"))
            browser.close()


RMS_PIPELINE = """\
kafka: {{bootstrap_servers: "{bootstrap}"}}
delta: {{root: "{root}", writer: delta-rs}}
freshness_schedule: {{running: false}}
connectors:
  - name: shop
    kind: postgresql
    topic.prefix: {prefix}
    tables: [{{name: inventory.items, key_columns: [id, region], path: "{path}"}}]
    rows_match_source: {{dsn_env: UI_RMS_DSN, buckets: 16, settle_timeout_s: 120}}
"""


def test_the_rows_match_source_check_with_its_metadata_in_the_ui(broker, postgres, spark, tmp_path, monkeypatch):
    """A rows_match_source evaluation that found drift (a PostgreSQL table and its Delta table, a row deleted from
    and one changed in Delta by hand), as `dagster-webserver` shows it on the table's Checks tab: what drifted,
    per bucket, with the positions and seconds. The screenshot lands in docs/images/."""
    from dagster import DagsterInstance
    from deltalake import DeltaTable
    from playwright.sync_api import sync_playwright

    from cdc_assets.config import load_config
    from cdc_assets.definitions import build_definitions
    from tests.support.reconcile import SlotAdvancer, merged_world

    if not Path(CHROMIUM).exists():
        pytest.skip("Chromium is not installed (scripts/setup-tests installs Debian's chromium)")
    world = merged_world(postgres, broker, tmp_path, "ui")
    prefix = world.prefix  # type: ignore[attr-defined]
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("nux:\n  enabled: false\ntelemetry:\n  enabled: false\n")
    (home / "pipeline.yaml").write_text(RMS_PIPELINE.format(bootstrap=broker.bootstrap_servers, root=tmp_path,
                                                            prefix=prefix, path=world.target.path))
    for name, value in {"DAGSTER_HOME": str(home), "CDC_ASSETS_CONFIG": str(home / "pipeline.yaml"),
                        "UI_RMS_DSN": world.dsn}.items():
        monkeypatch.setenv(name, value)
    table = DeltaTable(world.target.path)  # behind the pipeline's back
    table.delete("id = 5")
    table.update(updates={"name": "'by hand'"}, predicate="id = 17")
    with SlotAdvancer(world), DagsterInstance.get() as instance:
        checked = build_definitions(load_config()).resolve_job_def("shop_rows_match_source_job") \
            .execute_in_process(instance=instance)
    [failed] = checked.get_asset_check_evaluations()
    assert not failed.passed and "1 key(s) missing, 0 extra, 1 with different values" in str(failed.description), \
        failed.description
    world.connection.close()

    IMAGES.mkdir(parents=True, exist_ok=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    web = subprocess.Popen(["dagster-webserver", "-h", "127.0.0.1", "-p", str(port), "-w", "workspace.yaml"],
                           cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
            page = browser.new_page(viewport={"width": 1600, "height": 1200})
            try:
                skip = page.get_by_role("button", name="Skip")  # Dagster's "Join the community" dialog
                page.add_locator_handler(skip, lambda: skip.click())
                deadline = time.monotonic() + 180
                while True:  # the webserver loads the code location
                    assert web.poll() is None, f"dagster-webserver exited ({web.returncode})"
                    try:
                        page.goto(f"http://127.0.0.1:{port}/assets/{prefix}/inventory/items?view=checks")
                        page.get_by_text("rows_match_source", exact=True).first.wait_for(timeout=20_000)
                        break
                    except Exception:
                        assert time.monotonic() < deadline, "the UI did not show the table's checks"
                        time.sleep(2)
                page.get_by_text("rows_match_source", exact=True).first.click()
                page.get_by_text("drifted_buckets").first.wait_for(timeout=60_000)
                page.wait_for_timeout(1000)
                page.screenshot(path=str(IMAGES / "rows_match_source_check.png"), full_page=True)
                shown = page.locator("body").inner_text()
                for entry in ("source_position", "differing_at_first_look", "drifted_ranges", "waited_s"):
                    assert entry in shown, shown[-3000:]
                # The drifted buckets' JSON names the keys, each with what differs.
                page.locator("tr", has_text="drifted_buckets").get_by_text("[Show JSON]").click()
                page.get_by_text("missing: 5", exact=False).first.wait_for(timeout=30_000)
                assert "different: 17" in page.locator("body").inner_text()
            finally:
                page.screenshot(path=str(ARTIFACTS / "last_page.png"))
                browser.close()
    finally:
        os.killpg(web.pid, signal.SIGTERM)
        try:
            web.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(web.pid, signal.SIGKILL)
