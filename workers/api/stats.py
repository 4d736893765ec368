"""A project's memory in numbers (`pvm stats`, ``GET /v1/projects/{p}/stats``): what it holds and what was pruned.

Read from Redis alone (the heads, the facts store, the evaluate pool's
records and counters), so the reader API answers it without the log or the
vector engine. Averages are those of the memories the last evaluation run
kept; a project never evaluated has none.
"""

from __future__ import annotations

from typing import Any, cast

import redis

from contracts import keys
from contracts.facts import GLOBAL_KEY, FactStatus, FactType, Tier, TierKey
from pvm.connection import bulk_reply, hash_reply
from pvm.stores.fact_projection import StoredFact
from pvm.vectors import GLOBAL_TENANT as GLOBAL_RUN  # the global tier's evaluation run (workers.evaluate.pool)
from workers.evaluate.evaluation import SCORE_PARTS

# -- the summarize pool's counts ---------------------------------------------------------------------------------


def summary_counts(connection: redis.Redis, project_id: str) -> tuple[int, int]:
    """(chunks, episodes) the summarize pool holds for a project, over all its threads."""
    from pvm.stores.summaries import SummaryStore

    return SummaryStore(connection).counts(project_id)


def project_stats(connection: redis.Redis, project_id: str) -> dict[str, Any]:
    """Minutes, facts by type and tier, chunks, episodes, pruned, merged, tokens reclaimed and average scores.

    `project_id` `GLOBAL_RUN` (``_global``, the vector store's tenant of global facts) gives the global tier's:
    its facts and what its evaluation runs pruned and merged (no minutes, chunks or episodes of its own).
    """
    is_global = project_id == GLOBAL_RUN
    tier = GLOBAL_KEY if is_global else TierKey.for_project(project_id)
    pipe = connection.pipeline(transaction=False)
    pipe.hget(keys.log_head(project_id), "seq")
    pipe.hget(keys.index_head(project_id), "seq")
    pipe.hgetall(keys.facts_by_id(tier))
    pipe.hgetall(keys.evaluation_totals(project_id))
    pipe.hkeys(keys.evaluation_pruned(project_id))
    pipe.hget(keys.evaluated_projects(), project_id)
    log_seq, index_seq, facts_raw, totals_raw, pruned_raw, completed = pipe.execute()
    pruned_ids = set(cast(list[bytes], pruned_raw))
    by_type = {t.value: 0 for t in FactType}
    by_tier = {Tier.GLOBAL.value: 0} if is_global else {Tier.TASK.value: 0, Tier.PROJECT.value: 0}
    for fact_id, raw in hash_reply(facts_raw).items():
        if fact_id in pruned_ids:
            continue
        fact = StoredFact.unpack(raw).fact
        if fact.status is FactStatus.PROMOTED and fact.tier_key.project_id == tier.project_id:
            by_type[fact.type.value] += 1
            by_tier[fact.tier_key.tier.value] += 1
    totals = {k.decode(): v.decode() for k, v in hash_reply(totals_raw).items()}
    merged = int(totals.get("merged", 0))
    chunks, episodes = (0, 0) if is_global else summary_counts(connection, project_id)
    averages: dict[str, float | None] = {
        part: float(totals[f"avg_{part}"]) if f"avg_{part}" in totals else None for part in (*SCORE_PARTS, "composite")
    }
    averages["fact_composite"] = float(totals["avg_fact_composite"]) if "avg_fact_composite" in totals else None
    done = bulk_reply(completed)
    return {
        "project_id": project_id,
        "minutes": int(log_seq or 0),
        "indexed": int(index_seq or 0),
        "facts": {"total": sum(by_tier.values()), "by_type": by_type, "by_tier": by_tier},
        "chunks": chunks,
        "episodes": episodes,
        "pruned": int(totals.get("pruned", 0)),
        "merged": merged,
        "conflicts": int(totals.get("conflicts", 0)),
        "tokens_reclaimed": int(totals.get("tokens_reclaimed", 0)),
        "average_scores": averages,
        "last_evaluated": float(done) if done is not None else None,
    }
