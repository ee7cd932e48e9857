"""The fleet, gateway and device pages in headless Chromium (tests/dashboard/browser.py) on real
data: 100 gateways heartbeating over HTTP to a real cloudd, and one real gatewayd ("site-a") fed
by ``devicesim sensors`` through a real Mosquitto, its telemetry uploaded to that cloudd. Every
panel has content, the device chart holds the very readings devicesim published (read back off
the broker by a subscriber of the test's own, matched by seq), and no page is wider than the
window at 420 or 1400 px. Saves docs/dashboard-gateway.png and docs/dashboard-device.png with
EDGEFED_UPDATE_SCREENSHOTS=1 (the test's tmp dir otherwise)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from protocol.batch import encode_batch, idempotency_key
from protocol.records import event_record
from protocol.topics import telemetry_topic
from tests.dashboard.browser import (
    assert_fits,
    browser,
    empty_panels,
    fleet_figures,
    page_errors,
    screenshot_dir,
)
from tests.dashboard.test_dashboard import GATEWAYS, SILENT, _heartbeat_fleet
from tests.harness import mqtt
from tests.harness.broker import start_broker
from tests.harness.cloud_http import call, post
from tests.harness.cloudd import OPERATOR_TOKEN as OP
from tests.harness.cloudd import cloudd_token, start_cloudd
from tests.harness.gatewayd import Gatewayd, write_config
from tests.harness.poll import wait_until
from tests.harness.processes import start_module, stop_process

pytestmark = pytest.mark.slow  # a browser, a broker, a gatewayd and a devicesim

SITE, DEVICE = "site-a", "sensor-000"


class Heard:
    """What devicesim published on the broker, per (device, seq): a subscriber of the test's own."""

    def __init__(self, port: int) -> None:
        self.readings: dict[tuple[str, int], dict] = {}
        self._lock = threading.Lock()
        self.client = mqtt.client(client_id="test-listener")
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        mqtt.subscribe(self.client, telemetry_topic(SITE, DEVICE).replace(f"/{DEVICE}/", "/+/"))

    def _on_message(self, _client, _userdata, message) -> None:
        body = json.loads(message.payload)
        with self._lock:
            self.readings[(body["device"], body["seq"])] = body["readings"]

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _alert(url: str, gateway: str) -> None:
    """One alert record uploaded by a heartbeating gateway, as its uplink sends it."""
    record = event_record(
        "cam-1",
        1.0,
        {
            "type": "sensor_detection",
            "severity": "alert",
            "score": 2.5,
            "reasons": ["temperature_c mean 41.2 > high 40.0"],
        },
    )
    status, ack = post(
        f"{url}/v1/gateways/{gateway}/batches",
        encode_batch(gateway, "cafe0001", [(1, record)]),
        {
            "Idempotency-Key": idempotency_key(gateway, "cafe0001", 1, 1),
            "Authorization": f"Bearer {cloudd_token(gateway)}",
        },
    )
    assert status == 200, ack


@pytest.mark.timeout(600)
def test_fleet_gateway_and_device_pages(tmp_path):
    shots = screenshot_dir(tmp_path)
    broker = start_broker(tmp_path / "broker")
    server = start_cloudd(tmp_path / "c", gateways=(*GATEWAYS, SITE))
    heard = Heard(broker.port)
    config, port = write_config(
        tmp_path,
        broker.url,
        gateway_id=SITE,
        cloud_url=server.url,
        token=server.token_for(SITE),
        extra='heartbeat_interval_s = 1.0\n\n[devices]\nallow = ["sensor-*"]\n',
    )
    gatewayd = Gatewayd(config, port).wait_ready()
    sim = start_module(
        "devices.cli",
        [
            "sensors",
            "--broker",
            broker.url,
            "--gateway",
            SITE,
            "--count",
            "2",
            "--rate",
            "5",
            "--duration",
            "300",
        ],
        tmp_path / "devicesim.log",
    )
    try:
        _heartbeat_fleet(server.url)
        _alert(server.url, "gw005")
        wait_until(
            lambda: call(f"{server.url}/v1/gateways/{SITE}", OP)[1],
            60,
            "site-a's devices stored in cloudd and its placement heartbeated",
            check=lambda doc: doc.get("devices") and doc["placement"] and len(doc["history"]) >= 3,
        )
        with browser() as chromium:
            page = chromium.new_page(viewport={"width": 1400, "height": 900})
            errors = page_errors(page)
            page.goto(f"{server.url}/?token={OP}#/fleet")
            page.wait_for_function(
                "document.querySelectorAll('#fleet-table tbody tr').length === 50", timeout=30_000
            )
            figures = fleet_figures(page)
            assert figures["gateways"] == 101 and figures["offline"] == len(SILENT)
            assert figures["online"] + figures["degraded"] == 101 - len(SILENT)
            backlog = sum((i * 37) % 500 for i in range(len(GATEWAYS)) if i not in SILENT)
            assert figures["records in backlogs"] >= backlog  # site-a's own backlog adds to it
            assert figures["open alerts"] >= 1  # gw005's, and any site-a's detector raised
            assert "1 of 3 tasks in the cloud" in page.inner_text(
                "#fleet-table"
            )  # gw001: detect in the cloud
            page.click("#fleet-table th[data-key='backlog_records']")
            page.click("#fleet-table th[data-key='backlog_records']")  # descending, sorted by cloudd
            page.wait_for_function(
                "document.querySelector('#fleet-table th[data-key=backlog_records]').innerText.includes('▼')"
            )
            page.click("#fleet-next")
            page.wait_for_function("document.getElementById('fleet-shown').innerText.startsWith('51–')")
            assert_fits(page, "the fleet page of 101 gateways")

            page.goto(f"{server.url}/#/gateways/{SITE}")
            page.wait_for_selector("#gw-rtt svg, #gw-rtt .nodata", timeout=30_000)
            page.wait_for_selector(f"#gw-devices a[href='#/devices/{SITE}/{DEVICE}']", timeout=30_000)
            page.wait_for_selector("#gw-backlog svg", timeout=30_000)
            page.wait_for_timeout(
                500
            )  # not a wait before an assert: the alert list's own fetch, for the picture
            assert empty_panels(page) == []
            assert "tasks in the cloud" in page.inner_text("#gw-placement")
            assert page.query_selector("#gw-disk .bar") is not None  # site-a's log against its budget
            assert "the gateway's counters" in page.inner_text("#gw-uplink")
            page.screenshot(path=str(shots / "dashboard-gateway.png"), full_page=True)
            assert_fits(page, "the gateway page")

            page.goto(f"{server.url}/#/devices/{SITE}/{DEVICE}")
            wait_until(  # half the minute the page shows, so its charts have a shape
                lambda: call(f"{server.url}/v1/devices/{SITE}/{DEVICE}", OP)[1],
                60,
                f"{DEVICE} has 30 s of stored telemetry",
                check=lambda doc: doc["window"]["messages"] >= 150,
            )
            page.select_option("#dev-window", "60")  # a minute: every message is a point
            page.wait_for_function(
                "document.getElementById('dev-resolution').innerText === 'every message'", timeout=30_000
            )
            page.wait_for_selector("#chart-temperature_c svg", timeout=30_000)
            plotted = page.evaluate(
                "() => { const n = document.getElementById('chart-temperature_c');"
                " return {points: n.plotted, seqs: n.seqs}; }"
            )
            drawn = dict(zip(plotted["seqs"], plotted["points"], strict=True))
            checked = [
                seq for seq in sorted(drawn)[:: max(1, len(drawn) // 4)] if (DEVICE, seq) in heard.readings
            ]
            assert len(checked) >= 3, (len(drawn), len(heard.readings))
            for seq in checked:  # the chart's value is the value devicesim published for that seq
                assert drawn[seq][1] == heard.readings[(DEVICE, seq)]["temperature_c"], seq
            assert empty_panels(page) == []
            page.screenshot(path=str(shots / "dashboard-device.png"), full_page=True)
            with page.expect_download() as download:
                page.click("#dev-csv")
            lines = Path(download.value.path()).read_text().splitlines()
            assert lines[0] == "ts,reading,mean,min,max,count,seq"
            exported = {
                (row[1], int(row[6])): float(row[2]) for row in (line.split(",") for line in lines[1:])
            }
            # the CSV's minute starts a moment after the chart's: the oldest checked seq may be out
            in_csv = [seq for seq in checked if ("temperature_c", seq) in exported]
            assert len(in_csv) >= len(checked) - 1
            for seq in in_csv:  # the CSV holds the values devicesim published, as the chart does
                assert exported[("temperature_c", seq)] == heard.readings[(DEVICE, seq)]["temperature_c"]
            page.select_option("#dev-window", "604800")  # a week: drawn from the 10-minute rollups
            page.wait_for_function(
                "document.getElementById('dev-resolution').innerText.includes('from 10m')", timeout=30_000
            )
            assert_fits(page, "the device page")
            page.goto(f"{server.url}/#/alerts")
            ack = "#alerts-list tr:has(a[href='#/gateways/gw005']) button[data-ack]"
            page.wait_for_selector(ack, timeout=30_000)
            page.click(ack)
            page.wait_for_function(
                "document.querySelector(\"#alerts-list tr:has(a[href='#/gateways/gw005'])\")"
                ".innerText.includes('acknowledged')"
            )
            status, doc = call(f"{server.url}/v1/alerts?gateway=gw005", OP)
            assert [a["acked_ts"] is not None for a in doc["alerts"]] == [True]
            assert errors == []
    finally:
        stop_process(sim)
        gatewayd.kill()
        heard.stop()
        server.stop()
        broker.stop()
