"""The Dagster UI in a real browser: `dagster dev` (webserver and daemon) on the demo config and a
local broker, driven by headless Chromium. Screenshots land in tests/artifacts/."""

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from cdc_assets.demo.broker import ApacheKafkaBroker, free_port
from cdc_assets.demo.sample import publish_sample

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.browser


@pytest.fixture
def dagster_dev(tmp_path):
    """`dagster dev` against the demo config, a fresh local broker with the sample, Delta under tmp_path."""
    if not Path(CHROMIUM).exists():
        pytest.skip("Chromium is not installed (scripts/setup installs Debian's chromium)")
    with ApacheKafkaBroker() as broker:
        publish_sample(broker.bootstrap_servers)
        home = tmp_path / "dagster_home"
        home.mkdir()
        (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
        port = free_port()
        env = {**os.environ, "CDC_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
               "CDC_DELTA_ROOT": str(tmp_path / "delta"), "CDC_DELTA_WRITER": "delta-rs",
               "DAGSTER_HOME": str(home)}
        env.pop("CDC_ASSETS_CONFIG", None)
        log = open(tmp_path / "dagster_dev.log", "wb")  # noqa: SIM115 - closed after the process
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "dagster"), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1",
             "-p", str(port)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 180
            while True:
                try:
                    urllib.request.urlopen(base + "/server_info", timeout=2)
                    break
                except OSError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise AssertionError("dagster dev did not start: "
                                             + (tmp_path / "dagster_dev.log").read_text()[-3000:]) from None
                    time.sleep(1)
            yield base
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
            log.close()


def metadata_value(body: str, key: str) -> str:
    """The value shown next to a metadata key in the asset page's metadata table."""
    index = body.find(key)
    assert index >= 0, f"metadata '{key}' is not shown on the asset page"
    cells = [line.strip() for line in body[index:index + 300].splitlines() if line.strip()]
    return cells[2]  # key, timestamp, value


def test_materialize_all_from_the_ui_and_read_the_metadata(dagster_dev):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        try:
            # Dagster's "Join the community" dialog may open at any moment and cover the page: skip it whenever.
            skip = page.get_by_role("button", name="Skip")
            page.add_locator_handler(skip, lambda: skip.click())
            page.goto(dagster_dev + "/asset-groups")
            materialize_all = page.get_by_role("button", name="Materialize all")
            materialize_all.wait_for(timeout=60_000)
            page.screenshot(path=str(ARTIFACTS / "asset_graph.png"))
            for group in ("inventory", "sales"):
                assert page.get_by_text(group, exact=True).first.is_visible()
            # Wait for the launch request's answer: leaving the page before it arrives would cancel the launch.
            def launch(response):
                return "graphql" in response.url and "LaunchPipelineExecution" in (response.request.post_data or "")

            with page.expect_response(launch, timeout=120_000):
                materialize_all.click()

            # Other runs may be listed too (the freshness schedule runs every 5 minutes): wait for this one's result.
            page.goto(dagster_dev + "/assets/dbserver1/inventory/products")
            deadline = time.monotonic() + 300
            while "rows_inserted" not in page.locator("body").inner_text() and time.monotonic() < deadline:
                page.wait_for_timeout(3000)
                page.reload()
            page.goto(dagster_dev + "/runs")
            page.wait_for_timeout(3000)
            page.screenshot(path=str(ARTIFACTS / "runs.png"))
            runs = page.locator("body").inner_text()
            assert "Failure" not in runs, f"a run launched from the UI failed: {runs[:2000]}"

            page.goto(dagster_dev + "/assets/dbserver1/inventory/products")
            page.get_by_text("rows_inserted").first.wait_for(timeout=60_000)
            # The description renders on its own; reading the page before it shows would race it.
            page.get_by_text("captured by postgresql connector").first.wait_for(timeout=60_000)
            page.screenshot(path=str(ARTIFACTS / "products_asset.png"), full_page=True)
            body = page.locator("body").inner_text()
            assert int(metadata_value(body, "rows_inserted")) == 10
            assert int(metadata_value(body, "delta_version")) >= 1
            assert "inventory.products captured by postgresql connector" in body

            # The live freshness check, run by its own job (as its schedule does), on the asset's checks tab.
            location = f"{dagster_dev}/locations/__repository__@cdc_assets.definitions/jobs"
            page.goto(f"{location}/cdc_freshness_job/playground")
            launch = page.get_by_role("button", name="Launch Run")
            launch.wait_for(timeout=60_000)
            launch.click()
            page.wait_for_timeout(5000)
            page.goto(dagster_dev + "/assets/dbserver1/inventory/products?view=checks")
            page.get_by_text("freshness", exact=True).first.click()
            page.get_by_text("events_waiting").first.wait_for(timeout=60_000)
            page.screenshot(path=str(ARTIFACTS / "freshness_check.png"), full_page=True)
            shown = page.locator("body").inner_text()
            assert "Live, on its own schedule" in shown and "events_waiting" in shown

            # The signal jobs' launchpads: typed config for each Debezium signal.
            for job in ("incremental_snapshot_job", "pause_snapshot_job"):
                page.goto(f"{location}/{job}/playground")
                page.get_by_role("button", name="Launch Run").wait_for(timeout=60_000)
                page.get_by_text("send_", exact=False).first.wait_for(timeout=60_000)
                page.screenshot(path=str(ARTIFACTS / f"{job}_launchpad.png"))
        finally:
            page.screenshot(path=str(ARTIFACTS / "last_page.png"))
            browser.close()
