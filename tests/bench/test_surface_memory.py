"""bench/surface_memory.py: a quick run gives the JSON the issue asks for, its rates the counts over the seconds."""

from __future__ import annotations

import json

import pytest

from bench.surface_memory import QUICK_FACTS, TARGETS, main


@pytest.mark.slow
def test_a_quick_run_reports_export_and_import_rates_with_the_machine(
    capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    assert main(["--quick", "--json", "--folder-root", str(tmp_path)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["benchmark"] == "surface_memory" and result["quick"] is True
    assert set(result["metrics"]) == set(TARGETS) == {"export_per_s", "import_per_s"}
    phases = result["phases"]
    assert phases["facts"] == phases["files_written"] == QUICK_FACTS
    assert phases["edited_minutes"] == phases["edited_files"] == QUICK_FACTS // 10
    for key, seconds in (("export_per_s", "export_s"), ("import_per_s", "import_s")):
        cell = result["metrics"][key]
        assert cell["value"] == pytest.approx(QUICK_FACTS / phases[seconds], rel=0.01), key  # seconds shown rounded
        assert cell["met"] is (cell["value"] >= 5_000) and cell["target"] == ">= 5000", key
    box = result["machine"]
    assert box["cores"] and box["redis_server"]["redis_version"] and len(box["load_average_before"]) == 3
    assert result["folder_root"] == str(tmp_path) and result["elapsed_s"] > 0
