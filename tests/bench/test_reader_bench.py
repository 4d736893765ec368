"""bench/reader.py on a small project: the checkpoints --minutes names, each with its latencies, the phases of a
context call and the process's memory; and --minutes refused with the reason where it names no sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import reader


def test_each_checkpoint_gives_latencies_phases_that_add_up_and_memory(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--minutes", "2000,1000", "--calls", "10", "--phase-calls", "12", "--hot-minutes", "100", "--json"]
    assert reader.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["checkpoints"] == [1000, 2000] and out["minutes_main"] == 2000
    assert out["points_main"] == 2000 and out["minutes_total"] >= 2000
    for label in ("1k", "2k"):
        assert 0 < out[f"context_p50_ms_{label}"] <= out[f"context_p99_ms_{label}"]
        assert 0 < out[f"search_p50_ms_{label}"] <= out[f"search_p99_ms_{label}"]
        assert out[f"reader_rss_mb_{label}"] > 0
        assert 0 < out[f"reader_rss_file_mb_{label}"] < out[f"reader_rss_mb_{label}"]
        assert out[f"context_major_faults_{label}"] >= 0
        assert out[f"settle_s_{label}"] >= 0  # the load written back before the calls were timed
        phases = out[f"context_phases_{label}"]
        assert set(phases) == {*reader.PHASES, "total"}
        assert phases["search"]["wall_p50_ms"] > 0 and phases["reads"]["wall_p50_ms"] > 0
        # Every call's time is in one phase or another: the shares add up to the whole.
        assert sum(phases[p]["share"] for p in reader.PHASES) == pytest.approx(1.0, abs=0.01)
    assert out["context_p99_ms_largest"] == out["context_p99_ms_2k"]
    assert isinstance(out["home_filesystem"], str) and out["home_filesystem"]
    assert set(out["targets"]) == {"context_p99_ms_100k", "context_p99_ms_1m", "search_p99_ms_1m", "index_per_s"}
    assert out["met"]["context_p99_ms_1m"] is None  # not measured at this size: no verdict
    # Past 800 minutes (8 windows of 100) the project keeps a window: the searches at 1k and 2k read it.
    assert out["config"]["search_hot_minutes"] == 100 and out["hot_window_searches"]["window"] > 0
    # The engine kept candidates' ranking payloads (the upserts' own, and those read), and searches found them kept.
    kept = out["ranking_payloads"]
    assert kept["kept"] > 0 and kept["hits"] > kept["misses"]


def test_a_negative_hot_window_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        reader.main(["--hot-minutes", "-1"])
    assert "--hot-minutes" in capsys.readouterr().err


def test_the_phase_clock_leaves_the_class_and_other_readers_alone() -> None:
    class Reads:
        searcher = None

        def _send_scripts(self) -> str:
            return "sent"

        def _script_replies(self) -> str:
            return "read"

        def _by_ids(self) -> list[str]:
            return []

    timed, plain = Reads(), Reads()
    clock = reader.PhaseClock(timed)  # type: ignore[arg-type]
    clock.call(lambda: (timed._send_scripts(), timed._script_replies(), timed._by_ids()))
    assert "reads" in clock.calls[0] and "referenced" in clock.calls[0]
    assert plain._script_replies.__func__ is Reads._script_replies  # type: ignore[attr-defined]
    assert clock.calls[0]["total"][0] >= clock.calls[0]["reads"][0]


@pytest.mark.parametrize("value", ["", "abc", "500", "1000,x", "3000000"])
def test_minutes_that_name_no_sizes_are_refused_with_the_reason(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        reader.main(["--minutes", value])
    assert "--minutes" in capsys.readouterr().err


def test_the_home_filesystem_is_the_type_of_the_mount_the_path_is_under(tmp_path: Path) -> None:
    assert reader.home_filesystem("/proc/self/status") == "proc"  # a path under a mount, not the mount itself
    assert reader.home_filesystem("/proc") == "proc"
    lines = Path("/proc/mounts").read_text().splitlines()
    mounts = {fields[1]: fields[2] for fields in (line.split() for line in lines) if len(fields) > 2}
    assert reader.home_filesystem(str(tmp_path)) in mounts.values()
