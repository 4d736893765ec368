"""Hybrid search over a project's minutes, facts and thread summaries: lexical and dense legs, then a prior.

The engine (`pvm.vectors`) returns candidates from the lexical leg and, when an
embedder is configured, the dense leg, with each leg's score and rank.
`HybridSearch` takes more candidates than asked for (max(50, 5·k)), puts each
leg on 0..1 per query and ranks by relevance, with recency and importance as
a prior that orders near-ties (issue 12):

    relevance = share·semantic + (1 - share)·keyword        # fusion "agree" (SEARCH_FUSION)
    prior     = (w_rec·recency + w_imp·importance) / (w_rec + w_imp)
    score     = (1 - SEARCH_PRIOR_SHARE)·relevance + SEARCH_PRIOR_SHARE·prior

Each leg is min-max normalized over the candidates (a candidate a full leg
missed gets its lowest score, not 0). The dense leg's share is the weights'
w_sem / (w_sem + w_kw) when the legs agree on the query (at least
`SEARCH_AGREE_FULL` of the lexical top `SEARCH_AGREE_DEPTH` is in the dense
top), when the words back the dense leg's top (`SEARCH_AGREE_SUPPORT`) or when
the words single nothing out (`SEARCH_AGREE_FLAT`), sliding down to
`SEARCH_AGREE_FLOOR` when nothing says so (`_dense_share`): neither a dense leg
that knows nothing about the query nor words that miss it outvote the other
leg. Each leg's own best candidates rank above the rest (`SEARCH_LEG_SLOTS` of
k places, split by the dense share; parts "slot"), so the answer holds what the
leg it leans on finds. recency = 0.5 ** (age / half-life) (7 days), importance
= the stored scores without their recency (`pvm.vectors.importance`). Recency
leads (`SEARCH_RECENT_SHARE` of the score, by the candidates' own time span)
only when the query asks for the newest or the caller passes ``prefer="recent"``.
With both legs, a thread ranks as one answer: each of its minutes is at least
`SEARCH_THREAD_MATCH` times the thread's best keyword and best semantic score
fused (`_thread_matches`: one minute says the question's words, another its
meaning), and words that single nothing out get no place of their own
(`SEARCH_WORD_SLOTS_FLAT`). The best `SEARCH_THREAD_HITS` candidates lift the
other candidates of their thread within `SEARCH_THREAD_NEAR` places of them to
`SEARCH_THREAD_DECAY` of their score (multi-hop, `_thread_lifted`; places among
all the thread's minutes, read around the hit: `VectorEngine.around`); with a
dense leg the best `SEARCH_NEIGHBOUR_HITS` hits bring in the minute before and
after them in their thread when the dense leg finds it near the query
(`_with_neighbours`: minutes that are no candidate at all); and the best
`SEARCH_ADJACENT_HITS` hits bring in the minute before and after them at
`SEARCH_ADJACENT_DECAY` of their score whatever it says (`_with_adjacent`: a
question's reply in conversation).

Every default was chosen on bench/retrieval.py's sessions and timeline sets
(and bench/fusion.py's weak and noise legs), with bench/multihop.py held out;
docs/search.md ("How the defaults were chosen") has the figures and the evidence. The
other fusions ("max", "minmax", "rrf", "engine") stay to measure against.
bench/fusion.py (seed 7, default weights 0.6 / 0.1, recall@10): with a good
dense leg every fusion is within 0.002 (agree 0.885, dense alone 0.878); with
a weak one agree 0.567 against lexical-only 0.582 (max 0.505, min-max 0.492,
Qdrant RRF 0.593); with a noise leg agree 0.573 (max 0.025, min-max 0.018,
RRF 0.558): the other weighted fusions let a useless leg decide.

A search never waits out an embedding provider's outage: its query gets one
try within PVM_EMBED_QUERY_TIMEOUT (`embed_query`, no retries), and after a
failure `DenseLegBreaker` skips the dense leg for `DENSE_COOLDOWN_S` before one
search tries again, so an outage costs one timeout per cool-down, not one per
search. Such an answer is lexical-only and says so: `SearchResult.degraded`
reads "dense leg skipped: <reason>".

Facts and summaries. Every fact is its own point beside the minutes
(`workers.index.fact_points`), and so is every chunk and episode summary of a thread
(`workers.index.summary_points`); ``kinds`` names what a search returns (minutes by
default; ``("minute", "fact", "summary")`` all), ranked together by the same
score (a fact's recency is from when PVM recorded it, a summary's from its
newest source minute; a fact's importance is the fact's). A fact or summary
hit carries the minute ids it stands for (``sources``). Facts are narrowed by type, tier and status
(promoted by default), and ``as_of`` travels in time: the facts that held
then and that PVM knew by then, and the minutes written by then. The task and
project tiers are the project's own; the global tier is read only when
``tiers`` names it, from a tenant of its own (`pvm.vectors.GLOBAL_TENANT`).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from contracts.facts import FactStatus, FactType, Tier, check_time
from contracts.ids import id_timestamp_ms
from contracts.memory import FactHit, Insight, RankWeights, Scores, SearchFilters, SearchHit, SummaryHit
from pvm import defaults, vectors
from pvm.protocols import (
    FACT,
    MINUTE,
    SUMMARY,
    AskedMinutes,
    Candidate,
    Embedder,
    FactFilters,
    MinuteSource,
    SummaryFilters,
    VectorEngine,
)
from pvm.providers import CircuitBreaker
from pvm.vectors import GLOBAL_TENANT, cut_window, importance, require_project

log = logging.getLogger(__name__)

HALF_LIFE_MS = defaults.SEARCH_HALF_LIFE_MS

# How the lexical and dense legs are put on 0..1 before weighting (see the module docstring):
# "agree" (the default) is "minmax" with the dense leg's share set by the legs' agreement on the query (`_agreement`),
# "max" divides each leg by its best score, "minmax" stretches each leg over 0..1,
# "engine" uses Qdrant's fused score (RRF k=60 or DBSF, as the engine was built) for both legs' share.
# "rrf" sums each leg's 1 / (k + rank) with k = SEARCH_RRF_K (small: the top ranks decide), weighted by the legs'
# weights, over the best possible sum.
FusionMode = Literal["agree", "max", "minmax", "engine", "rrf"]
FUSION_MODES: tuple[str, ...] = ("agree", "max", "minmax", "engine", "rrf")
DEFAULT_FUSION: FusionMode = defaults.SEARCH_FUSION  # type: ignore[assignment]

# What a search ranks by besides relevance (`prefer`): None reads the query ("latest", "current", "now"...),
# "relevant" never lets recency lead, "recent" always does.
Prefer = Literal["relevant", "recent"]
PREFERENCES: tuple[str, ...] = ("relevant", "recent")
_RECENT_WORDS = re.compile(
    r"\b(?:" + "|".join(w.replace(" ", r"\s+") for w in defaults.SEARCH_RECENT_WORDS) + r")\b", re.IGNORECASE
)

DENSE_COOLDOWN_S = defaults.SEARCH_DENSE_COOLDOWN_S
DEGRADED_PREFIX = "dense leg skipped: "

# What a search can return, and the facts it returns unless told otherwise.
KINDS: tuple[str, ...] = (MINUTE, FACT, SUMMARY)
FACT_TYPES: tuple[str, ...] = tuple(t.value for t in FactType)
TIERS: tuple[str, ...] = tuple(t.value for t in Tier)
STATUSES: tuple[str, ...] = tuple(s.value for s in FactStatus)
DEFAULT_KINDS: tuple[str, ...] = (MINUTE,)
DEFAULT_TIERS: tuple[str, ...] = (Tier.TASK.value, Tier.PROJECT.value)  # the global tier only when asked for
DEFAULT_STATUSES: tuple[str, ...] = (FactStatus.PROMOTED.value,)  # current knowledge
# With as_of, a fact superseded since then was current then.
DEFAULT_STATUSES_AS_OF: tuple[str, ...] = (FactStatus.PROMOTED.value, FactStatus.SUPERSEDED.value)

Hit = SearchHit | FactHit | SummaryHit


@dataclass(frozen=True, slots=True)
class SearchResult:
    """A search's minutes, facts and summaries, best first, and why the answer is lexical-only when it should not be
    (else None).

    `hits` holds the minutes, `facts` the facts, `summaries` the chunk and episode summaries, `ranked` all in one
    order.
    """

    hits: list[SearchHit]
    degraded: str | None = None  # "dense leg skipped: <reason>"
    facts: list[FactHit] = field(default_factory=list)
    summaries: list[SummaryHit] = field(default_factory=list)

    @property
    def ranked(self) -> list[Hit]:
        """Minutes, facts and summaries together, best first (on an equal score, minutes first, then facts)."""
        if not self.facts and not self.summaries:
            return list(self.hits)
        every: list[Hit] = [*self.hits, *self.facts, *self.summaries]
        return sorted(every, key=lambda h: -h.score)


class DenseLegBreaker(CircuitBreaker):
    """The circuit breaker on query embeddings: after one failure, searches skip the dense leg for a cool-down.

    A `pvm.providers.CircuitBreaker` that opens at the first failure (a search
    must not pay a second timeout to learn what the first one said), and whose
    refusals read as the degraded answer says them: "dense leg skipped: <reason>
    (next try in Ns)". After the cool-down one search (the trial) embeds again.
    """

    def __init__(self, cooldown_s: float = DENSE_COOLDOWN_S, clock: Callable[[], float] = time.monotonic) -> None:
        if cooldown_s < 0:
            raise ValueError(f"dense_cooldown_s must be 0 or more seconds, got {cooldown_s}")
        super().__init__(cooldown_s, threshold=1, clock=clock)

    def admit(self) -> str | None:
        """None when this search may embed its query; else why the dense leg is skipped."""
        refused = super().admit()
        return None if refused is None else DEGRADED_PREFIX + refused


class HybridSearch:
    """Searches a project's minutes: candidates from the vector engine, ranked by relevance, recency and importance."""

    def __init__(
        self,
        engine: VectorEngine,
        embedder: Embedder | None = None,
        weights: RankWeights | None = None,
        *,
        fusion: FusionMode = DEFAULT_FUSION,
        half_life_ms: int = HALF_LIFE_MS,
        dense_cooldown_s: float = DENSE_COOLDOWN_S,
        minutes: MinuteSource | None = None,
    ) -> None:
        """`minutes`: where hits read their whole minute (minute points do not hold it; `pvm.stores.minutes`).

        Without one, a hit's minute is what its point holds (points written
        before they were made light hold it; light ones hold none): a
        `ContextReader` given this searcher sets its own source, and
        `pvm.engines.searcher_for` builds one from the settings.
        """
        weights = weights or RankWeights()
        parts = (weights.semantic, weights.keyword, weights.recency, weights.importance)
        if any(w < 0 for w in parts) or not any(parts):
            raise ValueError(f"weights must be non-negative and not all zero, got {weights}")
        if fusion not in FUSION_MODES:
            raise ValueError(f"fusion={fusion!r} is not one of {', '.join(FUSION_MODES)}")
        if half_life_ms <= 0:
            raise ValueError(f"half_life_ms must be positive, got {half_life_ms}")
        self.engine = engine
        self.embedder = embedder if embedder is not None and embedder.dimensions is not None else None
        self.weights = weights
        self.fusion = fusion
        self.half_life_ms = half_life_ms
        self.dense_breaker = DenseLegBreaker(dense_cooldown_s)
        self.minutes = minutes
        self._long_threads = LongThreads()

    def search(
        self,
        project_id: str,
        query: str,
        filters: SearchFilters | None = None,
        k: int = defaults.SEARCH_K,
        now_ms: int | None = None,
        *,
        kinds: Collection[str] = DEFAULT_KINDS,
        fact_types: Collection[str] = (),
        tiers: Collection[str] = DEFAULT_TIERS,
        statuses: Collection[str] | None = None,
        as_of: str | datetime | int | None = None,
        prefer: Prefer | None = None,
    ) -> list[Hit]:
        """The best `k` minutes (and/or facts) of the project for `query`, best first (`search_result`'s `ranked`)."""
        return self.search_result(
            project_id,
            query,
            filters,
            k,
            now_ms,
            kinds=kinds,
            fact_types=fact_types,
            tiers=tiers,
            statuses=statuses,
            as_of=as_of,
            prefer=prefer,
        ).ranked

    def search_result(
        self,
        project_id: str,
        query: str,
        filters: SearchFilters | None = None,
        k: int = defaults.SEARCH_K,
        now_ms: int | None = None,
        *,
        kinds: Collection[str] = DEFAULT_KINDS,
        fact_types: Collection[str] = (),
        tiers: Collection[str] = DEFAULT_TIERS,
        statuses: Collection[str] | None = None,
        as_of: str | datetime | int | None = None,
        prefer: Prefer | None = None,
        payloads: bool = True,
    ) -> SearchResult:
        """The best `k` minutes and/or facts of the project for `query` within `filters`, and whether it degraded.

        `kinds`: ``("minute",)`` (default), or any of ``"minute"``, ``"fact"``
        and ``"summary"`` (a thread's chunk or episode summary, with the minute
        ids it stands for: `SummaryHit.sources`), ranked together. Summaries
        take `filters`' thread and time bounds. Facts are narrowed by `fact_types` (any by default), `tiers`
        (task and project by default: the global tier only when named) and
        `statuses` (promoted by default; with `as_of`, promoted or superseded).
        Of `filters`, facts take `task_id` and `min_composite` (their
        importance); the rest describe minutes. `as_of` (ISO 8601 with an
        offset, an aware datetime, or Unix ms) keeps the facts valid then
        (``valid_from <= t < valid_until``) that PVM had recorded and not
        cleared by then, and the minutes written by then; recency is measured
        from it unless `now_ms` is given.

        Relevance decides the order; recency and importance break near-ties.
        Recency leads when the query asks for the newest ("latest", "current",
        "now", "last time": `SEARCH_RECENT_WORDS`) or `prefer` is "recent";
        `prefer="relevant"` keeps it a tie-breaker whatever the query says.

        An empty query finds nothing. If the query cannot be embedded (or the
        breaker says the provider is failing), the search goes on with the
        lexical leg alone and `degraded` says why: a reader must answer.

        Candidates come with only what ranking reads (`RANKING_FIELDS`); the
        whole payloads are retrieved for the `k` that rank highest. A winner
        deleted in between (its project reset for a replay) is left out.

        With ``payloads=False`` a minute hit holds its minute, score and parts
        but not what only its point holds (``category`` empty, no insights or
        scores): a caller that keeps a few of the hits by their minutes (the
        context keeps 5 of 15 distinct ones) reads those few points with
        `with_payloads`. Facts and summaries always come whole.
        """
        project_id = require_project(project_id)
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive whole number, got {k!r}")
        wanted = _among("kinds", kinds, KINDS, empty_ok=False)
        as_of_ms = _instant_ms(as_of)
        recent = wants_recent(query, prefer)
        facts = None
        if FACT in wanted:
            facts = FactFilters(
                types=_among("fact_types", fact_types, FACT_TYPES),
                tiers=_among("tiers", tiers, TIERS, empty_ok=False),
                statuses=_among("statuses", statuses, STATUSES, empty_ok=False)
                if statuses is not None
                else (DEFAULT_STATUSES if as_of_ms is None else DEFAULT_STATUSES_AS_OF),
                as_of_ms=as_of_ms,
            )
        if not query or not query.strip():
            return SearchResult([])
        dense, degraded = self._embed(query)
        limit = max(defaults.SEARCH_MIN_CANDIDATES, defaults.SEARCH_CANDIDATES_PER_HIT * k)
        filters = filters or SearchFilters()
        now = now_ms if now_ms is not None else as_of_ms if as_of_ms is not None else int(time.time() * 1000)
        if facts is not None or SUMMARY in wanted or as_of_ms is not None:
            return self._search_kinds(
                project_id, query, dense, filters, k, limit, now, wanted, facts, as_of_ms, degraded, recent
            )
        candidates = self.engine.query(
            project_id, query, dense, filters, limit, with_payload=False, fused=self.fusion == "engine"
        )
        # The adjacent minutes of the best hits are read with the thread lift's windows, in one call.
        window = self._window(project_id, filters, ahead=0 if recent else defaults.SEARCH_ADJACENT_HITS)
        best = self._ranked(candidates, now, limit, recent, k, window)[:k]
        if dense is not None:
            best = self._with_neighbours(project_id, dense, filters, candidates, best, k)
        if not recent:  # a question for the newest is answered by recency, not by the turns around a hit
            best = _with_adjacent(best, k, window)
        if not best:
            return SearchResult([], degraded)
        ids = [c.minute_id for _, c, _ in best]
        if not payloads and self.minutes is not None:
            return SearchResult(self._light_hits(project_id, best, self.minutes), degraded)
        asked = self.minutes.ask(project_id, ids) if self.minutes is not None else None  # answered meanwhile
        try:
            winners = self.engine.retrieve(project_id, ids)
        except BaseException:
            if asked is not None:
                asked.drop()
            raise
        stored = self._whole(project_id, {c.minute_id: c.payload for c in winners}, asked)
        hits = [
            _hit(c.minute_id, stored[c.minute_id], score, parts) for score, c, parts in best if c.minute_id in stored
        ]
        return SearchResult(hits, degraded)

    def with_payloads(self, project_id: str, hits: Sequence[SearchHit]) -> list[SearchHit]:
        """`hits` (of ``search_result(..., payloads=False)``) with what their points hold: category, insights, scores,
        in one read by id. A hit whose point is gone (its project reset for a replay) is left out, as
        `search_result` leaves out a winner deleted in between."""
        if not hits:
            return []
        points = {c.minute_id: c.payload for c in self.engine.retrieve(project_id, [h.minute_id for h in hits])}
        return [
            _hit(h.minute_id, {**points[h.minute_id], "minute": h.minute}, h.score, h.parts)
            for h in hits
            if h.minute_id in points
        ]

    def _light_hits(
        self, project_id: str, best: list[tuple[float, Candidate, dict[str, float]]], minutes: MinuteSource
    ) -> list[SearchHit]:
        """The hits of `best` with their whole minutes and without their points' payloads (``payloads=False``). A
        minute found in neither the cache nor the log is looked for in its point (a point written before points
        were made light holds it), as `search_result` does."""
        found = minutes.minutes_by_id(project_id, [c.minute_id for _, c, _ in best])
        lacking = [c.minute_id for _, c, _ in best if c.minute_id not in found]
        if lacking:
            points = self.engine.retrieve(project_id, lacking)
            found.update(
                (key, p["minute"])
                for key, p in self._whole(project_id, {c.minute_id: c.payload for c in points}).items()
            )
        return [
            SearchHit(c.minute_id, score, found[c.minute_id], "", parts=parts)
            for score, c, parts in best
            if c.minute_id in found
        ]

    def _with_neighbours(
        self,
        project_id: str,
        dense: list[float],
        filters: SearchFilters,
        candidates: Sequence[Candidate],
        best: list[tuple[float, Candidate, dict[str, float]]],
        k: int,
    ) -> list[tuple[float, Candidate, dict[str, float]]]:
        """`best` with the thread neighbours of its top hits brought in, the best `k` of all (multi-hop).

        Each of the best `SEARCH_NEIGHBOUR_HITS` hits in a thread brings in the minute just before and just after
        it, in time, among the thread's `SEARCH_NEIGHBOUR_LIMIT` minutes nearest the query (one dense query per
        thread, within `filters`), at `SEARCH_NEIGHBOUR_DECAY` of its score (parts "neighbour"): an answer's next
        step often shares neither the question's words nor enough of its meaning to be a candidate. The dense
        leg gates it: the neighbour's query similarity must reach the candidates' lowest less
        `SEARCH_NEIGHBOUR_MARGIN` and `SEARCH_NEIGHBOUR_RELATIVE` of the hit's, so a thread's unrelated
        minutes stay out.
        """
        found = [c.semantic for c in candidates if "semantic_rank" in c.extra]
        hits = defaults.SEARCH_NEIGHBOUR_HITS
        if not found or hits <= 0:
            return best
        bar = min(found) - defaults.SEARCH_NEIGHBOUR_MARGIN
        have = {c.minute_id for _, c, _ in best}
        members: dict[str, list[Candidate]] = {}
        added: list[tuple[float, Candidate, dict[str, float]]] = []
        for score, hit, _ in best[:hits]:
            thread = hit.payload.get("thread_id")
            if not isinstance(thread, str) or not thread:
                continue
            if thread not in members:
                members[thread] = self.engine.query(
                    project_id,
                    "",
                    dense,
                    replace(filters, thread_id=thread),
                    defaults.SEARCH_NEIGHBOUR_LIMIT,
                    with_payload=False,
                    fused=False,
                )
            in_time = {c.minute_id: c for c in members[thread]}
            similarity = in_time[hit.minute_id].semantic if hit.minute_id in in_time else hit.semantic
            in_time.setdefault(hit.minute_id, hit)
            order = sorted(in_time.values(), key=lambda c: (_timestamp_ms(c) or 0, c.minute_id))
            at = next(i for i, c in enumerate(order) if c.minute_id == hit.minute_id)
            for neighbour in order[max(0, at - 1) : at] + order[at + 1 : at + 2]:
                if neighbour.minute_id in have:
                    continue
                if neighbour.semantic < max(bar, defaults.SEARCH_NEIGHBOUR_RELATIVE * similarity):
                    continue
                lifted = score * defaults.SEARCH_NEIGHBOUR_DECAY
                have.add(neighbour.minute_id)
                added.append((lifted, neighbour, {"neighbour": lifted, "semantic_similarity": neighbour.semantic}))
        if not added:
            return best
        return sorted([*best, *added], key=lambda s: -s[0])[:k]  # stable: `best` keeps its order among equals

    def _window(self, project_id: str, filters: SearchFilters, ahead: int = 0) -> ThreadWindows:
        """The threads around this search's hits (`ThreadWindows`), `ahead` of the best asked for with the lift's."""
        return ThreadWindows(self.engine, project_id, filters, self._long_threads, ahead)

    def _search_kinds(
        self,
        project_id: str,
        query: str,
        dense: list[float] | None,
        filters: SearchFilters,
        k: int,
        limit: int,
        now: int,
        kinds: tuple[str, ...],
        facts: FactFilters | None,
        as_of_ms: int | None,
        degraded: str | None,
        recent: bool = False,
    ) -> SearchResult:
        """`search_result` for facts or summaries, or for minutes as of a time: one query per kind and tenant,
        ranked together.

        Every query names its tenant in a `must` condition: the project, or for
        global facts (only when `facts.tiers` names the global tier) the global
        tenant, which no project can be.
        """
        queries: list[tuple[str, str, SearchFilters, FactFilters | SummaryFilters | None]] = []
        if MINUTE in kinds:
            queries.append((MINUTE, project_id, _until(filters, as_of_ms), None))
        if SUMMARY in kinds:
            queries.append((SUMMARY, project_id, filters, SummaryFilters(as_of_ms)))
        if facts is not None:
            own = tuple(t for t in facts.tiers if t != Tier.GLOBAL.value)
            if own:
                queries.append((FACT, project_id, filters, replace(facts, tiers=own)))
            if Tier.GLOBAL.value in facts.tiers:
                queries.append((FACT, GLOBAL_TENANT, filters, replace(facts, tiers=(Tier.GLOBAL.value,))))
        candidates: list[Candidate] = []
        source: dict[int, tuple[str, str]] = {}  # id(candidate) -> (kind, tenant)
        for kind, tenant, of_query, fact_filters in queries:
            if fact_filters is None:
                found = self.engine.query(
                    tenant, query, dense, of_query, limit, with_payload=False, fused=self.fusion == "engine"
                )
            else:
                found = self.engine.query(
                    tenant,
                    query,
                    dense,
                    of_query,
                    limit,
                    with_payload=False,
                    facts=fact_filters,
                    fused=self.fusion == "engine",
                )
            for c in found:
                source[id(c)] = (kind, tenant)
            candidates += found
        best = self._ranked(candidates, now, limit, recent, k)[:k]
        wanted: dict[tuple[str, str], list[str]] = {}
        for _, c, _ in best:
            wanted.setdefault(source[id(c)], []).append(c.minute_id)
        stored: dict[tuple[str, str, str], dict[str, Any]] = {}
        for (kind, tenant), keys in wanted.items():
            if kind == MINUTE:
                whole = self._whole(tenant, {c.minute_id: c.payload for c in self.engine.retrieve(tenant, keys)})
                stored.update(((kind, tenant, key), payload) for key, payload in whole.items())
            else:
                stored.update(((kind, tenant, p.key), p.payload) for p in self.engine.get_points(tenant, keys))
        hits: list[SearchHit] = []
        fact_hits: list[FactHit] = []
        summary_hits: list[SummaryHit] = []
        for score, c, parts in best:
            kind, tenant = source[id(c)]
            payload = stored.get((kind, tenant, c.minute_id))
            if payload is None:
                continue
            if kind == MINUTE:
                hits.append(_hit(c.minute_id, payload, score, parts))
            elif payload.get("kind") == FACT and isinstance(payload.get("fact"), dict):
                fact_hits.append(FactHit(c.minute_id, score, payload["fact"], parts))
            elif payload.get("kind") == SUMMARY:
                summary_hits.append(_summary_hit(c.minute_id, payload, score, parts))
        return SearchResult(hits, degraded, fact_hits, summary_hits)

    def _whole(
        self, project_id: str, payloads: dict[str, dict[str, Any]], asked: AskedMinutes | None = None
    ) -> dict[str, dict[str, Any]]:
        """Minute payloads with their whole minute, read in one call from `minutes` for those that lack it (or
        from `asked`, the winners' minutes asked of it before their points were read: read here either way).

        A point written before points were made light holds its minute and
        keeps it. A minute found nowhere (its log gone) is left out, as a
        winner deleted in between is: a hit always carries its whole minute.
        Without `minutes` the payloads stay as stored (a caller that indexed
        its own points, such as a benchmark, ranks them without minutes).
        """
        lacking = {key for key, payload in payloads.items() if not isinstance(payload.get("minute"), dict)}
        if not lacking or self.minutes is None:
            if asked is not None:
                asked.read(())  # nothing wanted of it: its reply is taken off the connection
            return payloads
        if asked is not None:
            found = asked.read(sorted(lacking))
        else:
            found = self.minutes.minutes_by_id(project_id, sorted(lacking))
        out = {}
        for key, payload in payloads.items():
            if key not in lacking:
                out[key] = payload
            elif key in found:
                out[key] = {**payload, "minute": found[key]}
        if len(out) < len(payloads):
            log.warning(
                "search in %s: %d winning minute(s) found in neither the minute cache nor the log; left out "
                "(is the project's log complete?)",
                project_id,
                len(payloads) - len(out),
            )
        return out

    def rank(
        self,
        candidates: Sequence[Candidate],
        now_ms: int,
        limit: int | None = None,
        k: int | None = None,
        *,
        recent: bool = False,
    ) -> list[SearchHit]:
        """The best `k` candidates (all by default) as hits, best first: the ranking `search` applies.

        `limit` is how many candidates each leg was asked for: a leg that came
        back full gives the candidates it missed its lowest score (they ranked
        below it, not at zero); a leg that came back short missed them outright.
        The hits are built from the candidates' payloads.
        """
        return [
            _hit(c.minute_id, c.payload, score, parts)
            for score, c, parts in self._ranked(candidates, now_ms, limit, recent, k)[:k]
        ]

    def _ranked(
        self,
        candidates: Sequence[Candidate],
        now_ms: int,
        limit: int | None = None,
        recent: bool = False,
        k: int | None = None,
        window: ThreadWindows | None = None,
    ) -> list[tuple[float, Candidate, dict[str, float]]]:
        """Every candidate with its score and the parts of it, best first (`rank` without building hits).

        Relevance (the legs, fused) decides; recency and importance are a prior
        of at most `SEARCH_PRIOR_SHARE` of the score that orders near-ties. With
        `recent`, recency among the candidates (newest 1, oldest 0) takes
        `SEARCH_RECENT_SHARE` of the score instead.
        """
        if not candidates:
            return []
        w = self.weights
        limit = limit or len(candidates)
        dense_leg = any(c.semantic or "semantic_rank" in c.extra for c in candidates)
        w_sem = w.semantic if dense_leg else 0.0
        relevance, keyword, semantic, legs = self._relevance(candidates, limit, dense_leg)
        slots = self._slots(candidates, legs, k or defaults.SEARCH_K) if legs is not None else set()
        threads, matched = (
            _thread_matches(candidates, keyword, semantic, legs.share) if legs is not None else ({}, set())
        )
        timestamps = [_timestamp_ms(c) for c in candidates]
        known = [t for t in timestamps if t is not None]
        oldest, newest = (min(known), max(known)) if known else (0, 0)
        prior_total = w.recency + w.importance
        prior_share = defaults.SEARCH_PRIOR_SHARE if w.keyword + w_sem > 0 else 1.0
        scored: list[tuple[float, int, str, Candidate, dict[str, float]]] = []
        for i, c in enumerate(candidates):
            timestamp = timestamps[i]
            parts = {
                "keyword": keyword[i],
                "recency": _recency(timestamp, now_ms, self.half_life_ms),
                "importance": _importance(c.payload),
            }
            if dense_leg:
                parts["semantic"] = semantic[i]
            if self.fusion in ("engine", "rrf"):
                parts["fused"] = relevance[i]
            if legs is not None:
                parts["agreement"] = legs.agreement
                parts["support"] = legs.support
                parts["flatness"] = legs.flatness
                parts["dense_share"] = legs.share
            match = threads.get(c.payload.get("thread_id") or "", 0.0) if c.minute_id in matched else 0.0
            if match > relevance[i]:
                parts["thread_match"] = match
                relevance[i] = match
            prior = (
                (w.recency * parts["recency"] + w.importance * parts["importance"]) / prior_total
                if prior_total
                else 0.0
            )
            score = (1 - prior_share) * relevance[i] + prior_share * prior
            if i in slots:
                parts["slot"] = 1.0
                score += 1.0
            if recent:
                newness = (timestamp - oldest) / (newest - oldest) if timestamp is not None and newest > oldest else 0.0
                parts["newness"] = newness
                score = (1 - defaults.SEARCH_RECENT_SHARE) * score + defaults.SEARCH_RECENT_SHARE * newness
            scored.append((score, timestamp or 0, c.minute_id, c, parts))
        scored.sort(key=lambda s: (-s[0], -s[1], s[2]))
        scored = _thread_lifted(scored, window, k)
        return [(score, c, parts) for score, _, _, c, parts in scored]

    def _relevance(
        self, candidates: Sequence[Candidate], limit: int, dense_leg: bool
    ) -> tuple[list[float], list[float], list[float], LegShare | None]:
        """How well each candidate matches the query, 0..1, by the fusion of the legs; each leg's scores on 0..1;
        and with fusion "agree" and both legs, the dense leg's share and what set it (else None)."""
        w = self.weights
        w_sem = w.semantic if dense_leg else 0.0
        keyword = self._leg(candidates, "keyword", limit)
        semantic = self._leg(candidates, "semantic", limit) if dense_leg else [0.0] * len(candidates)
        total = w.keyword + w_sem
        if total <= 0:
            return [0.0] * len(candidates), keyword, semantic, None
        if self.fusion == "engine":
            return _max_normalized([c.fused for c in candidates]), keyword, semantic, None
        if self.fusion == "agree" and dense_leg:
            legs = _dense_share(candidates, keyword, w_sem / total)
            share = legs.share
            fused = [share * sem + (1 - share) * kw for kw, sem in zip(keyword, semantic, strict=True)]
            return fused, keyword, semantic, legs
        if self.fusion == "rrf":
            k = defaults.SEARCH_RRF_K
            missed = limit + 1
            sums = []
            for c in candidates:
                value = w.keyword / (k + c.extra.get("keyword_rank", missed))
                if dense_leg:
                    value += w_sem / (k + c.extra.get("semantic_rank", missed))
                sums.append(value / (total / (k + 1)))
            return sums, keyword, semantic, None
        fused = [(w.keyword * kw + w_sem * sem) / total for kw, sem in zip(keyword, semantic, strict=True)]
        return fused, keyword, semantic, None

    @staticmethod
    def _slots(candidates: Sequence[Candidate], legs: LegShare, k: int) -> set[int]:
        """The candidates (by index) that rank above the rest: each leg's best, as many as its share of the slots.

        ``round(SEARCH_LEG_SLOTS * k)`` places go to the legs' own top candidates, the dense leg's share of them to
        its best and the rest to the words' best (a candidate both name takes one of each): whatever the fused score
        says, the top of each leg is in the answer, so a hybrid search finds what the leg it leans on finds. Words
        that single nothing out (flatness at least `SEARCH_WORD_SLOTS_FLAT`: a paraphrase matching only common
        words) have no best to keep, and their places are left to the fused score.
        """
        places = round(defaults.SEARCH_LEG_SLOTS * k)
        dense = round(places * legs.share)
        words = places - dense if legs.flatness < defaults.SEARCH_WORD_SLOTS_FLAT else 0
        return {
            i
            for i, c in enumerate(candidates)
            if c.extra.get("semantic_rank", dense + 1) <= dense or c.extra.get("keyword_rank", words + 1) <= words
        }

    def _leg(self, candidates: Sequence[Candidate], leg: str, limit: int) -> list[float]:
        """One leg's scores on 0..1 for every candidate, missed candidates included."""
        rank_key = f"{leg}_rank"
        scores: list[float | None] = [
            getattr(c, leg) if (rank_key in c.extra or getattr(c, leg)) else None for c in candidates
        ]
        found = [s for s in scores if s is not None]
        if not found:
            return [0.0] * len(candidates)
        deepest = max((c.extra.get(rank_key, 0.0) for c in candidates), default=0.0)
        floor = min(found) if deepest >= limit else 0.0
        filled = [floor if s is None else s for s in scores]
        if self.fusion in ("minmax", "agree"):
            return _minmax_normalized(filled)
        return _max_normalized(filled)

    def _embed(self, query: str) -> tuple[list[float] | None, str | None]:
        """The query's vector, or None and why the dense leg is skipped (None when there is no dense leg)."""
        if self.embedder is None:
            return None, None
        skipped = self.dense_breaker.admit()
        if skipped is not None:
            return None, skipped
        # OpenAIEmbedder.embed_query makes one short try; an embedder without it is used as it is.
        embed_query = getattr(self.embedder, "embed_query", None)
        try:
            vector = embed_query(query) if embed_query is not None else self.embedder.embed([query])[0]
        except Exception as exc:
            reason = f"query embedding failed: {type(exc).__name__}: {exc}"
            if self.dense_breaker.failed(reason):
                log.warning(
                    "%s; searching with the lexical leg only, and skipping the dense leg for %gs at a time "
                    "until a query embeds again",
                    reason,
                    self.dense_breaker.cooldown_s,
                    exc_info=True,
                )
            else:
                log.info("query embedding still failing (%s); the dense leg stays off", reason)
            return None, DEGRADED_PREFIX + reason
        if self.dense_breaker.succeeded():
            log.warning("query embeddings work again: searches use the dense leg")
        return list(vector), None


def wants_recent(query: str, prefer: str | None = None) -> bool:
    """Whether recency leads this search: `prefer` says so ("recent" / "relevant"), else the query's words do."""
    if prefer is None:
        return _RECENT_WORDS.search(query) is not None
    if prefer not in PREFERENCES:
        raise ValueError(f"prefer={prefer!r} is not one of {', '.join(PREFERENCES)} (or None: read the query)")
    return prefer == "recent"


def _among(name: str, values: Collection[str], allowed: tuple[str, ...], *, empty_ok: bool = True) -> tuple[str, ...]:
    """`values` as a tuple once each, if every one is in `allowed`; else a ValueError naming the argument."""
    if isinstance(values, str):
        raise ValueError(f"{name} must be a collection of names such as {allowed[:2]!r}, not the string {values!r}")
    out = tuple(dict.fromkeys(str(v) for v in values))
    unknown = [v for v in out if v not in allowed]
    if unknown:
        raise ValueError(f"{name}: {', '.join(map(repr, unknown))} not one of {', '.join(allowed)}")
    if not out and not empty_ok:
        raise ValueError(f"{name} must name at least one of {', '.join(allowed)}")
    return out


def _instant_ms(as_of: str | datetime | int | None) -> int | None:
    """`as_of` as Unix ms: an ISO 8601 timestamp with an offset, an aware datetime, or whole Unix ms."""
    if as_of is None:
        return None
    if isinstance(as_of, bool):
        raise ValueError(f"as_of must be a timestamp, an aware datetime or Unix ms, got {as_of!r}")
    if isinstance(as_of, int):
        return as_of
    if isinstance(as_of, datetime):
        if as_of.tzinfo is None:
            raise ValueError(f"as_of {as_of.isoformat()} has no UTC offset; pass an aware datetime")
        return int(as_of.timestamp() * 1000)
    try:
        return int(check_time(as_of, "as_of").timestamp() * 1000)
    except ValueError as exc:
        raise ValueError(f"as_of: {exc}") from None


def _until(filters: SearchFilters, as_of_ms: int | None) -> SearchFilters:
    """`filters` that also leave out minutes written after `as_of_ms`."""
    if as_of_ms is None:
        return filters
    until = as_of_ms + 1 if filters.until_ms is None else min(filters.until_ms, as_of_ms + 1)
    return replace(filters, until_ms=until)


# A candidate's thread around it, oldest first (`HybridSearch._window`).
# Threads remembered as longer than WINDOW_WHOLE_THREAD (per searcher): their windows are read in time order without
# first trying them in one read with the other hits' threads. Forgotten all at once when full.
LONG_THREADS_REMEMBERED = 4096


class LongThreads:
    """Which (project, thread) pairs were seen holding more than `WINDOW_WHOLE_THREAD` minutes: a hint that only
    chooses how a window is read, never what it holds (a thread that shrank since reads the longer way)."""

    def __init__(self, size: int = LONG_THREADS_REMEMBERED) -> None:
        self._seen: set[tuple[str, str]] = set()
        self._size = size

    def __contains__(self, key: tuple[str, str]) -> bool:
        return key in self._seen

    def add(self, key: tuple[str, str]) -> None:
        if len(self._seen) >= self._size:
            self._seen.clear()
        self._seen.add(key)


class ThreadWindows:
    """A hit's thread around it for one search: `SEARCH_THREAD_NEAR` minutes each side (at least 1) within the
    search's filters, in the order (timestamp, minute id), each thread read at most once.

    `read(minutes)` reads the threads of several hits in one call (`VectorEngine.in_threads`, up to
    `WINDOW_WHOLE_THREAD` + 1 minutes a thread): when that returns fewer, every thread came whole and each window
    is cut from it, as `VectorEngine.around` cuts a short thread. A thread found longer is read around each hit
    in time order (`around`) and remembered as long (`LongThreads`), so later searches do not try it whole
    again. `ahead`: how many of the best hits the caller will ask for after the thread lift's anchors (the
    adjacent minutes), read with them. The windows are the same whichever way they were read.
    """

    def __init__(
        self, engine: VectorEngine, project_id: str, filters: SearchFilters, long: LongThreads, ahead: int = 0
    ) -> None:
        self.engine = engine
        self.project_id = project_id
        self.filters = filters
        self.long = long
        self.ahead = ahead
        self._reach = max(defaults.SEARCH_THREAD_NEAR, 1)
        self._whole: dict[str, dict[str, Candidate]] = {}  # thread -> its every minute within the filters
        self._windows: dict[str, list[Candidate]] = {}  # minute id -> its window (long threads)

    def __call__(self, minute: Candidate) -> list[Candidate]:
        self.read([minute])
        thread = _thread_of(minute)
        if thread in self._whole:
            members = self._whole[thread]
            if minute.minute_id not in members:  # written since the read: it stands in its own place
                members = {**members, minute.minute_id: minute}
            return cut_window(members, minute.minute_id, self._reach)
        if minute.minute_id not in self._windows:
            within = replace(self.filters, thread_id=thread)
            self._windows[minute.minute_id] = self.engine.around(
                self.project_id, within, minute, self._reach, long=True
            )
        return self._windows[minute.minute_id]

    def read(self, minutes: Iterable[Candidate]) -> None:
        """Read the threads of these minutes that are not read yet and not known long, together."""
        threads = sorted(
            {
                thread
                for thread in map(_thread_of, minutes)
                if thread and thread not in self._whole and (self.project_id, thread) not in self.long
            }
        )
        if not threads:
            return
        each = vectors.WINDOW_WHOLE_THREAD + 1
        found = self.engine.in_threads(self.project_id, self.filters, threads, each * len(threads))
        by_thread: dict[str, dict[str, Candidate]] = {thread: {} for thread in threads}
        for c in found:
            by_thread.get(_thread_of(c), {})[c.minute_id] = c
        if len(found) < each * len(threads):
            self._whole.update(by_thread)
            return
        # Some thread is long; which, a read that stopped anywhere cannot tell: each is read alone.
        for thread in threads:
            alone = []
            if len(by_thread[thread]) < each:
                alone = self.engine.in_threads(self.project_id, self.filters, [thread], each)
            if len(by_thread[thread]) < each and len(alone) < each:
                self._whole[thread] = {c.minute_id: c for c in alone}
            else:
                self.long.add((self.project_id, thread))


def _thread_of(c: Candidate) -> str:
    thread = c.payload.get("thread_id")
    return thread if isinstance(thread, str) else ""


_OWN_ORDER = 1e-6  # a lifted minute's score: its thread's lift plus this much of its own (orders, never outranks)


def _thread_lifted(
    scored: list[tuple[float, int, str, Candidate, dict[str, float]]],
    window: ThreadWindows | None = None,
    k: int | None = None,
) -> list[tuple[float, int, str, Candidate, dict[str, float]]]:
    """`scored` (best first) with the candidates near a top hit in its thread lifted to that hit's score times a
    decay.

    An answer that spans minutes of one thread (a blocker and who owns the project, a cause and its fix, a
    question and its reply) often has one minute that says the question's words and others that do not: each of
    the best `SEARCH_THREAD_HITS` candidates brings up the candidates of its thread that sit within
    `SEARCH_THREAD_NEAR` places of it in time, to `SEARCH_THREAD_DECAY` of the thread's best hit's score (parts
    "thread"), never down, in the order of their own scores. Places are counted among all the thread's minutes
    (`window`, read from the engine) or, without a window, among the thread's candidates. A long thread that is
    mostly about other things (a day's conversation) lifts what was said right around the hit, not all of itself.
    Re-sorted best first.

    With `k`, only the best `k` are asked for, and a hit's window is read only when it could change them
    (`_could_change`): the best `k` are the same as with every window read; what ranks below them may be lifted
    less.
    """
    lift: dict[str, float] = {}
    hits: list[tuple[str, int, str]] = []  # (thread, timestamp, minute id) of each top hit with a thread
    top: dict[str, Candidate] = {}
    for score, timestamp, minute_id, c, _ in scored[: defaults.SEARCH_THREAD_HITS]:
        thread = c.payload.get("thread_id")
        if isinstance(thread, str) and thread:
            lift.setdefault(thread, score * defaults.SEARCH_THREAD_DECAY)
            hits.append((thread, timestamp, minute_id))
            top[minute_id] = c
    if not lift:
        return scored
    in_time: dict[str, list[tuple[int, str]]] = {}
    for _, timestamp, minute_id, c, _ in scored:
        thread = c.payload.get("thread_id")
        if isinstance(thread, str) and thread in lift:
            in_time.setdefault(thread, []).append((timestamp, minute_id))
    near: set[str] = set()
    if window is None:
        for thread, members in in_time.items():
            near |= _near(members, [(t, m) for th, t, m in hits if th == thread])
    else:
        # An anchor with no other candidate within reach even among the candidates lifts nothing, and its thread
        # is read only when the best hits ask for their adjacent minutes (`ahead`): all in one read.
        reach = defaults.SEARCH_THREAD_NEAR
        floor = scored[k - 1][0] if k is not None and len(scored) >= k else None
        places = {minute_id: i for i, (_, _, minute_id, _, _) in enumerate(scored)}
        anchors = [
            m
            for thread, t, m in hits
            if _could_change(scored, places, _near(in_time[thread], [(t, m)]), m, lift[thread], floor, k)
        ]
        # The adjacent minutes come in at SEARCH_ADJACENT_DECAY of a hit's score, which no lift raises above the
        # best score: below the k-th they never show, and their windows are not read ahead.
        ahead = window.ahead if floor is None or defaults.SEARCH_ADJACENT_DECAY * scored[0][0] > floor else 0
        window.read([*(top[m] for m in anchors), *(c for _, _, _, c, _ in scored[:ahead])])
        for minute_id in anchors:
            around = window(top[minute_id])
            at = _place(around, minute_id)
            near.update(c.minute_id for c in around[max(0, at - reach) : at + reach + 1])
    out = []
    changed = False
    for score, timestamp, minute_id, c, parts in scored:
        lifted = lift.get(c.payload.get("thread_id") or "", 0.0) if minute_id in near else 0.0
        if lifted > score:
            # Its own score orders a lifted minute among its thread's others: lifted alike, they would tie, and the
            # newest would lead whether or not it says anything of the question.
            lifted += _OWN_ORDER * score
            parts["thread"] = lifted
            score = lifted
            changed = True
        out.append((score, timestamp, minute_id, c, parts))
    if changed:
        out.sort(key=lambda s: (-s[0], -s[1], s[2]))
    return out


def _could_change(
    scored: list[tuple[float, int, str, Candidate, dict[str, float]]],
    places: dict[str, int],
    near: set[str],
    anchor: str,
    lift: float,
    floor: float | None,
    k: int | None,
) -> bool:
    """Whether reading the window of `anchor` could change the best `k` of `scored`: `near` (the candidates within
    reach of it among the candidates, a superset of those within reach among all its thread's minutes) holds
    another minute than itself, and one of them would be lifted (`lift` above its score) and is among the best `k`
    or would rank among them lifted (at least the k-th score, `floor`; `places`: where each minute ranks). A lift
    raises scores, never lowers them, so a minute lifted below the k-th stays below whatever else is lifted."""
    if near == {anchor}:
        return False
    if floor is None or k is None:
        return True
    for minute_id in near:
        place = places[minute_id]
        score = scored[place][0]
        if lift > score and (place < k or lift + _OWN_ORDER * score >= floor):
            return True
    return False


def _with_adjacent(
    best: list[tuple[float, Candidate, dict[str, float]]], k: int, window: ThreadWindows
) -> list[tuple[float, Candidate, dict[str, float]]]:
    """`best` with the minute just before and just after each of its best `SEARCH_ADJACENT_HITS` hits in their
    thread brought in at `SEARCH_ADJACENT_DECAY` of the hit's score (parts "adjacent"), the best `k` of all.

    In conversation the answer is often the turn after the one with the question's words ("what did you do last
    weekend?" - "we went camping"), sharing none of them: no leg finds it, and the thread lift reaches only
    candidates. The decay keeps it below the hits of its own.
    """
    have = {c.minute_id for _, c, _ in best}
    added: list[tuple[float, Candidate, dict[str, float]]] = []
    # Brought in at or below the k-th score, a minute would rank below the best k (the sort is stable): that hit's
    # window is not read.
    floor = best[k - 1][0] if len(best) >= k else None
    bringing = [
        (score, hit)
        for score, hit, _ in best[: defaults.SEARCH_ADJACENT_HITS]
        if _thread_of(hit) and (floor is None or score * defaults.SEARCH_ADJACENT_DECAY > floor)
    ]
    window.read(hit for _, hit in bringing)
    for score, hit in bringing:
        around = window(hit)
        at = _place(around, hit.minute_id)
        for adjacent in around[max(0, at - 1) : at] + around[at + 1 : at + 2]:
            if adjacent.minute_id in have:
                continue
            lifted = score * defaults.SEARCH_ADJACENT_DECAY
            have.add(adjacent.minute_id)
            added.append((lifted, adjacent, {"adjacent": lifted}))
    if not added:
        return best
    # Stable on the score alone: `best` keeps the ranking's own order among equal scores (newest first, then
    # minute id), which a second tie-break here would override where lifted scores differ by less than a float.
    return sorted([*best, *added], key=lambda s: -s[0])[:k]


def _place(around: Sequence[Candidate], minute_id: str) -> int:
    """Where the minute sits in its window (the window always holds it)."""
    return next(i for i, c in enumerate(around) if c.minute_id == minute_id)


def _thread_matches(
    candidates: Sequence[Candidate], keyword: Sequence[float], semantic: Sequence[float], share: float
) -> tuple[dict[str, float], set[str]]:
    """Each thread's relevance as one answer: its best keyword and its best semantic score among the candidates,
    fused by the dense `share`, times `SEARCH_THREAD_MATCH`; and the minutes (ids) that rank at least that
    relevant: those within `SEARCH_THREAD_NEAR` places in time of the thread's best minute of either leg.

    An answer that spans a thread often has one minute with the question's words and another with its meaning
    (a component named in one, what broke in the other, often one after the other): each leg finds one half, and
    neither minute alone matches the whole question. A long thread (a day's conversation) lends its relevance to
    what was said around its best minutes, not to all of itself. Candidates without a thread are left as they are.
    """
    best: dict[str, tuple[int, int]] = {}  # thread -> the index of its best keyword and best semantic candidate
    members: dict[str, list[tuple[int, str]]] = {}
    for i, c in enumerate(candidates):
        thread = c.payload.get("thread_id")
        if isinstance(thread, str) and thread:
            members.setdefault(thread, []).append((_timestamp_ms(c) or 0, c.minute_id))
            top_kw, top_sem = best.get(thread, (i, i))
            best[thread] = (
                i if keyword[i] > keyword[top_kw] else top_kw,
                i if semantic[i] > semantic[top_sem] else top_sem,
            )
    factor = defaults.SEARCH_THREAD_MATCH
    values: dict[str, float] = {}
    matched: set[str] = set()
    for thread, (top_kw, top_sem) in best.items():
        values[thread] = factor * (share * semantic[top_sem] + (1 - share) * keyword[top_kw])
        anchors = [(_timestamp_ms(candidates[i]) or 0, candidates[i].minute_id) for i in (top_kw, top_sem)]
        matched |= _near(members[thread], anchors)
    return values, matched


def _near(members: Sequence[tuple[int, str]], anchors: Iterable[tuple[int, str]]) -> set[str]:
    """The minute ids of a thread's candidates (`members`, as (timestamp ms, minute id)) within
    `SEARCH_THREAD_NEAR` places in time of any of `anchors` (members themselves)."""
    ordered = sorted(members)
    place = {member: i for i, member in enumerate(ordered)}
    reach = defaults.SEARCH_THREAD_NEAR
    out: set[str] = set()
    for anchor in anchors:
        at = place[anchor]
        out.update(minute_id for _, minute_id in ordered[max(0, at - reach) : at + reach + 1])
    return out


@dataclass(frozen=True)
class LegShare:
    """Fusion "agree": the dense leg's share of relevance for one query and the readings that set it."""

    share: float
    agreement: float  # of the legs' top SEARCH_AGREE_DEPTH, the share both have
    support: float  # the words' (min-max) score of the dense leg's top SEARCH_AGREE_DEPTH, averaged
    flatness: float  # 1 when the words' top SEARCH_AGREE_DEPTH are tied, 0 when they fall by SEARCH_AGREE_FLAT or more


def _dense_share(candidates: Sequence[Candidate], keyword: Sequence[float], configured: float) -> LegShare:
    """The dense leg's share of relevance for this query: `configured` when the query gives reason to trust it,
    sliding to SEARCH_AGREE_FLOOR when nothing does (a configured share below the floor, or 1, is kept).

    Three readings each give that reason, and the strongest counts: the legs agree on their top candidates
    (`_agreement`, full at SEARCH_AGREE_FULL); the words back the dense leg's picks (their average min-max
    lexical score, full at SEARCH_AGREE_SUPPORT: a dense leg that knows nothing about the query picks minutes
    without its words); or the words single nothing out (their top candidates tied within SEARCH_AGREE_FLAT of
    the best one's score: a paraphrased question matches only its common words, evenly).
    """
    depth = defaults.SEARCH_AGREE_DEPTH
    agreement = _agreement(candidates, depth)
    dense_top = [i for i, c in enumerate(candidates) if c.extra.get("semantic_rank", depth + 1) <= depth]
    support = sum(keyword[i] for i in dense_top) / depth
    found = sorted((c.keyword for c in candidates if "keyword_rank" in c.extra), reverse=True)
    if found and found[0] > 0:
        tenth = found[depth - 1] if len(found) >= depth else 0.0
        flatness = 1.0 - min(1.0, (found[0] - tenth) / found[0] / defaults.SEARCH_AGREE_FLAT)
    else:
        flatness = 1.0  # the words found nothing
    floor = defaults.SEARCH_AGREE_FLOOR
    share = configured
    if floor < configured < 1:
        trust = max(
            min(1.0, agreement / defaults.SEARCH_AGREE_FULL),
            min(1.0, support / defaults.SEARCH_AGREE_SUPPORT),
            flatness,
        )
        share = floor + (configured - floor) * trust
    return LegShare(share, agreement, support, flatness)


def _agreement(candidates: Sequence[Candidate], depth: int) -> float:
    """How far the legs agree on the query: the share of the lexical leg's top `depth` that is in the dense leg's.

    A dense leg that knows nothing about the query shares none of the words' best candidates (and words that miss
    the question share none of a good dense leg's): where the legs disagree, neither outvotes the other.
    """
    lexical = {c.minute_id for c in candidates if c.extra.get("keyword_rank", depth + 1) <= depth}
    dense = {c.minute_id for c in candidates if c.extra.get("semantic_rank", depth + 1) <= depth}
    return len(lexical & dense) / depth


def _max_normalized(values: list[float]) -> list[float]:
    top = max(values, default=0.0)
    if top <= 0:
        return [0.0] * len(values)
    return [max(0.0, v) / top for v in values]


def _minmax_normalized(values: list[float]) -> list[float]:
    low, high = min(values, default=0.0), max(values, default=0.0)
    if high <= low:
        return [1.0 if high > 0 else 0.0] * len(values)
    return [(v - low) / (high - low) for v in values]


def _timestamp_ms(candidate: Candidate) -> int | None:
    value = candidate.payload.get("timestamp_ms")
    if isinstance(value, int | float):
        return int(value)
    return id_timestamp_ms(candidate.minute_id)


def _recency(timestamp_ms: int | None, now_ms: int, half_life_ms: int) -> float:
    if timestamp_ms is None:
        return 0.0
    return float(0.5 ** (max(0, now_ms - timestamp_ms) / half_life_ms))


def _importance(payload: dict[str, Any]) -> float:
    """The stored scores without their recency (`pvm.vectors.importance`), 0..1; 0 when there are none."""
    value = importance(payload.get("scores"))
    return 0.0 if value is None else min(1.0, max(0.0, value))


def _parsed(parse: Callable[[Any], Any], raw: Any) -> Any:
    try:
        return parse(raw)
    except (KeyError, TypeError, ValueError):
        return None


def _summary_hit(key: str, payload: dict[str, Any], score: float, parts: dict[str, float]) -> SummaryHit:
    record = payload.get("record")
    return SummaryHit(
        summary_id=key,
        score=score,
        of=str(payload.get("of") or ""),
        thread=str(payload.get("thread") or ""),
        text=str(payload.get("text") or ""),
        sources=tuple(str(i) for i in payload.get("sources") or ()),
        record=record if isinstance(record, dict) else {},
        parts=parts,
    )


def _hit(minute_id: str, payload: dict[str, Any], score: float, parts: dict[str, float]) -> SearchHit:
    insights = tuple(
        i for i in (_parsed(Insight.from_dict, raw) for raw in payload.get("insights") or ()) if i is not None
    )
    return SearchHit(
        minute_id=minute_id,
        score=score,
        minute=payload.get("minute") or {},
        category=str(payload.get("category") or ""),
        insights=insights,
        scores=_parsed(Scores.from_dict, payload.get("scores")) if payload.get("scores") else None,
        parts=parts,
    )
