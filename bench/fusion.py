#!/usr/bin/env python
"""Fusion benchmark: recall@5/@10 of the hybrid search's ways of fusing the lexical and dense legs.

A labeled set built so the legs complement each other: 150 topics of 3
concepts, each concept spelled by 3 synonyms (made-up words, so no stemmer or
stopword list interferes). Every topic has 4 minutes; each spells the topic's
concepts with randomly chosen synonyms and also mentions 2 concepts of other
topics and a few generic coordination words. A query names 2 of its topic's
concepts, again with random synonyms, so the lexical leg only finds the
relevant minutes that happen to share a spelling (and is misled by minutes
that mention the word in passing). The 4 minutes of the topic are relevant.

The dense leg comes from an embedder written here, in three qualities:

- good:  every synonym of a concept embeds near the concept's vector;
- weak:  a synonym embeds mostly as its own random vector, a little toward the concept;
- noise: a random vector per text (the leg knows nothing).

Each fusion runs through the real path (EdgeEngine on a temporary directory,
`HybridSearch` with PVM's default weights with embeddings,
`SEARCH_WEIGHTS_WITH_EMBEDDINGS`; every minute has the same timestamp and
composite score, so recency and importance do not move the ranking):

- agree:       min-max legs, the dense share set by the legs' agreement (PVM's default, `SEARCH_FUSION`)
- max:         weighted sum of per-leg scores divided by each leg's best
- minmax:      weighted sum of per-leg min-max normalized scores
- rrf:         rank fusion with a small k (`SEARCH_RRF_K`, 10), each leg's 1 / (k + rank) by its weight
- engine_rrf:  Qdrant's RRF fusion, k=60 (prefetch + fusion in the engine)
- engine_dbsf: Qdrant's distribution-based score fusion
- learned:     a learned calibration: logistic regression on each candidate's min-max leg scores, each leg's
               1 / (1 + rank), a found-by-both flag and the three trust readings of fusion "agree" (and the leg
               scores times them), balanced, L2 0.01; trained on another draw of the set (seed + 1000, other
               made-up words, other queries) with the same dense leg, so it never sees the queries it ranks

plus `lexical_only` (no embedder) and `dense_only` (keyword weight 0) as the bounds;
`hybrid_minus_best_leg` is the default fusion's recall@10 minus the better bound's.

    .venv/bin/python bench/fusion.py --json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.machine import machine
from bench.metrics import recall_at_depths
from contracts.memory import RankWeights, SearchFilters
from pvm import defaults
from pvm.protocols import MemoryPoint
from pvm.search import HybridSearch, _dense_share
from pvm.vectors.edge import EdgeEngine

DIMENSIONS = 64
TOPICS = 150
CONCEPTS_PER_TOPIC = 3
SYNONYMS = 3
MINUTES_PER_TOPIC = 4
CONCEPTS_PER_QUERY = 2
DISTRACTORS = 2
NOW_MS = 1_800_000_000_000
DEPTHS = (5, 10)  # recall@5 and recall@10
GENERIC_WORDS = (
    "agent task assigned completed failed review handoff conflict resolved decision team deadline "
    "priority blocked unblocked retry escalated approved merged deployed tested owner update status"
)
QUALITIES = ("good", "weak", "noise")


@dataclass(frozen=True)
class LabeledSet:
    minutes: list[tuple[str, str]]  # (minute id, text)
    queries: list[tuple[str, frozenset[str]]]  # (query text, relevant minute ids)
    concept_of: dict[str, int]  # synonym -> concept


def labeled_set(seed: int = 7) -> LabeledSet:
    """The topics, minutes and queries described in the module docstring."""
    rng = random.Random(seed)
    words: set[str] = set()
    consonants, vowels = "bdfgklmnprtvz", "aeiou"
    while len(words) < TOPICS * CONCEPTS_PER_TOPIC * SYNONYMS:
        words.add("".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(3)))
    pool = sorted(words)
    rng.shuffle(pool)
    concepts = [pool[i * SYNONYMS : (i + 1) * SYNONYMS] for i in range(TOPICS * CONCEPTS_PER_TOPIC)]
    concept_of = {w: c for c, synonyms in enumerate(concepts) for w in synonyms}
    minutes: list[tuple[str, str]] = []
    queries: list[tuple[str, frozenset[str]]] = []
    for topic in range(TOPICS):
        own = list(range(topic * CONCEPTS_PER_TOPIC, (topic + 1) * CONCEPTS_PER_TOPIC))
        relevant = []
        for n in range(MINUTES_PER_TOPIC):
            others = [c for c in rng.sample(range(len(concepts)), DISTRACTORS + 3) if c not in own][:DISTRACTORS]
            text = [rng.choice(concepts[c]) for c in own + others] + rng.sample(GENERIC_WORDS.split(), 4)
            rng.shuffle(text)
            minute_id = f"t{topic:03d}m{n}"
            minutes.append((minute_id, " ".join(text)))
            relevant.append(minute_id)
        asked = rng.sample(own, CONCEPTS_PER_QUERY)
        queries.append((" ".join(rng.choice(concepts[c]) for c in asked), frozenset(relevant)))
    return LabeledSet(minutes, queries, concept_of)


def _unit(seed: str) -> list[float]:
    rng = random.Random(hashlib.blake2b(seed.encode(), digest_size=8).digest())
    v = [rng.gauss(0.0, 1.0) for _ in range(DIMENSIONS)]
    norm = math.sqrt(sum(x * x for x in v))
    return [x / norm for x in v]


class BenchEmbedder:
    """A toy embedder of known quality: how much a synonym's vector leans toward its concept's."""

    def __init__(self, quality: str, concept_of: dict[str, int]) -> None:
        self.quality = quality
        self._concept_of = concept_of
        # (weight toward the concept, weight of the word's own random direction)
        self._mix = {"good": (1.0, 0.8), "weak": (0.35, 1.0), "noise": (0.0, 0.0)}[quality]

    @property
    def dimensions(self) -> int:
        return DIMENSIONS

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [self._one(t) for t in texts]

    def _one(self, text: str) -> list[float]:
        if self.quality == "noise":
            return _unit("noise:" + text)
        total = [0.0] * DIMENSIONS
        for word in text.split():
            concept = self._concept_of.get(word)
            toward, own = self._mix
            parts = [(own if concept is not None else 0.5, _unit("word:" + word))]
            if concept is not None:
                parts.append((toward, _unit(f"concept:{concept}")))
            for weight, vector in parts:
                for i, x in enumerate(vector):
                    total[i] += weight * x
        norm = math.sqrt(sum(x * x for x in total)) or 1.0
        return [x / norm for x in total]


CALIBRATION_SEED_OFFSET = 1000  # the learned calibration trains on the set drawn with seed + this
CALIBRATION_L2 = 0.01
CALIBRATION_STEPS = 400
CANDIDATES = max(defaults.SEARCH_MIN_CANDIDATES, defaults.SEARCH_CANDIDATES_PER_HIT * 10)  # as a k=10 search asks


def _features(search: HybridSearch, candidates: list[Any]) -> np.ndarray:
    """One row per candidate: what the learned calibration weighs (see the module docstring)."""
    keyword = search._leg(candidates, "keyword", CANDIDATES)
    semantic = search._leg(candidates, "semantic", CANDIDATES)
    w = search.weights
    legs = _dense_share(candidates, keyword, w.semantic / (w.semantic + w.keyword))
    trust = (legs.agreement, legs.support, legs.flatness)
    rows = []
    for c, kw, sem in zip(candidates, keyword, semantic, strict=True):
        kw_rank, sem_rank = c.extra.get("keyword_rank"), c.extra.get("semantic_rank")
        rows.append(
            [kw, sem, 1 / (1 + kw_rank) if kw_rank else 0.0, 1 / (1 + sem_rank) if sem_rank else 0.0]
            + [1.0 if kw_rank and sem_rank else 0.0, *trust]
            + [kw * t for t in trust]
            + [sem * t for t in trust]
        )
    return np.asarray(rows, dtype=float)


class Calibration:
    """Logistic regression over `_features`, fitted by gradient descent (balanced classes, L2)."""

    def __init__(self) -> None:
        self.weights: np.ndarray | None = None

    def fit(self, x: np.ndarray, y: np.ndarray) -> Calibration:
        x = np.hstack([x, np.ones((len(x), 1))])
        positives = max(1.0, float(y.sum()))
        sample = np.where(y > 0, len(y) / (2 * positives), len(y) / (2 * max(1.0, len(y) - positives)))
        weights = np.zeros(x.shape[1])
        for _ in range(CALIBRATION_STEPS):
            p = 1 / (1 + np.exp(-(x @ weights)))
            gradient = x.T @ (sample * (p - y)) / len(y) + CALIBRATION_L2 * weights
            weights -= 1.0 * gradient
        self.weights = weights
        return self

    def score(self, x: np.ndarray) -> np.ndarray:
        assert self.weights is not None, "fit first"
        return np.hstack([x, np.ones((len(x), 1))]) @ self.weights


def _query(engine: EdgeEngine, embedder: BenchEmbedder, text: str) -> list[Any]:
    return engine.query("bench", text, embedder.embed([text])[0], SearchFilters(), CANDIDATES, with_payload=False)


def _learned(quality: str, seed: int, engine: EdgeEngine, data: LabeledSet, directory: Path) -> dict[str, float]:
    """Recall of the learned calibration on `data`, trained on the set drawn with seed + CALIBRATION_SEED_OFFSET."""
    weights = RankWeights(*defaults.SEARCH_WEIGHTS_WITH_EMBEDDINGS)
    train = labeled_set(seed + CALIBRATION_SEED_OFFSET)
    train_embedder = BenchEmbedder(quality, train.concept_of)
    train_engine = _engine(directory / f"{quality}-train", train, train_embedder, "rrf")
    search = HybridSearch(train_engine, train_embedder, weights)
    try:
        xs, ys = [], []
        for text, relevant in train.queries:
            candidates = _query(train_engine, train_embedder, text)
            xs.append(_features(search, candidates))
            ys.append(np.asarray([1.0 if c.minute_id in relevant else 0.0 for c in candidates]))
        model = Calibration().fit(np.vstack(xs), np.concatenate(ys))
    finally:
        train_engine.close()
    embedder = BenchEmbedder(quality, data.concept_of)
    search = HybridSearch(engine, embedder, weights)
    rows: list[tuple[list[str], frozenset[str]]] = []
    for text, relevant in data.queries:
        candidates = _query(engine, embedder, text)
        order = np.argsort(-model.score(_features(search, candidates)), kind="stable")
        rows.append(([candidates[i].minute_id for i in order[: max(DEPTHS)]], relevant))
    return recall_at_depths(rows, DEPTHS)


def _recall(search: HybridSearch, queries: list[tuple[str, frozenset[str]]]) -> dict[str, float]:
    rows = [
        ([h.minute_id for h in search.search("bench", text, k=max(DEPTHS), now_ms=NOW_MS)], relevant)
        for text, relevant in queries
    ]
    return recall_at_depths(rows, DEPTHS)


def _engine(directory: Path, data: LabeledSet, embedder: BenchEmbedder, fusion: str) -> EdgeEngine:
    engine = EdgeEngine(directory, DIMENSIONS, fusion=fusion)  # type: ignore[arg-type]
    vectors = embedder.embed([text for _, text in data.minutes])
    engine.upsert(
        [
            MemoryPoint(
                minute_id,
                "bench",
                text,
                {"timestamp_ms": NOW_MS, "scores": {"composite": 0.5}, "category": "project_knowledge"},
                dense,
            )
            for (minute_id, text), dense in zip(data.minutes, vectors, strict=True)
        ]
    )
    return engine


def run(seed: int = 7) -> dict[str, Any]:
    """Recall of every fusion for every dense-leg quality."""
    data = labeled_set(seed)
    weights = RankWeights(*defaults.SEARCH_WEIGHTS_WITH_EMBEDDINGS)
    out: dict[str, Any] = {
        "minutes": len(data.minutes),
        "queries": len(data.queries),
        "relevant_per_query": MINUTES_PER_TOPIC,
        "weights": {"semantic": weights.semantic, "keyword": weights.keyword},
    }
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pvm-fusion-") as tmp:
        for quality in QUALITIES:
            embedder = BenchEmbedder(quality, data.concept_of)
            rrf = _engine(Path(tmp) / f"{quality}-rrf", data, embedder, "rrf")
            dbsf = _engine(Path(tmp) / f"{quality}-dbsf", data, embedder, "dbsf")
            try:
                if "lexical_only" not in out:
                    out["lexical_only"] = _recall(HybridSearch(rrf, None, weights), data.queries)
                dense_only = RankWeights(semantic=1.0, keyword=0.0, recency=0.0, importance=0.0)
                out[quality] = {
                    "dense_only": _recall(HybridSearch(rrf, embedder, dense_only), data.queries),
                    "agree": _recall(HybridSearch(rrf, embedder, weights, fusion="agree"), data.queries),
                    "max": _recall(HybridSearch(rrf, embedder, weights, fusion="max"), data.queries),
                    "minmax": _recall(HybridSearch(rrf, embedder, weights, fusion="minmax"), data.queries),
                    "rrf": _recall(HybridSearch(rrf, embedder, weights, fusion="rrf"), data.queries),
                    "engine_rrf": _recall(HybridSearch(rrf, embedder, weights, fusion="engine"), data.queries),
                    "engine_dbsf": _recall(HybridSearch(dbsf, embedder, weights, fusion="engine"), data.queries),
                    "learned": _learned(quality, seed, rrf, data, Path(tmp)),
                }
            finally:
                rrf.close()
                dbsf.close()
                best = max(out["lexical_only"]["recall_at_10"], out[quality]["dense_only"]["recall_at_10"])
                hybrid = out[quality][defaults.SEARCH_FUSION]["recall_at_10"]
                out[quality]["hybrid_minus_best_leg"] = round(hybrid - best, 3)
    out["fusion"] = defaults.SEARCH_FUSION
    out["seconds"] = round(time.perf_counter() - started, 2)
    out["machine"] = machine()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    result = run(args.seed)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{result['minutes']} minutes, {result['queries']} queries, {result['relevant_per_query']} relevant each")
    lex = result["lexical_only"]
    print(f"{'lexical only':<14} {'':<8} recall@5 {lex['recall_at_5']:.3f}  recall@10 {lex['recall_at_10']:.3f}")
    for quality in QUALITIES:
        for name, r in result[quality].items():
            if not isinstance(r, dict):
                print(f"{name:<14} {quality:<8} {r:+.3f}")
                continue
            print(f"{name:<14} {quality:<8} recall@5 {r['recall_at_5']:.3f}  recall@10 {r['recall_at_10']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
