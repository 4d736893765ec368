"""bench/engine_floor.py: the embedded engine's share of one indexed minute, on a few hundred points."""

from __future__ import annotations

import json

import pytest

from bench import engine_floor
from pvm.vectors import edge


def test_points_are_the_index_pools_and_their_payload_is_what_the_engine_stores() -> None:
    points = engine_floor.points_of(300, seed=7)
    assert len(points) == 300 and len({p.project_id for p in points}) == 1
    assert all(p.dense_text is None for p in points)  # lexical only, as bench/reader.py indexes
    stored = edge._pack(points[0])
    assert edge.PACKED_FIELD in stored and stored["project_id"] == points[0].project_id


def test_the_json_report_gives_each_step_and_the_ceiling_it_implies(capsys: pytest.CaptureFixture[str]) -> None:
    assert engine_floor.main(["--points", "300", "--repeats", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["points"] == 300 and out["qdrant_edge"] and out["machine"]["cores"]
    assert set(out["python_us"]) == {"check", "bm25", "pack", "point_id"}
    # Ten payload values converted one by one cost more than none, and writing PVM's indexes more than none.
    assert out["point_us"]["with_payload"] > out["point_us"]["without_payload"]
    assert out["payload_conversion_us"] > 0 and out["payload_values"]["str"] >= 5
    assert out["engine_floor_us"] == pytest.approx(out["point_us"]["with_payload"] + out["update_us"]["pvm_indexes"])
    assert out["ceiling_per_s"] == round(1e6 / out["engine_floor_us"])
    assert isinstance(out["update_overlaps_python"], bool)


def test_too_few_points_is_refused_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        engine_floor.main(["--points", "10"])
    assert "--points must be at least 100" in capsys.readouterr().err
