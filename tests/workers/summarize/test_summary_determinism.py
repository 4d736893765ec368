"""The same chunk gives the same extractive summary in every process, whatever the hash seed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

# Two sentences whose words weigh the same, word for word (two families of five words, each planted the same
# number of times in the same number of minutes): they score alike, and the chunk's budget holds one. Summed in the
# order a set yields the words (the hash seed's), the two floats differed in the last place for some seeds and the
# later sentence won; summed exactly, they tie and the earlier one is kept in every process.
SUMMARIZING = """
import json
from datetime import UTC, datetime, timedelta
from contracts import Minute
from contracts.summaries import ThreadRef
from workers.summarize.summarizers import ExtractiveSummarizer, Logged, estimate_tokens

def family(p):
    w = [f"{p}{c}word" for c in "vwxyz"]
    lead = f"{w[0]} {w[1]} {w[2]} {w[2]} {w[3]} {w[4]} {w[4]}."
    fillers = [f"{w[0]} {w[0]} {w[1]} {w[1]} {w[3]} {w[3]} {w[3]}", f"{w[1]} {w[3]}", f"{w[1]}", f"{w[1]}"]
    return lead, fillers

lead_a, fill_a = family("alf")
lead_b, fill_b = family("bet")
notes = [(lead_a, "task_failed"), (lead_b, "task_failed")]
notes += [(f"{f} noise{i}a noise{i}b noise{i}c noise{i}d noise{i}e noise{i}f.", "message")
          for i, f in enumerate(fill_a + fill_b)]
notes += [(f"noise{i}g noise{i}h.", "message") for i in (8, 9)]
start = datetime(2026, 3, 1, tzinfo=UTC)
minutes = [
    Minute.from_dict({"id": f"01KJP6FR00AAAAAAAAAAAAAA{i:02d}",
                      "timestamp": (start + timedelta(minutes=i)).isoformat().replace("+00:00", "Z"),
                      "event_type": kind, "project_id": "p1", "agent_id": "a", "data": {}, "context_references": [],
                      "memory_note": note, "thread_id": "t1", "scope": "project"})
    for i, (note, kind) in enumerate(notes)
]
summarizer = ExtractiveSummarizer(ratio=0.0, min_tokens=estimate_tokens(lead_a) + 1)
chunk = summarizer.summarize("p1", ThreadRef.parse("t1"), [Logged(i + 1, m) for i, m in enumerate(minutes)])
print(json.dumps(chunk.summary))
"""


def test_a_chunk_summarizes_the_same_under_every_hash_seed() -> None:
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(SUMMARIZING)],
            cwd=REPO,
            env={**os.environ, "PYTHONHASHSEED": str(seed), "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for seed in range(24)
    ]
    summaries = set()
    for run in runs:
        out, _ = run.communicate(timeout=120)
        assert run.returncode == 0
        summaries.add(json.loads(out))
    assert summaries == {"alfvword alfwword alfxword alfxword alfyword alfzword alfzword."}
