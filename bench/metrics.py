"""Recall@k, the one definition every retrieval benchmark in bench/ reports.

Recall@k of a query = |its relevant ids among the first k ranked ids| / |its relevant ids|;
a set's figure is the mean over its queries, rounded to 3 places. bench/retrieval.py,
bench/expansion.py, bench/fusion.py and bench/kinds.py all count with these functions.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

PLACES = 3  # the rounding of every reported recall


def recall_at_k(ranked_ids: Sequence[str], relevant_ids: Collection[str], k: int | None) -> float:
    """The share of `relevant_ids` among the first `k` of `ranked_ids` (``None``: all of them, for a ranking
    already cut at k whose results stand for several ids each, as a fact or a summary does its sources)."""
    relevant = set(relevant_ids)
    if not relevant:
        raise ValueError("recall needs at least one relevant id")
    top = ranked_ids if k is None else ranked_ids[:k]
    return len(relevant.intersection(top)) / len(relevant)


def mean_recall(values: Iterable[float]) -> float:
    """The mean of per-query recalls, rounded as every benchmark reports it; at least one value."""
    values = list(values)
    if not values:
        raise ValueError("a mean recall needs at least one query")
    return round(sum(values) / len(values), PLACES)


def recall_at_depths(rows: Sequence[tuple[Sequence[str], Collection[str]]], depths: Iterable[int]) -> dict[str, float]:
    """``recall_at_<k>`` for each k of `depths`: the mean recall@k over `rows` of (ranked ids, relevant ids)."""
    return {
        f"recall_at_{k}": mean_recall(recall_at_k(ranked, relevant, k) for ranked, relevant in rows) for k in depths
    }
