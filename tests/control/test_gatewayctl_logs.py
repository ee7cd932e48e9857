"""``gatewayctl logs`` against a real mosquitto and a real gatewayd: ``--level INFO`` reads the INFO
lines beside the warnings, and ``--follow`` (a real gatewayctl process) prints each new line once, in
order, as the gateway logs it, until Ctrl-C, which ends it with exit 0."""

from __future__ import annotations

import re
import signal

from tests.harness.gatewayctl import broker_args, ctl, ctl_json
from tests.harness.poll import wait_until
from tests.harness.processes import LogFile, start_module

CHANGES = 6


def test_level_info_reads_the_info_lines_and_the_default_only_warnings(mosquitto, gatewayd):
    args = broker_args(mosquitto.url)
    ctl_json(*args, "devices", "add", "weather-1")  # an INFO line: control: revision 1 (device.add)
    code, out, err = ctl(*args, "logs", "--level", "INFO", "--limit", "500")
    assert code == 0, err
    assert "INFO    gateway.runner: gatewayd started" in out, out
    assert "control: revision 1 (device.add)" in out, out
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} INFO ", out), out  # a local time, not epoch
    answer = ctl_json(*args, "logs", "--level", "INFO")["data"]
    assert {"lines", "next", "missed", "dropped", "restarted"} <= set(answer)
    assert all(isinstance(line["ts"], float) for line in answer["lines"])  # JSON keeps the numbers
    code, out, err = ctl(*args, "logs")
    assert code == 0 and "gatewayd started" not in out and "revision 1" not in out, out


def test_follow_prints_each_new_line_once_in_order_until_ctrl_c(mosquitto, gatewayd, tmp_path):
    args = broker_args(mosquitto.url)
    output = LogFile(tmp_path / "follow.out")
    follower = start_module(
        "gateway.ctl",
        [*args, "logs", "--follow", "--level", "INFO", "--limit", "500", "--interval", "0.2"],
        output.path,
    )
    try:
        wait_until(lambda: "gatewayd started" in output.text(), 20, "the follower's first lines")
        for n in range(CHANGES):  # each change logs one INFO line that names its revision
            code, _, err = ctl(*args, "devices", "add", f"weather-{n}")
            assert code == 0, err
        last = f"control: revision {CHANGES} (device.add)"
        wait_until(lambda: last in output.text(), 20, "the last change's line in the follower's output")
        follower.send_signal(signal.SIGINT)
        assert follower.wait(10) == 0, output.text()
    finally:
        if follower.poll() is None:
            follower.kill()
    lines = output.text().splitlines()
    revisions = [
        int(m.group(1)) for line in lines if (m := re.search(r"control: revision (\d+) \(device", line))
    ]
    assert revisions == list(range(1, CHANGES + 1)), lines  # each once, in order, none skipped
    assert sum("gatewayd started" in line for line in lines) == 1, lines
    assert "Traceback" not in output.text() and "gatewayctl:" not in output.text(), lines
