"""Redis key names: stable sharding and Redis Cluster hash tags."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts import keys


def hash_tag(key: str) -> str:
    """The part of `key` Redis Cluster hashes: the first non-empty {...}, else the whole key."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


def test_crc32_is_the_standard_one() -> None:
    # CRC-32/ISO-HDLC (zlib, Go's crc32.ChecksumIEEE, Java's CRC32): the check value of "123456789".
    assert zlib.crc32(b"123456789") == 0xCBF43926


@pytest.mark.parametrize(
    ("project", "shards", "expected"),
    [
        ("alpha", 8, 2),
        ("beta", 8, 3),
        ("alpha", 16, 10),
        ("alpha", 1024, 362),
        ("alpha", 1, 0),
        ("", 8, 0),
        ("projet-é", 8, 2),
    ],
)
def test_known_values(project: str, shards: int, expected: int) -> None:
    assert keys.shard_of(project, shards) == expected
    assert keys.shard_of(project, shards) == zlib.crc32(project.encode("utf-8")) % shards


def test_alpha_crc() -> None:
    assert zlib.crc32(b"alpha") == 3504355690
    assert keys.shard_of("alpha", 8) == 3504355690 % 8


@given(st.text(max_size=128), st.integers(1, 4096))
def test_shard_of_is_stable_and_in_range(project: str, shards: int) -> None:
    shard = keys.shard_of(project, shards)
    assert 0 <= shard < shards
    assert keys.shard_of(project, shards) == shard
    assert shard == zlib.crc32(project.encode("utf-8")) % shards


def test_shards_spread() -> None:
    counts = [0] * 8
    for n in range(8000):
        counts[keys.shard_of(f"project-{n}", 8)] += 1
    assert min(counts) > 800  # roughly uniform (expected 1000 each)


@pytest.mark.parametrize("shard", [0, 1, 7, 63])
def test_stream_names_carry_the_shard_hash_tag(shard: int) -> None:
    assert keys.stream(shard) == f"pvm:{{s{shard}}}:minutes"
    assert keys.dead_letter_stream(shard) == f"pvm:{{s{shard}}}:dead"
    assert hash_tag(keys.stream(shard)) == hash_tag(keys.dead_letter_stream(shard)) == f"s{shard}"
    assert keys.stream(shard) != keys.dead_letter_stream(shard)


def test_stream_tags_differ_per_shard() -> None:
    assert len({hash_tag(keys.stream(n)) for n in range(64)}) == 64


@pytest.mark.parametrize("project", ["alpha", "beta_svc.v2", "A-1"])
def test_project_keys_share_the_project_hash_tag(project: str) -> None:
    names = [
        keys.recent_window(project),
        keys.agent_recent_window(project, "planner-1"),
        keys.agent_recent_window(project, "agent {with} braces"),  # agent ids are free text
        keys.minute_by_id(project),
        keys.minute_by_id_order(project),
        keys.log_head(project),
        keys.index_head(project),
        keys.index_done(project),  # updated with the index head by one script
    ]
    assert {hash_tag(name) for name in names} == {f"p:{project}"}
    assert len(set(names)) == len(names)
    assert all(name.startswith("pvm:") for name in names)


def test_global_names() -> None:
    assert keys.PREFIX == "pvm"
    assert keys.projects() == "pvm:projects"
    assert keys.worker_alive("w1") == "pvm:worker:w1:alive"
    assert keys.stranded_seen("pvm-log") == "pvm:reaper:pvm-log:stranded"
    assert keys.metrics_reaper("pvm-log") == "pvm:metrics:reaper:pvm-log"
    assert keys.metrics_reaper("pvm-log") != keys.stranded_seen("pvm-log")
    assert keys.REAPER_REASONS == (keys.REQUEUED_DEAD_WORKER, keys.REQUEUED_STRANDED) == ("dead_worker", "stranded")
    assert keys.scheduler_leader() == "pvm:scheduler:leader"
    assert keys.schedules() == "pvm:scheduler:schedules"
    assert keys.MINUTE_FIELD == b"m"
    assert keys.DISPATCH_GROUP == "pvm-dispatch"
    assert keys.QUEUES["log"] == keys.LOG_QUEUE == "pvm-log"
