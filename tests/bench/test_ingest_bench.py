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
