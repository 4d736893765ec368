"""A real Prometheus scrapes the exporter while a backlog builds; lag and a firing lag alert come back over its API."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import yaml

from contracts import Minute, encode_minute, keys
from pvm.config import Settings
from tests.conftest import free_port
from workers.ingest.dispatcher import Dispatcher
from workers.ops.exporter import serve

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def api(port: int, path: str, **params: str) -> dict:
    url = f"http://127.0.0.1:{port}/api/v1/{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    return json.loads(urllib.request.urlopen(url, timeout=5).read())


def lag_rule() -> dict:
    """The deploy/ lag alert, with its `for:` shortened so a test can see it fire."""
    rules = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "PVMStreamLagHigh":
                return {**rule, "for": "2s"}
    raise AssertionError("deploy/prometheus/alerts.yml has no PVMStreamLagHigh alert")


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    port = free_port()
    yield port, tmp_path
    # the process is started by the test once the exporter's port is known


def test_prometheus_scrapes_lag_and_fires_the_lag_alert(
    redis_client: redis.Redis, settings: Settings, tmp_path: Path
) -> None:
    assert Path(PROMETHEUS).exists(), "prometheus is installed by `make test` (Debian package prometheus)"
    Dispatcher(redis_client, settings, consumer="c1").ensure_groups()
    exporter_port = free_port()
    server, _ = serve(redis_client, settings, port=exporter_port)
    rule = lag_rule()
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump({"groups": [{"name": "pvm-test", "rules": [rule]}]}))
    (tmp_path / "prometheus.yml").write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(tmp_path / "alerts.yml")],
                "scrape_configs": [
                    {"job_name": "pvm-exporter", "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}]}
                ],
            }
        )
    )
    prom_port = free_port()
    prom = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        backlog = 0
        lag_seen: list[float] = []
        firing = None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and firing is None:
            # the backlog builds: nobody dispatches, producers keep adding
            for _ in range(500):
                redis_client.xadd(
                    keys.stream(0), {keys.MINUTE_FIELD: encode_minute(Minute(project_id="p", event_type="message"))}
                )
            backlog += 500
            time.sleep(1)
            try:
                result = api(prom_port, "query", query='pvm_stream_lag{shard="0",group="pvm-dispatch"}')["data"][
                    "result"
                ]
                alerts = api(prom_port, "alerts")["data"]["alerts"]
            except OSError:
                continue  # Prometheus still starting
            if result:
                lag_seen.append(float(result[0]["value"][1]))
            firing = next(
                (a for a in alerts if a["labels"].get("alertname") == "PVMStreamLagHigh" and a["state"] == "firing"),
                None,
            )
        assert lag_seen, "Prometheus never returned pvm_stream_lag"
        assert lag_seen[-1] > lag_seen[0] > 0, f"lag did not grow: {lag_seen}"
        assert lag_seen[-1] <= backlog
        assert firing is not None, "PVMStreamLagHigh never fired"
        print(f"\nPrometheus query pvm_stream_lag{{shard=0}}: {lag_seen}; alert: {firing['labels']} {firing['state']}")
    finally:
        prom.terminate()
        prom.wait(10)
        server.shutdown()
