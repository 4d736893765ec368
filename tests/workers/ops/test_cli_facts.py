"""`pvm facts list|show|history|promote|retract`, `pvm learn` and `pvm recall` against a real `pvm serve`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from pvm.config import Settings
from tests.workers.api.test_api_facts import APOLLO_ONLY, CURATOR, FactsFeed, write_tokens
from tests.workers.ops.test_cli import run_cli, serving


@dataclass
class Cli:
    env: dict[str, str]
    feed: FactsFeed

    def run(self, *args: str, token: str = CURATOR) -> tuple[int, str, str]:
        out = run_cli(list(args), {**self.env, "PVM_API_TOKEN": token})
        return out.returncode, out.stdout, out.stderr

    def json(self, *args: str) -> dict[str, object]:
        code, stdout, stderr = self.run(*args, "--json")
        assert code == 0, stderr
        answer: dict[str, object] = json.loads(stdout)
        return answer


@pytest.fixture
def cli(redis_client: redis.Redis, settings: Settings, tmp_path: Path) -> Iterator[Cli]:
    tokens = tmp_path / "tokens.json"
    write_tokens(tokens)
    with serving(settings, "127.0.0.1", None, {"PVM_API_TOKENS_FILE": str(tokens)}) as served:
        yield Cli({"PVM_API_URL": served.url}, FactsFeed(redis_client, settings))


def test_learn_recall_list_show_history_promote_and_retract(cli: Cli) -> None:
    code, out, err = cli.run("learn", "deploy window", "Tue 10:00", "--project", "apollo", "--agent", "ops")
    assert code == 0 and "learned 'deploy window': fact " in out, err
    code, out, err = cli.run("recall", "deploy window", "--project", "apollo")
    assert code == 1 and out == "" and "nothing learned as 'deploy window'" in err  # not applied yet
    [minute] = cli.feed.settle()
    assert minute.event_type == "fact_learned" and minute.agent_id == "ops"
    assert cli.run("recall", "deploy window", "--project", "apollo") == (0, "Tue 10:00\n", "")
    recalled = cli.json("recall", "deploy window", "--project", "apollo")
    assert recalled["searched"] == ["project:apollo", "global"]

    learned = cli.json("learn", "runner", "ubuntu-24", "--project", "apollo", "--task-id", "T-1")
    cli.feed.settle()
    fact_id = str(learned["fact_id"])
    code, table, _ = cli.run("facts", "list", "--project", "apollo", "--task", "T-1")
    assert code == 0 and table.splitlines()[0].split()[:4] == ["ID", "TIER_KEY", "TYPE", "STATUS"]
    assert fact_id in table and "ubuntu-24" in table and "Tue 10:00" in table
    listed = cli.json("facts", "list", "--project", "apollo", "--tier", "task", "--task", "T-1")
    assert [f["id"] for f in listed["facts"]] == [fact_id]  # type: ignore[index, union-attr]
    code, shown, _ = cli.run("facts", "show", fact_id, "--project", "apollo")
    assert code == 0 and f"id: {fact_id}" in shown and "tier_key: task:apollo:T-1" in shown
    assert cli.json("facts", "show", fact_id, "--project", "apollo")["value"] == "ubuntu-24"

    promoted = cli.json("facts", "promote", fact_id, "--project", "apollo", "--to-tier", "project")
    cli.feed.settle()
    copy = str(promoted["fact_id"])
    assert cli.json("facts", "show", copy, "--project", "apollo")["promoted_from"] == fact_id
    code, out, _ = cli.run("facts", "retract", copy, "--project", "apollo", "--reason", "task only")
    assert code == 0 and out.startswith(f"retracted: fact {copy}")
    cli.feed.settle()
    history = cli.json("facts", "history", copy, "--project", "apollo")
    assert [f["status"] for f in history["facts"]] == ["retracted"]  # type: ignore[index, union-attr]
    code, table, _ = cli.run("facts", "list", "--project", "apollo", "--status", "retracted")
    assert copy in table


def test_errors_are_one_line_naming_the_fix(cli: Cli) -> None:
    code, _, err = cli.run("facts", "list", "--project", "apollo", "--tier", "global", token=APOLLO_ONLY)
    assert code == 1 and err.count("\n") == 1 and "global tier" in err and "pvm token new --global" in err
    missing = "00000000-0000-5000-8000-000000000000"
    code, _, err = cli.run("facts", "show", missing, "--project", "apollo")
    assert code == 1 and err.startswith("pvm: the reader API refused the request (404)") and missing in err
    code, _, err = cli.run("facts", "list", "--project", "apollo", "--as-of", "yesterday")
    assert code == 1 and "as_of" in err
    code, _, err = cli.run("facts", "list", "--project", "apollo", "--limit", "0")
    assert code == 2 and "must be at least 1" in err  # a usage error, before any request
    assert cli.feed.written() == []
