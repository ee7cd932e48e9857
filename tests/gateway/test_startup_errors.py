"""gatewayd refuses a config it cannot run with one line on stderr and exit 2, never a traceback:
an http.listen that is not HOST:PORT or cannot be bound, a credential file it cannot read, TLS files
that do not load, a data_dir that is not a directory (docs/gateway.md, "Exit codes")."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from tests.harness.broker import make_certs
from tests.harness.processes import free_port, run_module


def gatewayd(tmp_path: Path, body: str, data_dir: str = "data") -> subprocess.CompletedProcess:
    """gatewayd with a config of ``body`` (TOML after gateway_id and data_dir); no broker is needed:
    every case here ends before gatewayd connects to one."""
    config = tmp_path / "gw1.toml"
    config.write_text(f'gateway_id = "gw1"\ndata_dir = "{data_dir}"\n{body}')
    return run_module("gateway.daemon", ["--config", str(config)], timeout_s=30)


def one_line(result: subprocess.CompletedProcess) -> str:
    """The one line gatewayd printed for a refusal (exit 2), and nothing else."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, (result.returncode, result.stderr)
    return lines[0]


def listen(port: int | str) -> str:
    return f'[http]\nlisten = "127.0.0.1:{port}"\n'


@pytest.mark.parametrize("value", ["127.0.0.1:99999", "127.0.0.1:0", "localhost", "127.0.0.1:http"])
def test_http_listen_that_is_not_host_port_is_a_config_error(tmp_path, value):
    line = one_line(gatewayd(tmp_path, f'[http]\nlisten = "{value}"\n'))
    assert line.startswith("gatewayd: invalid config") and "http.listen" in line and value in line, line
    assert "port from 1 to 65535" in line, line


def test_http_listen_that_cannot_be_bound_names_it(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = gatewayd(tmp_path, listen(port))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]  # after the log's INFO lines of what had started
    assert last.startswith(f"gatewayd: http.listen 127.0.0.1:{port}:") and "in use" in last, last


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda path: None, "No such file or directory"),
        (lambda path: path.mkdir(), "Is a directory"),
        (lambda path: path.write_bytes(b"\xff\xfe\x00token"), "not text"),
    ],
    ids=["missing", "directory", "not-text"],
)
def test_unreadable_token_file_is_named(tmp_path, make, why):
    token_file = tmp_path / "cloud-token"
    make(token_file)
    line = one_line(gatewayd(tmp_path, listen(free_port()) + '[uplink]\ntoken_file = "cloud-token"\n'))
    assert line == f"gatewayd: uplink.token_file {token_file}: cannot read: {why}"


def test_unreadable_password_file_is_named(tmp_path):
    line = one_line(gatewayd(tmp_path, '[mqtt]\npassword_file = "no-such-password"\n' + listen(free_port())))
    missing = f"{tmp_path}/no-such-password: cannot read: No such file or directory"
    assert line == f"gatewayd: mqtt.password_file {missing}"


def test_tls_files_that_do_not_load_are_named(tmp_path):
    make_certs(tmp_path)
    (tmp_path / "notes.txt").write_text("not a certificate\n")
    mqtts = '[mqtt]\nbroker = "mqtts://127.0.0.1:8883"\n'
    missing_ca = one_line(gatewayd(tmp_path, mqtts + 'ca_file = "nope.pem"\n' + listen(free_port())))
    assert missing_ca == f"gatewayd: mqtt.ca_file {tmp_path}/nope.pem: cannot read: No such file or directory"
    not_a_ca = one_line(gatewayd(tmp_path, mqtts + 'ca_file = "notes.txt"\n' + listen(free_port())))
    assert not_a_ca.startswith(f"gatewayd: mqtt.ca_file {tmp_path}/notes.txt: not a PEM certificate"), (
        not_a_ca
    )
    crossed = mqtts + 'ca_file = "ca.pem"\ncert_file = "gw1.pem"\nkey_file = "server.key"\n'  # another's key
    wrong_key = one_line(gatewayd(tmp_path, crossed + listen(free_port())))
    assert wrong_key.startswith(
        f"gatewayd: mqtt.cert_file {tmp_path}/gw1.pem with mqtt.key_file {tmp_path}/server.key: "
        "not a certificate and its key"
    ), wrong_key


def test_data_dir_that_is_a_file_is_named(tmp_path):
    (tmp_path / "state").write_text("not a directory\n")
    line = one_line(gatewayd(tmp_path, listen(free_port()), data_dir="state"))
    assert line == f"gatewayd: data_dir {tmp_path}/state is not a directory"
    inside = one_line(gatewayd(tmp_path, listen(free_port()), data_dir="state/gw1"))
    lock = f"{tmp_path}/state/gw1/gatewayd.lock"
    assert inside == f"gatewayd: data_dir {tmp_path}/state/gw1: cannot create {lock}: Not a directory"
