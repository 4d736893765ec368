"""Shared fixtures: a real Redis server (embedded Valkey unless PVM_TEST_REDIS_URL is set) and isolated settings.

The suite never reads production's PVM_REDIS_URL: it is taken out of the environment
for the whole session, so no test and no child process a test starts can reach it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from hypothesis import settings as hypothesis_settings

from pvm.config import Settings
from tests.redis_under_test import PRODUCTION_URL_ENV, TEST_URL_ENV, contents_refusal, redacted, url_refusal
from tests.workers.jobs import TEST_JOB_FUNCTIONS
from workers.runtime.embedded import EmbeddedRedis
from workers.runtime.embedded import free_port as free_port  # the tests' free port is the embedded server's

# Timing goals live in benchmarks (bench/*.py), never in unit tests: no property test fails because one example
# took longer than Hypothesis's default 200 ms on a loaded 2-core machine (that would be a flake, not a finding).
# A test that sets its own `deadline` keeps it.
hypothesis_settings.register_profile("pvm", deadline=None)
hypothesis_settings.load_profile("pvm")

# The OpenAI-compatible server (fixture `openai_server`) every test module may use.
pytest_plugins = ["tests.openai_server"]

production_url = pytest.StashKey[str | None]()

# Marked `integration` here, so the modules stay as they are: whole modules, or module::test (every
# parametrization). They start processes or servers of their own (the CLI, workers, pytest, mypy,
# promtool, a second Valkey), or run a property check through log, RQ worker, engine and reader.
# `make test-fast` leaves them out; `make test` runs them. tests/test_markers.py checks each name exists.
INTEGRATION = (
    "tests/test_chaos.py",
    "tests/test_facts_chaos.py",
    "tests/test_ingest_e2e.py",
    "tests/test_memory_e2e.py",
    "tests/test_prometheus.py",
    "tests/test_typecheck.py",
    "tests/test_up.py",
    "tests/workers/runtime/test_stack.py",
    "tests/deploy/test_deploy_files.py::test_alerts_fire_when_they_should_and_stay_quiet_otherwise",
    "tests/deploy/test_deploy_files.py::test_promtool_accepts_the_alert_rules",
    "tests/deploy/test_deploy_files.py::test_promtool_accepts_the_config_and_its_rule_files",
    "tests/deploy/test_deploy_files.py::test_promtool_parses_every_dashboard_query",
    "tests/deploy/test_deploy_files.py::test_the_index_alert_says_which_sign_fired",
    "tests/deploy/test_deploy_files.py::test_the_metric_list_matches_what_the_exporter_serves",
    "tests/pvm/test_log_store.py::test_concurrent_writer_processes_never_duplicate",
    "tests/pvm/test_reader.py::test_no_read_ever_returns_another_projects_minutes",
    "tests/pvm/test_vector_engines.py::test_edge_allows_one_owner_per_directory",
    "tests/workers/ops/test_cli.py::test_a_token_from_token_new_reaches_its_project_through_pvm_serve",
    "tests/workers/ops/test_cli.py::test_an_open_api_beyond_loopback_warns_once_and_works_as_before",
    "tests/workers/ops/test_cli.py::test_context_against_a_token_protected_api",
    "tests/workers/ops/test_cli.py::test_context_for_an_unknown_project_says_so",
    "tests/workers/ops/test_cli.py::test_help_lists_every_command",
    "tests/workers/ops/test_cli.py::test_missing_redis_url_is_explained",
    "tests/workers/ops/test_cli.py::test_serve_with_an_unusable_tokens_file_exits_with_one_line",
    "tests/workers/ops/test_cli.py::test_unknown_pool_and_bad_counts_are_refused",
    "tests/workers/ops/test_cli.py::test_version_is_the_package_version",
    "tests/workers/runtime/test_jobs.py::test_the_pvm_worker_command_refuses_planted_jobs_on_every_queue",
    "tests/workers/agent/test_mcp_server.py::test_every_tool_answers_over_stdio_with_the_token_of_the_process",
    "tests/workers/runtime/test_runner.py::test_a_running_worker_drops_a_dead_workers_registration_and_keeps_its_own",
    "tests/workers/runtime/test_runner.py::test_several_processes_serve_one_pool",
    "tests/workers/runtime/test_runner.py::test_sigterm_finishes_the_current_batch_then_exits",
    "tests/workers/runtime/test_scheduler.py::test_scheduler_once_and_list_from_the_command_line",
)


def pytest_configure(config: pytest.Config) -> None:
    config.stash[production_url] = os.environ.pop(PRODUCTION_URL_ENV, None)
    url = os.environ.get(TEST_URL_ENV)
    refusal = url_refusal(url, os.environ) if url else None
    if refusal:
        raise pytest.UsageError(refusal)
    workers = getattr(config.option, "numprocesses", None)  # pytest-xdist's -n
    if url and workers not in (None, 0, 1):
        raise pytest.UsageError(
            f"{TEST_URL_ENV} with -n {workers}: the workers would flush each other's database; "
            f"run without -n, or unset {TEST_URL_ENV} (each worker then starts its own Valkey)"
        )


def pytest_unconfigure(config: pytest.Config) -> None:
    url = config.stash.get(production_url, None)
    if url is not None:
        os.environ[PRODUCTION_URL_ENV] = url


def pytest_report_header(config: pytest.Config) -> list[str]:
    url = os.environ.get(TEST_URL_ENV)
    lines = [f"redis: {TEST_URL_ENV}={redacted(url)} (flushed by the tests)" if url else "redis: an embedded Valkey"]
    if config.stash.get(production_url, None):
        lines.append(f"redis: {PRODUCTION_URL_ENV} is set and ignored (the tests and their children do not see it)")
    return lines


def is_integration(nodeid: str) -> bool:
    """Whether the test `nodeid` (relative to the repository) is one INTEGRATION names."""
    name = nodeid.partition("[")[0]
    return any(name == entry or name.startswith(f"{entry}::") for entry in INTEGRATION)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if is_integration(item.nodeid):
            item.add_marker(pytest.mark.integration)


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    # -q hides the header: a server that is not the embedded one is worth a line even then.
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or reporter.showheader:
        return
    if os.environ.get(TEST_URL_ENV) or session.config.stash.get(production_url, None):
        for line in pytest_report_header(session.config):
            reporter.write_line(line)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    url = os.environ.get(TEST_URL_ENV)
    if url:
        refusal = contents_refusal(url)
        if refusal:
            pytest.exit(refusal, returncode=pytest.ExitCode.USAGE_ERROR)
        yield url
        return
    server = EmbeddedRedis().start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def settings(tmp_path: Path, redis_url: str, redis_client: redis.Redis) -> Settings:
    return Settings(
        redis_url=redis_url,
        shards=4,
        home=tmp_path,
        log_dir=tmp_path / "log",
        spool_dir=tmp_path / "spool",
        extra_job_functions=TEST_JOB_FUNCTIONS,
    )
