"""bench/expansion.py: the thread-neighbour candidate brings in the minute before and after a top hit, and the
benchmark reports every candidate on small sets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import expansion
from contracts.memory import RankWeights
from pvm import defaults
from pvm.protocols import MemoryPoint
from pvm.vectors.edge import EdgeEngine

NOW_MS = 1_800_000_000_000


def point(minute_id: str, text: str) -> MemoryPoint:
    payload = {"timestamp_ms": NOW_MS, "scores": {"composite": 0.5}, "category": "project_knowledge"}
    return MemoryPoint(minute_id, "bench", text, payload)


def test_a_top_hit_brings_in_the_minute_before_and_after_it_in_its_thread(tmp_path: Path) -> None:
    engine = EdgeEngine(tmp_path / "v")
    try:
        texts = {"a": "vendor call scheduled", "b": "contract blocked the deploy", "c": "signature arrived"}
        texts |= {"d": "deploy resumed", "x": "standup notes"}
        engine.upsert([point(i, t) for i, t in texts.items()])
        threads = {i: ["a", "b", "c", "d"] for i in "abcd"}
        search = expansion.NeighbourSearch(
            engine, None, RankWeights(*defaults.SEARCH_WEIGHTS), threads=threads, hits=1, decay=0.9
        )
        hits = search.search_result("bench", "contract blocked", k=3, now_ms=NOW_MS).hits
        assert [h.minute_id for h in hits[:1]] == ["b"]
        assert {h.minute_id for h in hits[1:]} == {"a", "c"}  # not "d": two places away
        assert all(h.parts == {"neighbour": 1.0} and h.score == pytest.approx(hits[0].score * 0.9) for h in hits[1:])
    finally:
        engine.close()


def test_the_report_gives_every_candidate_for_every_set(capsys: pytest.CaptureFixture[str]) -> None:
    assert expansion.main(["--embedder", "hash", "--scale", "0.05", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["sets"]) == {"sessions", "timeline", "multihop"} and out["held_out"] == ["multihop"]
    names = {"base"}
    names |= {f"neighbours_{n}_{d:g}" for n, d in expansion.NEIGHBOURS} | {f"refs_{n}_{d:g}" for n, d in expansion.REFS}
    names |= {f"prf_{n}_{t}" for n, t in expansion.PRF}
    for modes in out["sets"].values():
        assert set(modes) == {"lexical", "hybrid"}
        for variants in modes.values():
            assert set(variants) == names
            assert all(0.0 <= v["recall_at_10"] <= 1.0 for v in variants.values())
