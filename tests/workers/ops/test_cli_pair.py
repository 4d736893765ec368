"""`pvm pair` against a real `pvm serve`: the output from a file or stdin, a table of rounds or --json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import redis

from contracts import decode_minute, keys
from pvm.config import Settings
from tests.workers.ops.test_cli import run_cli, serving

ARGS = ["--project", "apollo", "--task", "Plan the rollout", "--criteria", "Mentions the rollback plan"]


def test_pvm_pair_judges_a_file_or_stdin_and_prints_its_rounds(
    redis_client: redis.Redis, settings: Settings, tmp_path: Path
) -> None:
    output = tmp_path / "answer.md"
    output.write_text("We ship on Monday; the rollback plan is a flag flip.\n")
    with serving(settings, "127.0.0.1", "secret") as served:
        env = {"PVM_API_URL": served.url, "PVM_API_TOKEN": "secret"}
        done = run_cli(["pair", *ARGS, "--criteria", "p99 under 200 ms", "--output", str(output)], env)
        assert done.returncode == 1, done.stderr  # below the target: exit 1, as a failed check
        lines = done.stdout.splitlines()
        assert lines[0].split() == ["ROUND", "SCORE", "JUDGE", "GAPS"]
        assert "p99 under 200 ms: missing under 200 ms, p99" in done.stdout
        assert "stopped: no_progress" in done.stdout and "score 50/100 (target 95)" in done.stdout

        piped = subprocess.run(
            [sys.executable, "-m", "workers.ops.cli", "pair", *ARGS, "--output", "-", "--task-id", "T-3", "--json"],
            input="We ship on Monday; the rollback plan is a flag flip.",
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert piped.returncode == 0, piped.stderr
        run = json.loads(piped.stdout)
        assert run["score"] == 100 and run["stopped"] == "target" and run["task_id"] == "T-3"

        refused = run_cli(["pair", *ARGS, "--output", str(tmp_path / "missing.md")], env)
        assert refused.returncode == 2 and "--output" in refused.stderr and "missing.md" in refused.stderr
    written = [
        decode_minute(fields[keys.MINUTE_FIELD])
        for shard in range(settings.shards)
        for _, fields in redis_client.xrange(keys.stream(shard))
    ]
    assert [m.event_type for m in written] == ["pair_evaluation", "pair_revision", "pair_evaluation"]


def test_pvm_pair_help_says_what_it_does() -> None:
    done = run_cli(["pair", "--help"], {})
    assert done.returncode == 0
    for words in ("--criteria", "--output", "PVM_PAIR_TARGET", "stdin", "exit"):
        assert words in done.stdout
