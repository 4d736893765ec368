"""Ranking is a total order: the same points and query give the same ranked ids in any process, whatever order
the points were written in (the engine's order among equal scores follows the writes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

from pvm.vectors import Hit, cut_inside_tie, cut_leg, id_order, leg_fetch, tie_floor, whole_run

REPO = Path(__file__).resolve().parents[2]

# Writes 150 minutes into a fresh embedded engine in the order asked, then prints what search ranks: many points
# share a text (and so a score), more of them than a leg fetches, as short repeated turns do in real conversation.
SEARCHING = """
import json, sys
from pathlib import Path
from pvm.search import HybridSearch
from pvm.vectors.edge import EdgeEngine
from tests.pvm.test_search import NOW, memory_point

home, order = Path(sys.argv[1]), sys.argv[2]
texts = ["gateway outage on deploy", "gateway outage", "outage review", "cache tuning", "deploy notes"]
points = [memory_point("alpha", f"m{i:03d}", texts[i % len(texts)]) for i in range(150)]
engine = EdgeEngine(home, None)
for point in points if order == "forward" else points[::-1]:
    engine.upsert([point])
search = HybridSearch(engine, None)
print(json.dumps({q: [h.minute_id for h in search.search("alpha", q, k=10, now_ms=NOW)]
                  for q in ("gateway outage", "outage", "deploy")}))
engine.close()
"""


def _ranked(home: Path, order: str, seed: str) -> dict[str, list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SEARCHING), str(home), order],
        cwd=REPO,
        env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_two_processes_writing_in_opposite_orders_rank_the_same_ids(tmp_path: Path) -> None:
    forward = _ranked(tmp_path / "a", "forward", "1")
    backward = _ranked(tmp_path / "b", "backward", "2")
    assert all(len(ids) == 10 for ids in forward.values()), forward
    assert forward == backward
    # Among equal scores the stable key decides: the lowest minute ids of the tied run, not the first written.
    assert forward["gateway outage"] == sorted(forward["gateway outage"])


def test_a_leg_is_cut_in_a_total_order_and_asked_again_when_its_cut_falls_inside_a_tie() -> None:
    hits: list[Hit] = [("b", 0.5, None), ("a", 0.5, None), ("c", 0.9, None), ("d", 0.5, None)]
    assert [h[0] for h in cut_leg(hits, 3)] == ["c", "a", "b"]
    assert [h[0] for h in cut_leg(reversed(hits), 3)] == ["c", "a", "b"]
    fetched = leg_fetch(2)
    assert fetched == 3
    assert cut_inside_tie([("c", 0.9, None), ("b", 0.5, None), ("a", 0.5, None)], 2, fetched)
    assert not cut_inside_tie([("c", 0.9, None), ("b", 0.5, None), ("a", 0.4, None)], 2, fetched)
    assert not cut_inside_tie([("c", 0.9, None), ("b", 0.5, None)], 2, fetched)  # the engine had no more
    assert not cut_inside_tie([("x", 0.5, None)] * 16, 2, 16)  # asked up to TIE_FETCH_FACTOR x limit: stop


def test_uuid_point_ids_order_as_their_strings_do_among_equal_scores() -> None:
    # The embedded engine returns UUIDs and a server their strings: the same points cut the same either way.
    ids = [uuid.uuid5(uuid.NAMESPACE_URL, f"m{i}") for i in range(200)] + [uuid.UUID(int=0), uuid.UUID(int=2**128 - 1)]
    assert sorted(ids, key=id_order) == sorted(ids, key=str)
    as_uuids: list[Hit] = [(pid, 0.5, None) for pid in ids]
    as_strings: list[Hit] = [(str(pid), 0.5, None) for pid in ids]
    assert [str(h[0]) for h in cut_leg(as_uuids, 50)] == [h[0] for h in cut_leg(as_strings, 50)]


def test_a_tied_cut_keeps_the_points_above_and_the_lowest_ids_of_the_run_and_names_the_payloads_to_read() -> None:
    # First fetch (limit 3, one more asked): "z" above the tie, then the run at 0.5 in the engine's write order.
    read: list[Hit] = [("z", 0.9, {"m": "z"}), ("q", 0.5, {"m": "q"}), ("p", 0.5, {"m": "p"}), ("o", 0.5, {"m": "o"})]
    assert cut_inside_tie(read, 3, leg_fetch(3))
    floor = tie_floor(read, 3)
    assert 0.5 - 1e-5 < floor < 0.5
    # The wide fetch (ids and scores, at least the floor) holds the whole run, and a point just below it.
    wide: list[Hit] = [
        ("z", 0.9, None),
        ("q", 0.5, None),
        ("p", 0.5, None),
        ("o", 0.5, None),
        ("b", 0.5, None),
        ("a", 0.5, None),
        ("c", 0.4999999, None),
    ]
    hits, missing = whole_run(read, wide, 3)
    assert hits == [("z", 0.9, {"m": "z"}), ("a", 0.5, None), ("b", 0.5, None)]
    assert missing == ["a", "b"]
    # The same run written in another order keeps the same points.
    assert whole_run(read[::-1], wide[::-1], 3)[0][0][0] == "z"
    assert [h[0] for h in whole_run(read, wide[::-1], 3)[0]] == ["z", "a", "b"]
    # A wide fetch with nothing at the tie (an engine comparing the threshold otherwise) keeps what was read.
    assert whole_run(read, [("z", 0.9, None)], 3) == (cut_leg(read, 3), [])
