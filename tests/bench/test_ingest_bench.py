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
