"""bench/surface_mcp.py: a small run times search over MCP from a client process and reports it with its machine."""

from __future__ import annotations

import json

import pytest

from bench import surface_mcp


@pytest.mark.slow
def test_a_small_run_reports_mcp_call_p99_with_its_machine(capsys: pytest.CaptureFixture[str]) -> None:
    assert surface_mcp.main(["--minutes-scale", "0.01", "--calls", "20", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["minutes_main"] == 1_000 and result["points_main"] == 1_000
    # Every timed call found something: the tool reached the index, beside the API and through pvm mcp.
    assert result["mcp_call_hits_mean"] > 0 and result["mcp_proxy_call_hits_mean"] > 0
    for name in ("mcp_call", "mcp_proxy_call", "api_search", "reader_search"):
        assert 0 < result[f"{name}_p50_ms"] <= result[f"{name}_p99_ms"] <= result[f"{name}_max_ms"]
    assert result["targets"] == {"mcp_call_p99_ms": "<= 20"} and set(result["met"]) == {"mcp_call_p99_ms"}
    assert result["machine"]["cores"] and result["machine"]["redis_server"]["redis_version"]
