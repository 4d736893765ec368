"""bench/freshness.py: a probe is a statement the rules read as one owner (its fact id computed as the pool will),
spread through a generated offer; and a small run through the whole stack (`pvm up`) finds every probe by search
and in the facts API, with its latencies."""

from __future__ import annotations

import json

import pytest

from bench import freshness
from contracts.facts import Slot, TierKey, fact_id


def test_probes_are_spread_through_the_offer_each_with_a_word_of_its_own_and_the_fact_it_states() -> None:
    minutes, probes = freshness.offer_minutes("fresh-test", 400, 8, seed=3)
    assert len(minutes) == 400 and len(probes) == 8
    ids = [m.id for m in minutes]
    positions = sorted(ids.index(i) for i in probes)
    assert positions[0] < 50 and positions[-1] > 350  # spread, not bunched at the start
    tokens = {p.token for p in probes.values()}
    assert len(tokens) == 8
    assert not any(t in (m.memory_note or "") for m in minutes if m.id not in probes for t in tokens)
    probe = next(iter(probes.values()))
    assert probe.token in (probe.minute.memory_note or "")
    expected = fact_id(TierKey.for_project("fresh-test"), Slot(f"{probe.token} gateway", "owner"), probe_owner(probe))
    assert probe.fact_id == expected


def probe_owner(probe: freshness.Probe) -> str:
    note = probe.minute.memory_note or ""
    return note.split(" is owned by ", 1)[1].rstrip(".")


def test_latencies_count_a_probe_never_found_with_the_time_waited() -> None:
    seen = freshness.Seen(emitted={"a": 100.0, "b": 100.0}, searchable={"a": 100.25}, gave_up_at=102.0)
    ms, censored = freshness.latencies(seen, seen.searchable)
    assert ms == pytest.approx([250.0, 2000.0]) and censored == 1


@pytest.mark.slow
def test_a_small_offer_through_the_whole_stack_finds_every_probe(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--rates", "100", "--seconds", "2", "--sample", "4", "--drain", "90", "--json"]
    assert freshness.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rates"] == ["100"] and out["probes_100"] == 4
    assert out["not_searchable_100"] == 0 and out["not_fact_100"] == 0
    for name in ("searchable", "fact"):
        assert 0 < out[f"emit_to_{name}_p50_ms_100"] <= out[f"emit_to_{name}_p99_ms_100"]
    assert out["met"] == {"emit_to_searchable_p99_ms_5k": None, "emit_to_fact_p99_ms_5k": None}  # not offered
    stages = out["stages_100"]
    assert stages["batches"]["log"]["minutes"] >= 200 and stages["batches"]["log"]["mean_batch"] >= 1
    assert stages["batches"]["index"]["mean_batch_ms"] > 0
    assert {"durable", "indexed", "facts"} <= set(stages["freshness_mean_ms"])
    assert 0 < stages["freshness_mean_ms"]["durable"] <= stages["freshness_mean_ms"]["indexed"]
    # What each process used, from /proc: every process of the stack, Valkey, the bench and the machine; the
    # processes that did work show it (/proc counts 10 ms ticks: the idle scheduler may show none).
    cpu = out["cpu_100"]
    assert {"serve", "worker-log", "worker-facts", "valkey", "bench", "machine"} <= set(cpu["cores"])
    assert all(v >= 0 for v in cpu["us_per_minute"].values())
    assert cpu["us_per_minute"]["serve"] > 0 and cpu["us_per_minute"]["worker-facts"] > 0
    assert cpu["cores"]["machine"] > 0 and cpu["seconds"] > 0
    assert cpu["stack_us_per_minute"] >= cpu["us_per_minute"]["serve"]
