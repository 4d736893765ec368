"""The vector store of minutes: what both engines share (point ids, names, tenancy checks, filters, candidates).

Two engines implement `pvm.protocols.VectorEngine`:

- `pvm.vectors.edge.EdgeEngine`: Qdrant's in-process engine (qdrant-edge), one
  shard directory per project, for the embedded stack;
- `pvm.vectors.server.ServerEngine`: a Qdrant server through qdrant-client.

They index the same lexical sparse vectors (`pvm.vectors.lexical`), store the
same payload and turn `SearchFilters` into the same conditions (`conditions`),
so a query answers alike on both.

Points come in kinds (`pvm.protocols.POINT_KINDS`). Minutes carry no ``kind``
field; a fact point carries ``kind`` = ``fact`` and sits beside the minutes of
its project, under its fact id. Global-tier facts belong to no project: they
live in the tenant `GLOBAL_TENANT`, a name no project can have, and only a
query that names that tenant reads them (`pvm.search` does when asked for the
global tier). A minute query matches points without a kind, so no fact (or
any later kind) ever answers a search for minutes.
"""

from __future__ import annotations

import hashlib
import heapq
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, TypeGuard

from contracts.errors import PvmError
from contracts.memory import SearchFilters
from contracts.minute import PROJECT_ID_RULE, is_valid_project_id
from pvm import defaults
from pvm.protocols import (
    FACT,
    FACT_PRUNED,
    MINUTE,
    POINT_KINDS,
    PRUNED,
    SUMMARY,
    Candidate,
    FactFilters,
    MemoryPoint,
    StoredPoint,
    SummaryFilters,
)

# Point ids are uuid5(MINUTE_NAMESPACE, minute id): the same minute always lands
# on the same point, so re-indexing it is an overwrite, never a duplicate.
# Changing this constant orphans every point already stored.
MINUTE_NAMESPACE = uuid.UUID("6b1f3c52-6a0e-5d2b-9c7e-0f4a2d8e5b31")

LEXICAL = "lexical"  # the sparse vector (BM25 term weights, IDF applied by Qdrant)
DENSE = "dense"  # the dense vector, present when an embedder is configured

# Qdrant fusion of the lexical and dense legs (prefetch + fusion query).
Fusion = Literal["rrf", "dbsf"]
FUSIONS: tuple[str, ...] = ("rrf", "dbsf")
RRF_K = 60

# The tenant of global-tier facts: one deployment-wide set of points that no project owns. A project id starts
# with a letter or digit (`PROJECT_ID_RULE`), so no project can be named this.
GLOBAL_TENANT = "_global"

# Payload fields of fact points (workers/index/fact_points.py writes them). Times are Unix ms; an open end (a fact
# still valid, a fact not cleared) is `OPEN_MS`, so that every bound is a plain range condition.
KIND = "kind"
OPEN_MS = 2**53 - 1  # exact as a double, beyond any timestamp
FACT_KEYWORD_FIELDS = (KIND, "fact_type", "tier", "tier_key", "status")
FACT_INTEGER_FIELDS = ("valid_from_ms", "valid_until_ms", "recorded_at_ms", "cleared_ms")

# Payload fields the engines index, and how. Of the fact fields only `kind` is indexed: the other fact
# indexes made every minute upsert ~8% slower on qdrant-edge (10.8k vs 11.8k/s) while a project holds few
# facts; they stay filterable as plain payload (`FACT_PAYLOAD_FIELDS`), checked point by point after `kind`.
KEYWORD_FIELDS = ("agent_id", "event_type", "category", "task_id", "thread_id", KIND)
INTEGER_FIELDS = ("timestamp_ms",)
FLOAT_FIELDS = ("scores.composite",)
FACT_PAYLOAD_FIELDS = tuple(f for f in (*FACT_KEYWORD_FIELDS, *FACT_INTEGER_FIELDS) if f != KIND)


def importance(scores: object) -> float | None:
    """What a point's stored scores say it is worth, without their recency (search counts recency once).

    The mean of `SEARCH_IMPORTANCE_PARTS` (relevance, accuracy, impact) when
    the scores hold them all; else the composite (a fact point holds only
    that: the fact's importance); an ``importance`` an engine stored is taken
    as it is. None when the scores say nothing.
    """
    if not isinstance(scores, dict):
        return None
    value = scores.get("importance")
    if type(value) is float:  # as the embedded engine stores it: read for every candidate of every search
        return value
    if _number(value):
        return float(value)
    parts = [scores.get(p) for p in defaults.SEARCH_IMPORTANCE_PARTS]
    numbers = [float(p) for p in parts if _number(p)]
    if numbers and len(numbers) == len(parts):
        return round(sum(numbers) / len(numbers), 6)  # rounded: an engine stores it as it reads back
    composite = scores.get("composite")
    return float(composite) if _number(composite) else None


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


class VectorStoreError(PvmError, RuntimeError):
    """The vector store cannot do what was asked; the message says why and what to do."""


class ShardLockedError(VectorStoreError):
    """Another process (or another engine in this one) holds the embedded shard directory."""


class VectorConfigError(VectorStoreError):
    """The stored vectors do not match the engine's configuration (e.g. another dense size)."""


# uuid5's version (5) and RFC 4122 variant bits, set over the first 16 bytes of the SHA-1.
_UUID5_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_UUID5_SET = (0x5000 << 64) | (0x8000 << 48)


@lru_cache(maxsize=4096)
def _project_namespace(project_id: str) -> bytes:
    return uuid.uuid5(MINUTE_NAMESPACE, project_id).bytes


def point_id(project_id: str, minute_id: str) -> uuid.UUID:
    """The Qdrant point id of a minute: uuid5 of the minute id, in a namespace of its project.

    Minute ids are chosen by producers, so two projects can hold the same id;
    a per-project namespace keeps one project from overwriting another's point
    in a shared collection, while re-indexing a minute still overwrites itself.

    Equal to ``uuid.uuid5(uuid.uuid5(MINUTE_NAMESPACE, project_id), minute_id)``;
    computed here with the project's namespace cached, because `uuid.uuid5`'s
    per-call overhead was a tenth of an upsert's Python time.
    """
    digest = hashlib.sha1(_project_namespace(project_id) + minute_id.encode()).digest()
    return uuid.UUID(int=(int.from_bytes(digest[:16], "big") & _UUID5_CLEAR) | _UUID5_SET)


def fact_point_id(key: str) -> uuid.UUID:
    """The Qdrant point id of a point that is not a minute: its key, a UUID string (a fact's id), as it is.

    Fact ids are uuid5 in `contracts.facts.FACT_NAMESPACE`; minute point ids
    are uuid5 in a namespace per project (`point_id`). Two names in different
    namespaces give one UUID only if SHA-1 collides on 122 bits, the same
    argument that keeps two projects' minute points apart (decision 0003).
    """
    return uuid.UUID(key)


def stored_point_id(point: MemoryPoint) -> uuid.UUID:
    """The point id a point is stored under: `point_id` for a minute, its key as a UUID for any other kind."""
    if point.kind == MINUTE:
        return point_id(point.project_id, point.minute_id)
    return uuid.UUID(point.minute_id)


def is_tenant(name: object) -> bool:
    """Whether `name` names a tenant of the store: a project, or `GLOBAL_TENANT`."""
    return name == GLOBAL_TENANT or is_valid_project_id(name)


def require_project(project_id: object) -> str:
    """Return `project_id` if it names a project; a missing one is an error, never "all projects"."""
    if not isinstance(project_id, str) or not project_id:
        raise ValueError(f"project_id is required (got {project_id!r}): every vector read and write names one project")
    return project_id


def check_limit(limit: int) -> int:
    if not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be a positive whole number, got {limit!r}")
    return limit


def check_fusion(fusion: str) -> Fusion:
    if fusion not in FUSIONS:
        raise ValueError(f"fusion={fusion!r} is not one of {', '.join(FUSIONS)}")
    return fusion  # type: ignore[return-value]


def check_point(point: MemoryPoint) -> None:
    """Refuse a point that names no valid tenant or key, or whose payload claims another project or kind.

    A minute belongs to a project; a point of another kind to a project or to
    `GLOBAL_TENANT`, under a UUID key, and its payload states its kind.
    """
    project_id = require_project(point.project_id)
    if point.kind == MINUTE:
        if not is_valid_project_id(project_id):
            raise ValueError(
                f"project_id {project_id[:40]!r} of minute {point.minute_id!r} may only hold {PROJECT_ID_RULE}"
            )
        if not isinstance(point.minute_id, str) or not point.minute_id:
            raise ValueError(f"minute_id is required (got {point.minute_id!r})")
        if point.payload.get(KIND) not in (None, MINUTE):
            raise ValueError(f"minute {point.minute_id!r} has a payload of kind {point.payload.get(KIND)!r}")
    else:
        if point.kind not in POINT_KINDS:
            raise ValueError(f"kind {point.kind!r} is not one of {', '.join(POINT_KINDS)}")
        if not is_tenant(project_id):
            raise ValueError(
                f"project_id {project_id[:40]!r} of {point.kind} {point.minute_id!r} may only hold "
                f"{PROJECT_ID_RULE}, or be {GLOBAL_TENANT!r} for the global tier"
            )
        try:
            uuid.UUID(point.minute_id)
        except (TypeError, ValueError, AttributeError):
            raise ValueError(f"a {point.kind} point's key must be a UUID string, got {point.minute_id!r}") from None
        if point.payload.get(KIND) != point.kind:
            raise ValueError(
                f"{point.kind} {point.minute_id!r} has a payload of kind {point.payload.get(KIND)!r}; "
                f"its payload states its kind"
            )
    claimed = point.payload.get("project_id")
    if claimed is not None and claimed != project_id:
        raise ValueError(
            f"payload project_id {claimed!r} of minute {point.minute_id!r} differs from the point's "
            f"project_id {project_id!r}"
        )


def stored_payload(point: MemoryPoint) -> dict[str, Any]:
    """The payload a point is stored with: the caller's, with the project and minute id made authoritative."""
    check_point(point)
    return {**point.payload, "project_id": point.project_id, "minute_id": point.minute_id}


def check_dense(vector: Sequence[float] | None, dimensions: int | None, what: str) -> list[float] | None:
    """Validate a dense vector against the engine's size; None when there is none to use."""
    if vector is None:
        return None
    if dimensions is None:
        raise ValueError(f"{what} has a dense vector but the engine was created without dense_dimensions")
    if len(vector) != dimensions:
        raise ValueError(f"{what} has a dense vector of {len(vector)} dimensions; the engine holds {dimensions}")
    return [float(x) for x in vector]


@dataclass(frozen=True, slots=True)
class Match:
    """Payload field equals one value."""

    key: str
    value: str


@dataclass(frozen=True, slots=True)
class MatchAny:
    """Payload field equals any of the values."""

    key: str
    values: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Range:
    """Payload number within [gte, lt)."""

    key: str
    gte: float | None = None
    lt: float | None = None


@dataclass(frozen=True, slots=True)
class Empty:
    """Payload field absent (or null, or an empty list)."""

    key: str


@dataclass(frozen=True, slots=True)
class EmptyOr:
    """Payload field absent, or equal to `value` (a minute, or a pruned minute when a search opts in)."""

    key: str
    value: str


Condition = Match | MatchAny | Range | Empty | EmptyOr


def annotation_kind(kind: str, annotation: Mapping[str, Any]) -> str | None:
    """The kind a point takes with an annotation: pruned (`PRUNED`, `FACT_PRUNED`) or its own (None: a minute)."""
    if annotation.get("pruned_ms") is not None:
        return PRUNED if kind == MINUTE else FACT_PRUNED
    return None if kind == MINUTE else FACT


def conditions(
    project_id: str, filters: SearchFilters, facts: FactFilters | SummaryFilters | None = None
) -> list[Condition]:
    """The `must` conditions of a query: always the tenant first, then the kind, then each filter that is set.

    Without `facts`, minutes (points without a kind) within `filters`. With
    `facts`, fact points within them: of `filters` only `task_id` and
    `min_composite` (the fact's importance) apply to facts, the rest describe
    minutes.
    """
    out: list[Condition] = [Match("project_id", require_project(project_id))]
    if isinstance(facts, SummaryFilters):
        return out + _summary_conditions(filters, facts)
    if facts is not None:
        return out + _fact_conditions(filters, facts)
    out.append(EmptyOr(KIND, PRUNED) if filters.include_pruned else Empty(KIND))
    for key, values in (
        ("category", filters.categories),
        ("event_type", filters.event_types),
        ("agent_id", filters.agents),
    ):
        if values:
            out.append(MatchAny(key, tuple(str(v) for v in values)))
    if filters.task_id is not None:
        out.append(Match("task_id", filters.task_id))
    if filters.thread_id is not None:
        out.append(Match("thread_id", filters.thread_id))
    if filters.since_ms is not None or filters.until_ms is not None:
        out.append(Range("timestamp_ms", gte=filters.since_ms, lt=filters.until_ms))
    if filters.min_composite is not None:
        out.append(Range("scores.composite", gte=float(filters.min_composite)))
    return out


def _fact_conditions(filters: SearchFilters, facts: FactFilters) -> list[Condition]:
    out: list[Condition] = [Match(KIND, FACT)]
    for key, values in (("status", facts.statuses), ("fact_type", facts.types), ("tier", facts.tiers)):
        if values:
            out.append(MatchAny(key, tuple(str(v) for v in values)))
    if filters.task_id is not None:
        out.append(Match("task_id", filters.task_id))
    if filters.min_composite is not None:
        out.append(Range("scores.composite", gte=float(filters.min_composite)))
    if facts.as_of_ms is None:
        out.append(Range("cleared_ms", gte=OPEN_MS))
    else:
        after = facts.as_of_ms + 1  # every bound is in whole ms: "> t" is ">= t + 1"
        out += [
            Range("valid_from_ms", lt=after),
            Range("valid_until_ms", gte=after),
            Range("recorded_at_ms", lt=after),
            Range("cleared_ms", gte=after),
        ]
    return out


def _summary_conditions(filters: SearchFilters, summaries: SummaryFilters) -> list[Condition]:
    """Summary points of one thread (`thread_id`) and time (`since_ms`, `until_ms`, `as_of_ms`: by their newest
    source minute); the other filters describe minutes."""
    out: list[Condition] = [Match(KIND, SUMMARY)]
    if filters.thread_id is not None:
        out.append(Match("thread_id", filters.thread_id))
    until = filters.until_ms
    if summaries.as_of_ms is not None:
        until = summaries.as_of_ms + 1 if until is None else min(until, summaries.as_of_ms + 1)
    if filters.since_ms is not None or until is not None:
        out.append(Range("timestamp_ms", gte=filters.since_ms, lt=until))
    return out


Hit = tuple[Any, float, dict[str, Any] | None]  # (point id, score, payload or None)

# A leg fetches one point more than it keeps, to see whether its cut falls inside a run of equal scores; then
# up to this many times `limit` to take in the whole run (a run longer than that is cut by the engine's order).
TIE_FETCH_FACTOR = 8


def leg_fetch(limit: int) -> int:
    """How many points a leg asks the engine for, to keep `limit`: one more, to see a tie at the cut."""
    return limit + 1


def cut_inside_tie(hits: Sequence[Hit], limit: int, fetched: int) -> bool:
    """Whether a leg's hits (`fetched` asked for, best first) end inside a run of scores equal to the one at the
    cut: the engine returned some of the tied points and left out others, in an order of its own (the order the
    points were written in), so the leg must be asked again for more before it is cut."""
    return (
        len(hits) >= fetched > limit
        and float(hits[-1][1]) == float(hits[limit - 1][1])
        and fetched < limit * TIE_FETCH_FACTOR
    )


def whole_run(read: Sequence[Hit], wide: Iterable[Hit], limit: int) -> tuple[list[Hit], list[Any]]:
    """A leg's best `limit` hits in the total order, from the hits first `read` (best first, with payloads, their
    cut inside a tie: `cut_inside_tie`) and a `wide` fetch of the points scoring at least the tied score (ids and
    scores only: converting payloads is most of what a wide fetch costs); and the ids among them whose payloads
    are still to be read (tied points the first fetch left out).

    Only the tied run is put in order: the points above it are kept whatever their order, and of the run the
    lowest point ids fill the places left (a run can be hundreds of points in a project of repeated texts)."""
    tied = float(read[limit - 1][1])
    above: list[Hit] = []
    run: list[Hit] = []
    for hit in wide:
        score = float(hit[1])
        if score > tied:
            above.append(hit)
        elif score == tied:
            run.append(hit)
    if not run:  # the engine answered nothing at the tie (a threshold it compared otherwise): cut what was read
        return cut_leg(read, limit), []
    kept = cut_leg(above, limit)
    kept += heapq.nsmallest(limit - len(kept), run, key=lambda hit: id_order(hit[0]))
    payloads = {pid: payload for pid, _, payload in read}
    hits = [(pid, score, payloads.get(pid)) for pid, score, _ in kept]
    return hits, [pid for pid, _, payload in hits if payload is None]


def with_payloads(hits: Sequence[Hit], read: Mapping[Any, dict[str, Any] | None]) -> list[Hit]:
    """`hits` with the payloads read by id (`whole_run`'s missing ones) filled in."""
    return [(pid, score, payload if payload is not None else read.get(pid)) for pid, score, payload in hits]


def tie_floor(hits: Sequence[Hit], limit: int) -> float:
    """The score threshold of a wide fetch for the run tied at a leg's cut: a hair below the tied score, as the
    engines compare the threshold in their own float32 (`whole_run` keeps the run by exact equality)."""
    tied = float(hits[limit - 1][1])
    return tied - abs(tied) * 1e-6 - 1e-12


def id_order(pid: Any) -> int | str:
    """A point id's place in the total order: its string, or for a UUID its integer, which orders as its string
    does (fixed-width lowercase hex) at a tenth of the cost. One engine's ids are all of one type."""
    return pid.int if isinstance(pid, uuid.UUID) else str(pid)


def _total_order(hit: Hit) -> tuple[float, int | str]:
    return (-float(hit[1]), id_order(hit[0]))


def cut_leg(hits: Iterable[Hit], limit: int | None) -> list[Hit]:
    """A leg's best `limit` hits (all, for None) in a total order: score, then point id, so that the same points
    and query give the same hits whatever order the engine returned equal scores in."""
    ordered = sorted(hits, key=_total_order)
    return ordered if limit is None else ordered[:limit]


def merge_legs(
    project_id: str,
    lexical: Iterable[Hit],
    dense: Iterable[Hit],
    fused: Iterable[Hit] | None,
    limit: int | None = None,
) -> list[Candidate]:
    """Candidates from the legs' hits: every point either leg found, in fused order.

    Each leg is cut to its best `limit` (`cut_leg`: score, then point id) and ranked in that order, and the
    candidates come in fused order, then point id: a total order, the same in any process.

    Payloads may come with any of the lists. Each candidate carries its
    per-leg scores and 1-based ranks (`extra["keyword_rank"]`,
    `extra["semantic_rank"]`, absent when the leg missed it) and Qdrant's fused
    score; without a fused list (one leg only) the leg's score is the fused
    score. Hits whose payload names another project are dropped: the `must`
    filter already excludes them, this is the second lock on the same door.
    """
    lexical, dense = cut_leg(lexical, limit), cut_leg(dense, limit)
    if fused is None and not (lexical and dense):
        return _one_leg(project_id, "keyword" if lexical else "semantic", lexical or dense)
    payloads: dict[Any, dict[str, Any]] = {}
    scores: dict[Any, dict[str, float]] = {}
    for leg, hits in (("keyword", lexical), ("semantic", dense)):
        for rank, (pid, score, payload) in enumerate(hits, start=1):
            if payload is not None:
                payloads[pid] = payload
            entry = scores.setdefault(pid, {})
            entry[leg] = float(score)
            entry[f"{leg}_rank"] = float(rank)
    fused_scores: dict[Any, float] = {}
    for pid, score, payload in fused or ():
        if pid not in scores:  # a point of the engine's fusion beyond a leg's cut
            continue
        fused_scores[pid] = float(score)
        if payload is not None:
            payloads[pid] = payload
    if fused is None:
        fused_scores = {pid: max(s.get("keyword", 0.0), s.get("semantic", 0.0)) for pid, s in scores.items()}
    order = sorted(scores, key=lambda pid: (-fused_scores.get(pid, float("-inf")), id_order(pid)))
    out: list[Candidate] = []
    for pid in order:
        payload = payloads.get(pid)
        if payload is None or payload.get("project_id") != project_id:
            continue
        s = scores[pid]
        out.append(
            Candidate(
                minute_id=str(payload.get("minute_id", "")),
                payload=payload,
                keyword=s.get("keyword", 0.0),
                semantic=s.get("semantic", 0.0),
                fused=fused_scores.get(pid, 0.0),
                extra={k: v for k, v in s.items() if k.endswith("_rank")},
            )
        )
    return out


def _one_leg(project_id: str, leg: str, hits: list[Hit]) -> list[Candidate]:
    """`merge_legs` when one leg ran: the same candidates, without the bookkeeping of two (a third of a search).

    `hits` come cut in the leg's total order (`cut_leg`), which is the fused order of one leg: a leg's score,
    floored at 0, then its rank."""
    keyword = leg == "keyword"
    rank_key = f"{leg}_rank"
    out: list[Candidate] = []
    for rank, (_, raw, payload) in enumerate(hits, start=1):
        if payload is None or payload.get("project_id") != project_id:
            continue
        score = float(raw)
        out.append(
            Candidate(
                str(payload.get("minute_id", "")),
                payload,
                score if keyword else 0.0,
                0.0 if keyword else score,
                max(score, 0.0),
                {rank_key: float(rank)},
            )
        )
    return out


def stored_points(
    project_id: str, records: Iterable[tuple[dict[str, Any] | None, list[float] | None]]
) -> list[StoredPoint]:
    """`StoredPoint`s of read-back (payload, dense) pairs, each once; a payload naming another tenant is dropped."""
    out: list[StoredPoint] = []
    seen: set[str] = set()
    for payload, dense in records:
        if payload is None or payload.get("project_id") != project_id:
            continue
        key = str(payload.get("minute_id", ""))
        if key and key not in seen:
            seen.add(key)
            out.append(StoredPoint(key, payload, dense))
    return out


def ordered_records(project_id: str, minute_ids: Sequence[str], records: Iterable[dict[str, Any]]) -> list[Candidate]:
    """Candidates for retrieved payloads, in the order the ids were asked for, each once."""
    by_minute = {p.get("minute_id"): p for p in records if p is not None and p.get("project_id") == project_id}
    out: list[Candidate] = []
    seen: set[str] = set()
    for minute_id in minute_ids:
        payload = by_minute.get(minute_id)
        if payload is not None and minute_id not in seen:
            seen.add(minute_id)
            out.append(Candidate(minute_id=minute_id, payload=payload))
    return out


# A thread's minutes in time order, around one of them (`thread_window`): the most one run of equal timestamps is read
# whole. Beyond it (thousands of minutes of one thread written in the same millisecond) the run's lowest point ids
# stand for it, the same ones in every process.
WINDOW_RUN_CAP = 1_000
# A thread of at most this many minutes (within the search's filters) is read whole in one plain read of its keyword
# index, which costs what the thread holds; a longer one is read in time order around the minute. Reading in time
# order alone costs what lies between the minute and its neighbours in the whole project: for the oldest minute of
# a short thread, the rest of the project (0.23 ms a window at 100k minutes; session 21).
WINDOW_WHOLE_THREAD = 64


def thread_window(
    whole: Callable[[int], list[Candidate]] | None,
    ordered: Callable[[bool, int, int], list[Candidate]],
    run: Callable[[int], list[Candidate]],
    minute: Candidate,
    timestamp_ms: int,
    count: int,
) -> list[Candidate]:
    """`minute` and up to `count` minutes each side of it, oldest first, in the order (timestamp, minute id).

    `whole(limit)` reads up to `limit` minutes in no particular order: when it returns fewer than
    `WINDOW_WHOLE_THREAD` + 1, that is all there is, and the window is cut from them (None: the caller knows the
    thread is longer, and the read is skipped). Otherwise
    `ordered(newest_first, start_ms, limit)` reads up to `limit` minutes at or before `start_ms` newest first (or
    at or after it, oldest first); the engine orders equal timestamps however it likes, so where a read ends
    inside a run of equal timestamps that the window needs, `run(ms)` reads the whole run (by point id, at most
    `WINDOW_RUN_CAP`), and the read goes on past it while the window is short. The answer is the same whatever
    order the minutes were written in.
    """
    key = (timestamp_ms, minute.minute_id)
    found: dict[str, Candidate] = {minute.minute_id: minute}
    every = whole(WINDOW_WHOLE_THREAD + 1) if whole is not None else None
    if every is not None and len(every) <= WINDOW_WHOLE_THREAD:
        found.update((c.minute_id, c) for c in every if c.minute_id != minute.minute_id)
        return cut_window(found, minute.minute_id, count)

    def short(newest_first: bool, bound: int, closed: bool) -> bool:
        """Fewer than `count` minutes on this side of `minute` among those read, counting only those strictly
        inside `bound` (closed: at `bound` as well)."""
        side = 0
        for c in found.values():
            ms = window_ms(c)
            beyond = ms < bound if newest_first else ms > bound
            if beyond or (ms == bound and not closed):
                continue
            if ((ms, c.minute_id) < key) if newest_first else ((ms, c.minute_id) > key):
                side += 1
        return side < count

    for newest_first in (True, False):
        start = timestamp_ms
        while True:
            page = ordered(newest_first, start, count + 1)
            for c in page:
                found.setdefault(c.minute_id, c)
            if len(page) <= count:
                break  # nothing more this side
            edge = window_ms(page[-1])
            if not short(newest_first, edge, closed=False):
                break  # the window ends before the run at `edge`, which this read may have cut
            for c in run(edge):
                found.setdefault(c.minute_id, c)
            if not short(newest_first, edge, closed=True):
                break
            start = edge - 1 if newest_first else edge + 1
    return cut_window(found, minute.minute_id, count)


def cut_window(found: Mapping[str, Candidate], minute_id: str, count: int) -> list[Candidate]:
    """The minute and up to `count` of `found` each side of it in the order (timestamp, minute id)."""
    in_order = sorted(found.values(), key=lambda c: (window_ms(c), c.minute_id))
    at = next(i for i, c in enumerate(in_order) if c.minute_id == minute_id)
    return in_order[max(0, at - count) : at + count + 1]


def window_ms(c: Candidate) -> int:
    value = c.payload.get("timestamp_ms")
    return int(value) if isinstance(value, int | float) else 0
