from __future__ import annotations

from collections import Counter

import pytest

from bench.ingest import parse_args, pick_projects
from contracts import keys


def test_projects_are_spread_evenly_over_the_shards() -> None:
    assert len(pick_projects(4)) == 8  # two per shard by default
    for shards, count in ((4, 64), (4, 8), (32, 64), (4, 6)):
        chosen = pick_projects(shards, count)
        assert len(set(chosen)) == count
        per_shard = Counter(keys.shard_of(p, shards) for p in chosen)
        assert max(per_shard.values()) - min(per_shard.values(), default=0) <= 1
        assert len(per_shard) == min(shards, count)


def test_projects_must_be_at_least_one() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--projects", "0"])
    assert parse_args(["--projects", "64"]).projects == 64


def test_the_pipeline_target_depends_on_the_number_of_projects() -> None:
    from bench.ingest import targets_for

    assert targets_for(8)["pipeline_per_s"] == (">=", 25_000, "/s")
    assert targets_for(64)["pipeline_per_s"] == (">=", 20_000, "/s")
    assert targets_for(64)["durable_p99_ms"] == ("<=", 250, "ms")


@pytest.mark.slow
def test_the_pipeline_phase_makes_every_minute_durable_and_reports_each_process_cpu() -> None:
    # 5,000 minutes through a real dispatcher, log worker and Valkey: every minute durable once, and the CPU each
    # of the three used per minute read from /proc from the last poll before the first durable minute (never None
    # on Linux, even when every minute is durable by the first poll that sees any, as on a fast host, where the
    # run takes ~125 ms). /proc counts in 10 ms ticks, so only the log worker, which does the work, is sure to
    # show any: Valkey may use under a tick (it showed 0 at 40k minutes/s on an AMD EPYC host).
    from bench.harness import Progress
    from bench.ingest import build_minutes, phase_pipeline

    minutes = build_minutes(pick_projects(4), 5_000)
    result = phase_pipeline(minutes, 4, Progress("test", sep=" "))
    assert result["pipeline_minutes"] == 5_000 and result["pipeline_per_s"] > 0
    cpu = result["pipeline_cpu_us_per_minute"]
    assert set(cpu) == {"dispatcher", "log_worker", "valkey"}
    assert all(value is not None and 0 <= value < 5_000 for value in cpu.values()), cpu
    assert cpu["log_worker"] > 0, cpu
