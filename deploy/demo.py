"""`make demo`: the product's whole loop on one machine. A broker, cloudd, gatewayd, simulated
sensors and a simulated camera (a dim site the factory scene model was not trained for); the
gateway stores and uploads the sensors' readings and its camera's frames and verdicts; a new scene
model trained in cloudd on those frames, labelled with the camera's ground truth, passes the gate
and is rolled out to the gateway as a canary (deploy/demo_loop.py); the gateway's accuracy against
the truth is printed before and after, with live progress, then a final accounting of every
sensor record sent. ``--ingest-only`` runs the sensors and the accounting alone (for long soaks).

Invariant: the demo exits 0 only if every message the broker acknowledged to the sensors is
stored in the cloud exactly once and (unless ingest-only) every step of the model loop happened.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
from demo_loop import LoopConfig, ModelLoop

from cloud.store.dataset import DatasetStore, StoredRecord
from devices.sensors import SensorRun, SentRecord, run_sensors

if TYPE_CHECKING:  # amqtt is imported only when the demo runs its own broker
    from amqtt.broker import Broker

ROOT = Path(__file__).resolve().parent.parent
GATEWAY = "gw1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def wait_http(url: str, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=1)) as resp:
                    if resp.status < 500:
                        return
            await asyncio.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {limit_s}s")


async def get_json(session: aiohttp.ClientSession, url: str, token: str | None = None) -> dict | None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=2)) as resp:
            return await resp.json() if resp.status == 200 else None
    except (TimeoutError, aiohttp.ClientError, OSError):
        return None


class EmbeddedBroker:
    """amqtt in this process: MQTT 3.1.1 only and not durable, fine for a demo, never the durable
    path (docs/architecture.md)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._broker: Broker | None = None

    async def __aenter__(self) -> str:
        from amqtt.broker import Broker

        self._broker = Broker(
            {
                "listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{self.port}"}},
                "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
            }
        )
        await self._broker.start()
        return f"mqtt://127.0.0.1:{self.port}"

    async def __aexit__(self, *exc: object) -> None:
        if self._broker is not None:
            await self._broker.shutdown()


class Demo:
    def __init__(self, args: argparse.Namespace, broker_url: str) -> None:
        self.args = args
        self.broker_url = broker_url
        self.data = self.args.data_dir.resolve()
        self.cloud_port, self.gateway_port, self.camera_port = free_port(), free_port(), free_port()
        self.token, self.operator_token = secrets.token_hex(16), secrets.token_hex(16)
        self.loop: ModelLoop | None = None
        self.children: list[tuple[str, subprocess.Popen]] = []
        self.sent = SentRecord()
        self.stop_sensors = threading.Event()

    def start_children(self) -> None:
        shutil.rmtree(self.data, ignore_errors=True)
        (self.data / "gateway").mkdir(parents=True)
        bin_dir = Path(sys.executable).parent
        logs = self.data / "logs"
        logs.mkdir()
        self._spawn(
            "cloudd",
            [
                bin_dir / "cloudd",
                "--data-dir",
                self.data / "cloud",
                "--port",
                self.cloud_port,
                "--token",
                f"{GATEWAY}={self.token}",
                "--operator-token",
                self.operator_token,
                # the canary soaks briefly: the demo shows the controller promote it when healthy
                *("--rollout-canary-soak-s", "20", "--rollout-min-frames-to-promote", "50"),
            ],
            logs,
        )
        camera = ""
        if not self.args.ingest_only:
            # a dim site (half the light the factory scene model was trained under), scenes twice as
            # brisk as the default so that a half-minute shows every class
            self._spawn(
                "devicesim-camera",
                [
                    bin_dir / "devicesim",
                    "camera",
                    "--port",
                    self.camera_port,
                    "--truth",
                    self.data / "truth.jsonl",
                ]
                + ["--fps", "8", "--width", "160", "--height", "120", "--brightness", "0.5"]
                + ["--scene-speed", "2", "--seed", str(self.args.seed)],
                logs,
            )
            camera = (
                f'blob_dir = "{self.data / "gateway-blobs"}"\nheartbeat_interval_s = 1.0\n'
                "[placement]\nenabled = false\n"
                f'[camera]\nenabled = true\nsource = "http://127.0.0.1:{self.camera_port}/stream.mjpg"\n'
                "change_detection = false\nota_poll_interval_s = 2\nshadow_every = 2\n"
                "open_timeout_s = 5.0\nread_timeout_s = 5.0\nbackoff_max_s = 1.0\n"
            )
        protocol = "3.1.1" if self.args.broker is None else "5"
        config = self.data / "gateway.toml"
        config.write_text(
            f'gateway_id = "{GATEWAY}"\ndata_dir = "gateway"\n'
            f'[mqtt]\nbroker = "{self.broker_url}"\nprotocol_version = "{protocol}"\n'
            f'[http]\nlisten = "127.0.0.1:{self.gateway_port}"\n'
            f'[uplink]\ncloud_url = "http://127.0.0.1:{self.cloud_port}"\ntoken = "{self.token}"\n{camera}'
        )
        self._spawn("gatewayd", [bin_dir / "gatewayd", "--config", config], logs)

    def _spawn(self, name: str, argv: list, logs: Path) -> None:
        log_file = open(logs / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen([str(a) for a in argv], stdout=log_file, stderr=subprocess.STDOUT)
        self.children.append((name, proc))
        print(f"started {name} (pid {proc.pid}), log in {logs / f'{name}.log'}")

    def stop_children(self) -> None:
        for name, proc in reversed(self.children):  # gateway first: it flushes, then the cloud
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    print(f"{name} did not stop within 15 s; killing it")
                    proc.kill()
                    proc.wait()
            print(f"{name} exited with {proc.returncode}")

    async def run(self) -> int:
        self.start_children()
        loop_ok = True
        try:
            await wait_http(f"http://127.0.0.1:{self.cloud_port}/healthz")
            await wait_http(f"http://127.0.0.1:{self.gateway_port}/status")
            sensor_run = SensorRun(
                broker=self.broker_url,
                gateway=GATEWAY,
                count=self.args.count,
                rate_hz=self.args.rate,
                duration_s=self.args.duration,
                seed=self.args.seed,
            )
            sensors = asyncio.get_running_loop().run_in_executor(
                None, lambda: run_sensors(sensor_run, self.stop_sensors, self._on_progress)
            )
            model_loop = asyncio.create_task(self._model_loop())
            both: list[asyncio.Future[Any]] = [sensors, model_loop]
            async with aiohttp.ClientSession() as session:
                print(f"{'time':>6} {'sent':>8} {'in log':>8} {'uploaded':>9} {'in cloud':>9}  camera")
                start = time.monotonic()
                while not (sensors.done() and model_loop.done()):
                    await self._show(session, time.monotonic() - start)
                    await asyncio.wait(both, timeout=2.0)
                self.sent = await sensors
                loop_ok = await model_loop
                print(f"sensors done: {self.sent.total} messages acknowledged by the broker; draining")
                deadline = time.monotonic() + self.args.drain_timeout
                while time.monotonic() < deadline:
                    await self._show(session, time.monotonic() - start)
                    if await asyncio.to_thread(self._telemetry_stored) >= self.sent.total:
                        break
                    await asyncio.sleep(1.0)
        finally:
            self.stop_sensors.set()
            self.stop_children()
        return self.account(loop_ok)

    async def _model_loop(self) -> bool:
        if self.args.ingest_only:
            return True
        config = LoopConfig(
            gateway=GATEWAY,
            cloud_data=self.data / "cloud",
            cloud_url=f"http://127.0.0.1:{self.cloud_port}",
            token=self.operator_token,
            ctl=Path(sys.executable).parent / "cloudctl",
            truth=self.data / "truth.jsonl",
            work=self.data / "work",
        )
        self.loop = ModelLoop(config)
        return await self.loop.run()

    def _on_progress(self, record: SentRecord) -> None:
        self.sent = record

    async def _show(self, session: aiohttp.ClientSession, elapsed: float) -> int:
        gateway = await get_json(session, f"http://127.0.0.1:{self.gateway_port}/status") or {}
        cloud = (
            await get_json(session, f"http://127.0.0.1:{self.cloud_port}/v1/status", self.operator_token)
            or {}
        )
        uplink = gateway.get("uplink", {})
        stored = cloud.get("totals", {}).get("records", 0)
        camera = self.loop.progress() if self.loop is not None else ""
        print(
            f"{elapsed:6.0f} {self.sent.total:8d} {uplink.get('backlog', '?')!s:>8} "
            f"{uplink.get('records_uploaded', '?')!s:>9} {stored:9d}  {camera}",
            flush=True,
        )
        return stored

    def _telemetry(self) -> list[StoredRecord]:
        """The telemetry cloudd stored (beside it: the gateway's sensor results and markers, and
        the results cloudd's task runner made)."""
        store = DatasetStore.open(self.data / "cloud", readonly=True)
        return [r for r in store.iter_records(GATEWAY) if r.record["kind"] == "telemetry"]

    def _telemetry_stored(self) -> int:
        return len(self._telemetry()) if (self.data / "cloud" / "meta.sqlite").exists() else 0

    def _windows_by_side(self) -> Counter[str]:
        """Sensor windows aggregated, by where the plan ran ``aggregate`` (gateway or cloudd)."""
        store = DatasetStore.open(self.data / "cloud", readonly=True)
        bodies = (r.record["body"] for r in store.iter_records(GATEWAY))
        return Counter(b["ran_at"]["aggregate"] for b in bodies if b.get("type") == "sensor_aggregate")

    def account(self, loop_ok: bool) -> int:
        """Compare what the broker acknowledged to the sensors with what the cloud stored; then the
        model loop's steps and the camera's accuracy against devicesim's truth."""
        stored = Counter((r.record["device"], r.record["body"]["seq"]) for r in self._telemetry())
        sent = {(device, seq) for device, seqs in self.sent.sent.items() for seq in seqs}
        missing = sent - stored.keys()
        duplicates = sum(n - 1 for n in stored.values() if n > 1)
        extra = stored.keys() - sent
        print("\n== summary ==")
        print(f"sent (acknowledged by the broker): {len(sent)}")
        print(f"stored in the cloud:                {sum(stored.values())} ({len(stored)} distinct)")
        print(
            f"missing: {len(missing)}   duplicates: {duplicates}   "
            f"stored but not recorded as sent: {len(extra)}"
        )
        for device, seqs in sorted(self.sent.sent.items()):
            have = sum(1 for seq in seqs if (device, seq) in stored)
            print(f"  {device}: sent {len(seqs)}, stored {have}")
        windows = self._windows_by_side()
        where = ", ".join(f"{n} at the {side}" for side, n in sorted(windows.items())) or "none"
        print(f"sensor windows aggregated: {where} (where the placement plan ran them)")
        ok = not missing and not duplicates
        print("OK: every record sent is stored exactly once" if ok else "FAILED: records lost or duplicated")
        if self.loop is not None:
            print("\n== the model loop ==")
            print(f"steps done: {' -> '.join(self.loop.steps) or 'none'}")
            print("\n".join(self.loop.report()))
            if self.loop.failed:
                print(f"FAILED: {self.loop.failed}")
            else:
                print("OK: collected, trained, gated and rolled out; accuracy measured before and after")
        return 0 if ok and loop_ok else 1


async def amain(args: argparse.Namespace) -> int:
    if args.broker:
        return await Demo(args, args.broker).run()
    async with EmbeddedBroker(free_port()) as broker_url:
        print(f"embedded broker (amqtt) on {broker_url}")
        return await Demo(args, broker_url).run()


def main() -> int:
    parser = argparse.ArgumentParser(description="edgefed demo: sensors -> gateway -> cloud")
    parser.add_argument("--duration", type=float, default=float(os.environ.get("DURATION", 30)))
    parser.add_argument("--broker", default=os.environ.get("BROKER"), help="use this broker instead of amqtt")
    parser.add_argument("--count", type=int, default=5, help="simulated sensors")
    parser.add_argument("--rate", type=float, default=10.0, help="messages per second per sensor")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--drain-timeout", type=float, default=60.0)
    parser.add_argument(
        "--data-dir", type=Path, default=ROOT / "demo-data", help="emptied first; logs and data stay there"
    )
    parser.add_argument(
        "--ingest-only",
        action="store_true",
        help="sensors and the accounting only (no camera, no model loop)",
    )
    args = parser.parse_args()
    try:
        return asyncio.run(amain(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
