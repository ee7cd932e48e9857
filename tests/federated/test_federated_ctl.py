"""``cloudctl federated start|status|stop`` against a real cloudd: no hand-written HTTP PUT."""

from __future__ import annotations

import json

from tests.harness.cloudd import start_cloudd


def test_start_status_stop_and_a_stopped_job_stays_stopped(tmp_path):
    cloudd = start_cloudd(tmp_path / "c")
    try:
        started = cloudd.ctl(
            "federated", "start", "--model", "digits", "--arch", "digits_mlp", "--width", "16"
        )
        assert started.returncode == 0 and "started at version 0" in started.stdout, started.stderr
        again = cloudd.ctl("federated", "start", "--model", "digits", "--arch", "digits_mlp", "--width", "16")
        assert again.returncode == 0 and "already running" in again.stdout
        status = json.loads(cloudd.ctl("federated", "status", "--json").stdout)
        assert status["job"]["arch"] == {"kind": "digits_mlp", "width": 16, "input_shape": None}
        assert status["version"] == 0
        assert "digits (fedbuff): version 0" in cloudd.ctl("federated", "status").stdout
        bad = cloudd.ctl("federated", "start", "--buffer-k", "0")
        assert bad.returncode == 1 and "buffer_k" in bad.stderr
        stopped = cloudd.ctl("federated", "stop")
        assert stopped.returncode == 0 and "stopped digits at version 0" in stopped.stdout
        cloudd.restart()
        assert "no federated job running" in cloudd.ctl("federated", "status").stdout
        assert cloudd.ctl("federated", "stop").returncode == 1  # none to stop: 404 no_job
    finally:
        cloudd.stop()
