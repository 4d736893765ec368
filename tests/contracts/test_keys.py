"""Redis key names: stable sharding and Redis Cluster hash tags."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts import keys
from contracts.facts import GLOBAL_KEY, FactType, Slot, TierKey


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


# -- facts (the facts pool's keys; the pool wires the queue and job) ---------------------------------

SLOT = Slot("service:auth", "session_ttl")


def fact_keys(key: TierKey, slot: Slot = SLOT) -> list[str]:
    """Every facts key of one tier key (and one of its slots)."""
    return [
        keys.facts_by_id(key),
        keys.facts_in_tier(key),
        keys.facts_in_slot(key, slot),
        keys.facts_slot_lock(key, slot),
        *(keys.facts_of_type(key, t) for t in FactType),
        keys.learned_keys(key),
        keys.procedural_rules(key),
        keys.fact_reads(key),
    ]


def test_the_facts_pool_is_wired_into_the_queues_the_fan_out_and_the_allowlist() -> None:
    assert keys.FACTS_QUEUE == keys.QUEUES["facts"] == "pvm-facts"
    assert keys.FACTS_JOB == keys.POOL_JOBS["facts"] == "facts-batch"
    assert keys.FACTS_JOB in keys.JOB_FUNCTIONS


def test_the_facts_stores_bookkeeping_shares_its_records_tag() -> None:
    task, project = TierKey.for_task("alpha", "T-1"), TierKey.for_project("alpha")
    assert keys.facts_parked(task) == keys.facts_parked(project) == "pvm:{p:alpha}:facts:parked"
    assert keys.facts_parked(GLOBAL_KEY) == "pvm:{g}:facts:parked"
    assert keys.facts_cleared("alpha") == "pvm:{p:alpha}:facts:cleared"
    assert keys.metrics_fact_changes() == "pvm:metrics:facts:changes"


@pytest.mark.parametrize(
    "key", [TierKey.for_project("alpha"), TierKey.for_task("alpha", "T-1"), TierKey.for_task("alpha", "x {y}: z")]
)
def test_project_and_task_fact_keys_share_the_project_hash_tag(key: TierKey) -> None:
    names = [*fact_keys(key), keys.facts_head("alpha"), keys.facts_done("alpha")]
    assert {hash_tag(name) for name in names} == {"p:alpha"}
    # One tag with the project's other caches: the log pool's fan-out and the facts store can share a script.
    assert hash_tag(keys.recent_window("alpha")) == "p:alpha"
    assert all(name.startswith("pvm:{p:alpha}:facts") for name in names)


def test_global_fact_keys_carry_their_own_tag() -> None:
    names = fact_keys(GLOBAL_KEY)
    assert {hash_tag(name) for name in names} == {"g"}
    assert keys.facts_in_tier(GLOBAL_KEY) == "pvm:{g}:facts:all:global"
    assert keys.facts_by_id(GLOBAL_KEY) == "pvm:{g}:facts:byid"


def test_fact_key_shapes() -> None:
    task = TierKey.for_task("alpha", "T-1")
    assert keys.facts_by_id(task) == keys.facts_by_id(TierKey.for_project("alpha")) == "pvm:{p:alpha}:facts:byid"
    assert keys.fact_reads(task) == "pvm:{p:alpha}:facts:reads"
    assert keys.facts_in_tier(task) == "pvm:{p:alpha}:facts:all:task:T-1"
    assert keys.facts_in_tier(TierKey.for_project("alpha")) == "pvm:{p:alpha}:facts:all:project"
    assert keys.facts_in_slot(task, SLOT) == f"pvm:{{p:alpha}}:facts:slot:{SLOT.digest}:task:T-1"
    assert keys.facts_slot_lock(task, SLOT) == f"pvm:{{p:alpha}}:facts:lock:{SLOT.digest}:task:T-1"
    assert keys.facts_of_type(task, FactType.DECISION) == "pvm:{p:alpha}:facts:type:decision:task:T-1"
    assert keys.learned_keys(task) == "pvm:{p:alpha}:facts:learned:task:T-1"
    assert keys.procedural_rules(task) == "pvm:{p:alpha}:facts:rules:task:T-1"
    assert keys.facts_head("alpha") == "pvm:{p:alpha}:facts:head"
    assert keys.facts_done("alpha") == "pvm:{p:alpha}:facts:done"


def test_fact_keys_are_distinct_across_tiers_slots_and_types() -> None:
    tiers = [
        TierKey.for_project("alpha"),
        TierKey.for_project("beta"),
        TierKey.for_task("alpha", "T-1"),
        TierKey.for_task("alpha", "T-2"),
        TierKey.for_task("beta", "T-1"),
        GLOBAL_KEY,
    ]
    names = [name for key in tiers for name in fact_keys(key) if not name.endswith((":byid", ":reads"))]
    names += [name for key in tiers for name in (keys.facts_in_slot(key, Slot("db", "engine")),)]
    assert len(set(names)) == len(names)
    per_project = {keys.facts_by_id(k) for k in tiers} | {keys.fact_reads(k) for k in tiers}
    assert len(per_project) == 6  # alpha, beta and global, two hashes each


task_ids = st.text(alphabet=st.sampled_from("ab:{}| -_.\n"), min_size=1, max_size=8).filter(lambda t: not t.isspace())


@given(task_ids, task_ids, st.sampled_from(["all", "slot", "lock", "type", "learned", "rules"]), st.booleans())
def test_task_ids_with_any_text_never_share_a_key(one: str, other: str, kind: str, same_slot: bool) -> None:
    # Task ids are free text (colons, braces, newlines): the key still names one task only.
    def name(task: str, slot: Slot) -> str:
        key = TierKey.for_task("alpha", task)
        return {
            "all": keys.facts_in_tier(key),
            "slot": keys.facts_in_slot(key, slot),
            "lock": keys.facts_slot_lock(key, slot),
            "type": keys.facts_of_type(key, FactType.GOAL),
            "learned": keys.learned_keys(key),
            "rules": keys.procedural_rules(key),
        }[kind]

    other_slot = SLOT if same_slot else Slot("db", "engine")
    assert (name(one, SLOT) == name(other, other_slot)) == (
        one == other and (same_slot or kind not in ("slot", "lock"))
    )
