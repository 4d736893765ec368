from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from contracts import Minute, encode_minute
from pvm.cli import main
from pvm.config import ConfigError, Settings
from pvm.stores.log import LogWriter


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "pvm.cli", *args], env={**os.environ, **env}, capture_output=True, text=True, timeout=60
    )


def test_help_lists_every_command() -> None:
    out = run_cli(["--help"], {})
    assert out.returncode == 0
    for command in ("up", "dispatch", "worker", "log", "demo"):
        assert command in out.stdout


def test_log_tail_prints_a_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setenv("PVM_HOME", str(tmp_path))
    writer = LogWriter(tmp_path / "var" / "log")
    minutes = [
        Minute(project_id="apollo", event_type="decision", agent_id="planner", memory_note=f"n{i}") for i in range(5)
    ]
    writer.append("apollo", [(m.id, f"{i}-0", encode_minute(m)) for i, m in enumerate(minutes)])
    assert main(["log", "tail", "--project", "apollo", "-n", "2"]) == 0
    table = capsys.readouterr().out
    assert "5 minutes in the log" in table and "n4" in table and "n2" not in table
    assert main(["log", "tail", "--project", "apollo", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["count"] == 5 and [m["memory_note"] for m in body["minutes"]] == ["n0", "n1", "n2", "n3", "n4"]


def test_unknown_project_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setenv("PVM_HOME", str(tmp_path))
    assert main(["log", "tail", "--project", "nope"]) == 2
    assert "no log for project 'nope'" in capsys.readouterr().err


def test_unknown_pool_and_bad_counts_are_refused() -> None:
    out = run_cli(["worker", "nosuchpool"], {"PVM_REDIS_URL": "redis://127.0.0.1:1/0"})
    assert out.returncode == 2 and "unknown pool 'nosuchpool'" in out.stderr
    out = run_cli(["worker", "log", "--processes", "0"], {})
    assert out.returncode == 2 and "at least 1" in out.stderr
    out = run_cli(["up", "--processes", "bogus=2"], {})
    assert out.returncode != 0 and "unknown pool 'bogus'" in out.stderr


def test_missing_redis_url_is_explained() -> None:
    out = run_cli(["dispatch"], {"PVM_REDIS_URL": ""})
    assert out.returncode == 2 and "PVM_REDIS_URL" in out.stderr


def test_settings_refuse_bad_values() -> None:
    with pytest.raises(ConfigError, match="PVM_SHARDS"):
        Settings.from_env({"PVM_SHARDS": "zero"})
    with pytest.raises(ConfigError, match="PVM_SHARDS"):
        Settings.from_env({"PVM_SHARDS": "0"})
    with pytest.raises(ConfigError, match="PVM_DOWNSTREAM"):
        Settings.from_env({"PVM_DOWNSTREAM": "nosuchpool"})
    s = Settings.from_env({"PVM_HOME": "/srv/pvm", "PVM_SHARDS": "8"})
    assert s.shards == 8 and str(s.log_dir) == "/srv/pvm/var/log"
    assert Settings.from_env(s.to_env()) == s
