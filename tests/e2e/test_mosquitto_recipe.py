"""deploy/mosquitto/ as its README runs it: the certificate recipe, the password file and the ACL
made by the scripts, and mosquitto started from the shipped mosquitto.conf as the package starts it
(as root, dropping to user mosquitto), taking a TLS client by name with the CA and gatewayd with its
client certificate. The password file and the broker's key were once left root-only 0600, and
mosquitto would not start ("Unable to open pwfile")."""

from __future__ import annotations

import grp
import os
import re
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.broker import DEPLOY, Broker, SecureBroker, install_broker_files, start_mosquitto
from tests.harness.gatewayd import Gatewayd, write_secure_config
from tests.harness.mqtt import client
from tests.harness.processes import free_port

README = DEPLOY / "README.md"


def test_the_readme_shows_the_recipe_the_script_runs():
    script = (DEPLOY / "make_certs.sh").read_text()
    recipe = re.search(r"(?ms)^# --- recipe .*?---\n(.*?)^# --- end of recipe ---$", script)
    shown = re.search(r"(?s)<!-- the recipe of make_certs.sh.*?-->\n```sh\n(.*?)```", README.read_text())
    assert recipe is not None and shown is not None
    assert shown.group(1) == recipe.group(1)


def mode_and_group(path: Path) -> tuple[int, int]:
    info = path.stat()
    return stat.S_IMODE(info.st_mode), info.st_gid


def make_passwd(users: Path, output: Path, group: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MOSQUITTO_GROUP": group}
    script = str(DEPLOY / "make_passwd.sh")
    return subprocess.run(
        ["sh", script, str(users), str(output)], env=env, capture_output=True, text=True, timeout=60
    )


def test_make_passwd_leaves_the_file_to_the_brokers_group(tmp_path):
    users = tmp_path / "users.txt"
    users.write_text("gw1:secret\n")
    own_group = grp.getgrgid(os.getgid())  # a group this user may give its files to, root or not
    made = make_passwd(users, tmp_path / "passwd", own_group.gr_name)
    assert made.returncode == 0, made.stderr
    assert mode_and_group(tmp_path / "passwd") == (0o640, own_group.gr_gid)
    made = make_passwd(users, tmp_path / "passwd2", "no-such-group-edgefed")
    assert made.returncode == 0 and "no group no-such-group-edgefed" in made.stderr, made.stderr
    assert mode_and_group(tmp_path / "passwd2")[0] == 0o600  # not opened to anyone else


@pytest.fixture
def installed_broker() -> Iterator[SecureBroker]:
    """The recipe's files in a folder the mosquitto user can reach (a pytest tmp_path is 0700), the
    broker started as root from the shipped config, with nothing added: it drops to mosquitto."""
    if os.geteuid() != 0:
        pytest.skip("mosquitto drops to its own user only when started as root")
    root = Path(tempfile.mkdtemp(prefix="edgefed-broker-", dir="/tmp"))
    try:
        root.chmod(0o755)
        etc, var = root / "etc", root / "var"
        etc.mkdir(mode=0o755)
        var.mkdir()
        shutil.chown(var, "mosquitto", "mosquitto")  # as /var/lib/mosquitto is
        port, mtls_port = free_port(), free_port()
        config = etc / "mosquitto.conf"
        config.write_text(install_broker_files(etc, var, port, mtls_port))
        broker = Broker("127.0.0.1", port, start_mosquitto(config, port), config)
        yield SecureBroker(broker, port, mtls_port, etc)
        broker.stop()
    finally:
        shutil.rmtree(root)


def test_mosquitto_as_installed_reads_the_recipes_files(installed_broker, tmp_path):
    sb = installed_broker
    mosquitto = grp.getgrnam("mosquitto").gr_gid
    assert mode_and_group(sb.etc / "passwd") == (0o640, mosquitto)
    assert mode_and_group(sb.etc / "server.key") == (0o640, mosquitto)
    assert mode_and_group(sb.etc / "gw1.key")[0] == 0o600 and mode_and_group(sb.etc / "ca.key")[0] == 0o600

    # TLS by name (the certificate's DNS:localhost) with the CA, and a password
    answers: list[str] = []
    answered = threading.Event()

    def on_connect(
        _client: object, _userdata: object, _flags: object, reason: object, _props: object
    ) -> None:
        answers.append(str(reason))
        answered.set()

    operator = client(ca_file=sb.ca, username="operator", password="op-secret")
    operator.on_connect = on_connect
    operator.connect("localhost", sb.port)
    operator.loop_start()
    try:
        assert answered.wait(10) and answers == ["Success"], answers
    finally:
        operator.disconnect()
        operator.loop_stop()

    # gatewayd with its client certificate on the mutual-TLS listener
    config, http_port = write_secure_config(tmp_path, sb, mtls=True)
    Gatewayd(config, http_port).wait_ready().kill()
    assert "Unable to" not in sb.broker.log(), sb.broker.log()  # "Unable to open pwfile", "... key file"
