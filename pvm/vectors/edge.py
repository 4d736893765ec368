"""Embedded vector engine: Qdrant's in-process engine (qdrant-edge), one shard per project.

Layout: ``<path>/<project_id>/`` is one `EdgeShard` (its own segments and WAL),
created on the project's first upsert. A shard per project because the IDF of
the `lexical` leg must be computed over the tenant's own points: a shard's IDF
statistics are exactly its points. It also makes `delete_project` a directory
removal. Every query still carries a `must` filter on ``project_id``: tenancy
fails closed even if a point were ever written to the wrong shard.

Global-tier facts belong to no project: they live in the shard of the tenant
``_global`` (`pvm.vectors.GLOBAL_TENANT`, a name no project can have), which
`delete_project` of a project never touches.

One process at a time. The WAL of each shard is file-locked, and the engine
holds ``<path>/.lock`` for its whole life, so a second `EdgeEngine` on the same
path (in this process or another) fails at once with `ShardLockedError`. In
the embedded stack the process that owns the directory (``pvm up``) runs both
the index pool and the reader API; anything else talks to it, or uses a
Qdrant server (`pvm.vectors.server`). Open the engine after any fork, never
before: the lock and the engine's threads do not survive one.

Payloads are stored with the filtered fields (project, agent, event type,
category, task, thread, timestamp) as themselves, the composite score flat as
``_composite``, and the rest packed into one string, ``_msgpack``: the minute
id (length-prefixed, ``26:01J...``) then base64 of msgpack. qdrant-edge
converts payload values one by one at ~5 microseconds each (a string or a
nested object the most), and a minute's nested payload made upserts twice as
slow; the minute id rides in the packed string rather than a field of its own
for the same reason, and candidates read it from there without unpacking the
rest. msgpack packs and unpacks in a third of JSON's time. Reads unpack it;
callers see the payload they wrote (msgpack keeps what JSON keeps, and bytes
and non-string keys besides; the server engine takes JSON values only).
Shards written before these fields existed (``_packed`` JSON, a nested
``scores.composite``) still read back, but answer ``min_composite`` filters
only after a rebuild (`pvm replay`).

Writes go through the WAL (kept on). Segments are only merged and HNSW graphs
only built by `optimize()`, which is explicit and blocking: call it after a
bulk load or from a periodic job, never on the query path.

Payloads and point ids are memory-mapped and warmed into the page cache
(`PLACEMENT`, Qdrant's "cached" tier) when a segment opens or is built. The
engine's default tier, "cold", drops them from the page cache, and every first
read of a point then came from the disk: on a 100k-minute shard on disk, a
context took ~9 major page faults, ~0.6 ms more at the median and ~2.3 ms
more at p99. The cost is the page cache those files take (about 1 KB a
minute) and reading them in when a shard opens (~50 ms at 100k minutes).
A shard written before (its configuration names no tier) opens with the
placement: the segments written from then on are warm, those already built
stay cold until a merge rewrites them, and `pvm replay` rebuilds it warm.

Open shards are bounded (least recently used ones are closed beyond
``max_open_shards``), and each searches with ``search_threads`` threads: the
engine's default is one pool of CPU-count threads per shard, which a process
with many projects cannot afford.

Crash safety. qdrant-edge writes a new shard's files one by one, and a shard
killed in its first tens of milliseconds never loaded again. So a shard is
created and configured in ``<path>/.tmp-<project>-<hex>``, closed (flushed),
and renamed to its project's name (the rename fsynced): under that name there
is a whole shard or nothing, whenever the process is killed. Temporary
directories a killed process left are removed when an engine opens the path
(it holds the lock, so nobody else is creating one). A shard that still does
not load (half-made by an older version, or damaged by a power loss:
qdrant-edge does not fsync every file) is never served empty in silence: a
read fails and says what to do; a write sets it aside as
``<path>/.broken-<unix ms>-<project>`` (kept for forensics), creates a fresh
one, and reports the project in `broken_projects` until `mark_reindexed`. Its
points are gone, so the caller (the index pool) must rebuild the project from
the log before it tells anyone the project is indexed. Names starting with a
dot are never projects.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import functools
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

import msgpack

from contracts.memory import SearchFilters
from contracts.minute import PROJECT_ID_RULE, is_valid_project_id
from pvm.extras import ServerExtraMissing
from pvm.fsync import fsync_dir
from pvm.protocols import (
    ANNOTATION_FIELDS,
    MINUTE,
    RANKING_FIELDS,
    Candidate,
    FactFilters,
    MemoryPoint,
    StoredPoint,
    SummaryFilters,
)
from pvm.vectors import (
    DENSE,
    FACT_PAYLOAD_FIELDS,
    FLOAT_FIELDS,
    GLOBAL_TENANT,
    INTEGER_FIELDS,
    KEYWORD_FIELDS,
    KIND,
    LEXICAL,
    RRF_K,
    TIE_FETCH_FACTOR,
    WINDOW_RUN_CAP,
    Condition,
    Empty,
    EmptyOr,
    Fusion,
    Hit,
    Match,
    MatchAny,
    Range,
    ShardLockedError,
    VectorConfigError,
    VectorStoreError,
    annotation_kind,
    check_dense,
    check_fusion,
    check_limit,
    check_point,
    conditions,
    cut_inside_tie,
    fact_point_id,
    importance,
    is_tenant,
    leg_fetch,
    merge_legs,
    ordered_records,
    point_id,
    require_project,
    stored_point_id,
    stored_points,
    thread_window,
    tie_floor,
    whole_run,
    window_ms,
    with_payloads,
)
from pvm.vectors.hot import GENERATIONS, HOT_DIRECTORY, HOT_INDEXED, HotWindow
from pvm.vectors.lexical import LexicalEncoder
from pvm.vectors.ranking_memo import RankingMemo
from pvm.vectors.thread_reads import ThreadReads

try:
    import qdrant_edge as qe
except ImportError as exc:
    raise ServerExtraMissing("qdrant_edge", "the embedded vector engine (pvm.vectors.edge)") from exc

log = logging.getLogger(__name__)

MAX_OPEN_SHARDS = 128
SEARCH_THREADS = 1  # per shard; one segment is searched by one thread anyway
UPSERT_CHUNK = 1024
SCROLL_PAGE = 256  # points per page when reading a tier key's points back
LOCK_FILE = ".lock"
SHARD_CONFIG_FILE = "edge_config.json"  # where qdrant-edge keeps a shard's configuration, vectors included
# Payloads and point ids: memory-mapped and warmed into the page cache when a segment opens or is built. The
# engine's default (cold) drops them from the page cache, and every first read of a point came from the disk.
PLACEMENT = qe.Memory.Cached
PLACEMENT_NAME = "cached"  # as SHARD_CONFIG_FILE spells it
TEMP_PREFIX = ".tmp-"  # <path>/.tmp-<project>-<hex>: a shard being created, renamed to <project> when whole
BROKEN_PREFIX = ".broken-"  # <path>/.broken-<unix ms>-<project>: a shard that did not load, set aside
REINDEXED_PREFIX = ".broken-reindexed-"  # ... renamed so once its project's rebuild from the log is queued
_BROKEN_NAME = re.compile(r"\.broken-([0-9]+)-(.+)")
# Payload fields stored as themselves (filtered on); the rest travels packed in one string (PACKED_FIELD).
DIRECT_FIELDS = ("project_id", *KEYWORD_FIELDS, *INTEGER_FIELDS, *FACT_PAYLOAD_FIELDS)
PACKED_FIELD = "_msgpack"  # <length of the minute id>:<minute id><base64 of msgpack>
JSON_PACKED_FIELD = "_packed"  # what shards written before _msgpack hold: JSON
# scores.composite, stored flat: a nested object costs qdrant-edge a conversion of its own. The whole
# `scores` travels packed; this copy serves the min_composite filter and ranking.
COMPOSITE_FIELD = "_composite"
STORED_KEYS = {"scores.composite": COMPOSITE_FIELD}
# The point's importance without recency (`pvm.vectors.importance` of its scores), stored flat for ranking;
# points written before it rank by their composite until re-indexed.
IMPORTANCE_FIELD = "_importance"  # a filter's payload key -> the key it is stored under
# The evaluate pool's annotation (`VectorEngine.annotate`), packed like PACKED_FIELD (base64 msgpack): on read it
# overrides what the point was written with (its scores, at index time).
ANNOTATION_FIELD = "_eval"  # a filter's payload key -> the key it is stored under
_DIRECT = frozenset(DIRECT_FIELDS)
_OWN = frozenset(("project_id", "minute_id"))  # payload keys `_pack` takes from the point itself
# RANKING_FIELDS as stored: the minute id is read from the front of PACKED_FIELD (or a legacy _packed JSON).
_RANKING_DIRECT = tuple(f for f in RANKING_FIELDS if f in _DIRECT)
_RANKING_STORED = (*_RANKING_DIRECT, COMPOSITE_FIELD, IMPORTANCE_FIELD, PACKED_FIELD, JSON_PACKED_FIELD)
_RANKING_SELECTOR = qe.PayloadSelector.Include(list(_RANKING_STORED))


@dataclass
class _OpenShard:
    shard: qe.EdgeShard | None = None  # None while one thread opens it (others wait; other projects don't)
    users: int = 0

    @property
    def idle(self) -> bool:
        return self.shard is not None and self.users == 0


class EdgeEngine:
    """A `VectorEngine` on qdrant-edge shards under `path`, one per project. See the module docstring."""

    def __init__(
        self,
        path: Path,
        dense_dimensions: int | None = None,
        *,
        fusion: Fusion = "rrf",
        max_open_shards: int = MAX_OPEN_SHARDS,
        search_threads: int = SEARCH_THREADS,
        lexical: LexicalEncoder | None = None,
        hot_minutes: int = 0,
        indexed: Collection[str] | None = None,
        ranking: RankingMemo | None = None,
    ) -> None:
        """`hot_minutes` > 0 keeps, under ``<path>/.hot``, a hot window of each large project's newest `hot_minutes`
        to twice that many minutes, which its lexical searches read first (`pvm.vectors.hot`).
        `indexed`: the payload fields new shards index (None: every filtered one, `_payload_indexes`).
        `ranking`: where the candidates' ranking payloads are kept (`RankingMemo`; a new one by default): the hot
        window's generations share their archive's, whose points they copy, so a point is kept once."""
        if dense_dimensions is not None and dense_dimensions < 1:
            raise ValueError(f"dense_dimensions must be positive or None, got {dense_dimensions}")
        if hot_minutes < 0:
            raise ValueError(f"hot_minutes must be 0 (no hot window) or more, got {hot_minutes}")
        self.path = Path(path)
        self.dense_dimensions = dense_dimensions
        self.fusion = check_fusion(fusion)
        self._max_open = max(1, max_open_shards)
        self._search_threads = search_threads
        self._lexical = lexical or LexicalEncoder()
        self._indexed = None if indexed is None else frozenset(indexed)
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock_file = _hold_lock(self.path / LOCK_FILE)
        self._open: OrderedDict[str, _OpenShard] = OrderedDict()
        self._cond = threading.Condition()
        self._closed = False
        self._broken: dict[str, list[Path]] = {}  # project -> its set-aside shards whose rebuild is not queued yet
        self._thread_reads = ThreadReads()  # what search read of threads, until a write could change it
        self._ranking = RankingMemo() if ranking is None else ranking  # until a write could change them
        # A hot window's generation shares its archive's memo: its points are copies of the archive's, and every
        # write to either drops them, so a generation's shard deleted (a rotation) or set aside forgets nothing.
        self._forgets = ranking is None
        self._sweep()
        self._hot: HotWindow | None = None
        if hot_minutes:
            generations: list[EdgeEngine] = []
            try:
                for g in range(GENERATIONS):
                    generations.append(
                        EdgeEngine(
                            self.path / HOT_DIRECTORY / str(g),
                            dense_dimensions,
                            fusion=fusion,
                            max_open_shards=max_open_shards,
                            search_threads=search_threads,
                            lexical=self._lexical,
                            indexed=HOT_INDEXED,
                            ranking=self._ranking,
                        )
                    )
            except BaseException:
                for made in generations:
                    made.close()
                self.close()
                raise
            self._hot = HotWindow(generations, hot_minutes, self.count, self.newest_points)

    @property
    def ranking(self) -> RankingMemo:
        """The candidates' ranking payloads this engine keeps (`pvm.vectors.ranking_memo`), with its counts."""
        return self._ranking

    @property
    def hot(self) -> HotWindow | None:
        """The hot window (`pvm.vectors.hot`), None when the engine keeps none."""
        return self._hot

    # -- VectorEngine ---------------------------------------------------------------

    def upsert(self, points: Sequence[MemoryPoint]) -> None:
        """Index points, idempotently (a minute id always maps to one point); all are checked before any is written."""
        by_project: dict[str, list[qe.Point]] = {}
        hot: dict[str, list[qe.Point]] = {}  # project -> its minutes' points, for the hot window
        written: dict[str, list[tuple[str, str]]] = {}  # project -> (minute id, thread id) of each point
        ranking: dict[str, dict[Any, dict[str, Any]]] = {}  # project -> point id -> its ranking payload, as written
        document = self._lexical.document
        packer = msgpack.Packer()  # one per call: a Packer is not thread-safe, and packb makes one per payload
        for point in points:
            check_point(point)
            stored_id = stored_point_id(point)
            vectors: dict[str, Any] = {LEXICAL: document(point.text, stored_id)}
            if point.dense is not None:
                vectors[DENSE] = check_dense(point.dense, self.dense_dimensions, f"minute {point.minute_id!r}")
            batch = by_project.get(point.project_id)
            if batch is None:
                batch = by_project[point.project_id] = []
                written[point.project_id] = []
                ranking[point.project_id] = {}
            stored = _pack(point, packer)
            built = qe.Point(stored_id, vectors, stored)
            batch.append(built)
            ranking[point.project_id][stored_id] = _ranking_payload(_ranking_stored(stored))
            if self._hot is not None and point.kind == MINUTE:
                # The same Point: qdrant-edge converted its payload once; the window's copy costs only the insert.
                hot.setdefault(point.project_id, []).append(built)
            thread = point.payload.get("thread_id")
            written[point.project_id].append((point.minute_id, thread if isinstance(thread, str) else ""))
        with self._ranking.writes:  # the memo sees this write's points in the shards' order
            for project_id, batch in by_project.items():
                try:
                    self.write_points(project_id, batch)
                finally:  # a write that failed part-way may have landed in part
                    self._thread_reads.written(project_id, written[project_id])
                if self._hot is not None:
                    self._hot.write(project_id, hot.get(project_id, []))
                self._ranking.keep_written(project_id, ranking[project_id])

    def write_points(self, project_id: str, points: Sequence[qe.Point]) -> None:
        """Upsert points already built for the project's shard (created on first use), in chunks."""
        with self._shard(project_id, create=True) as shard:
            assert shard is not None
            try:
                for start in range(0, len(points), UPSERT_CHUNK):
                    shard.update(qe.UpdateOperation.upsert_points(list(points[start : start + UPSERT_CHUNK])))
            finally:  # after the write (a read that began before it is not kept), and when it failed part-way
                self._ranking.written(project_id, [p.id for p in points])

    def query(
        self,
        project_id: str,
        text: str,
        dense: list[float] | None,
        filters: SearchFilters,
        limit: int,
        *,
        with_payload: bool = True,
        facts: FactFilters | SummaryFilters | None = None,
        fused: bool = True,
    ) -> list[Candidate]:
        """Lexical leg, plus the dense leg when `dense` is given and the engine holds dense vectors, fused by Qdrant
        (unless `fused` is False: then the legs alone, in one batch, each leg searched once).

        Each leg keeps its best `limit` points in a total order (score, then point
        id: `merge_legs`), asking for more while its cut falls inside a run of equal
        scores, so the candidates are the same whatever order the points were
        written in; they are every point either leg kept (up to 2·limit), in fused
        order, then point id.

        The legs and the fusion run as one planned batch, so each candidate
        carries its per-leg scores (`keyword`, `semantic`, ranks in `extra`)
        and Qdrant's fused score (`fused`, RRF k=60 or DBSF per the engine).
        With ``with_payload=False`` each payload holds only `RANKING_FIELDS`.
        Minutes, or with `facts`, fact points within those filters (`conditions`).
        """
        project_id = require_project(project_id)
        check_limit(limit)
        dense_vector = check_dense(dense, self.dense_dimensions, "the query") if self.dense_dimensions else None
        # A lexical-only candidate query of the present: a large project's hot window first (a search of the past,
        # with an upper time bound, reads the archive).
        hot_query = dense_vector is None and facts is None and not with_payload and filters.until_ms is None
        if self._hot is not None and hot_query and text:
            hot = self._hot.lexical(project_id, text, filters, limit)
            if hot is not None:
                return merge_legs(project_id, hot, [], None, limit)
        lexical_hits, dense_hits, fused_hits = self._legs(
            project_id, text, dense_vector, filters, limit, with_payload=with_payload, facts=facts, fused=fused
        )
        return merge_legs(project_id, lexical_hits, dense_hits, fused_hits, limit)

    def lexical_hits(self, project_id: str, text: str, filters: SearchFilters, limit: int) -> list[Hit]:
        """The lexical leg alone over the project's shard: its best `limit` minutes within `filters`, ids and
        scores without payloads (`_whole_ties`), for the hot window (`ranking_payloads` reads those it keeps)."""
        return self._legs(require_project(project_id), text, None, filters, limit, with_payload=None)[0]

    def newest_points(self, project_id: str, count: int) -> list[qe.Point]:
        """The project's newest `count` minute points (by time; pruned ones too) as stored, vectors and payloads
        whole: what seeds its hot window."""
        must = _edge_filter(conditions(require_project(project_id), SearchFilters(include_pruned=True)))
        order = qe.OrderBy("timestamp_ms", qe.Direction.Desc)
        request = qe.ScrollRequest(limit=count, filter=must, with_payload=True, with_vector=True, order_by=order)
        with self._shard(project_id, create=False) as shard:
            found, _ = shard.scroll(request) if shard is not None else ([], None)
        return [qe.Point(r.id, r.vector, r.payload) for r in found if r.vector is not None]

    def ranking_payloads(self, project_id: str, point_ids: Sequence[Any]) -> dict[Any, dict[str, Any]]:
        """The ranking payloads (`RANKING_FIELDS`) of these points of the project, by point id (as given)."""
        with self._shard(require_project(project_id), create=False) as shard:
            if shard is None or not point_ids:
                return {}
            return self._ranking_of(shard, project_id, point_ids)

    def _ranking_of(self, shard: qe.EdgeShard, project_id: str, point_ids: Iterable[Any]) -> dict[Any, dict[str, Any]]:
        """The ranking payloads of these points of the shard, by point id: those kept (`RankingMemo`), and the rest
        read by id in one call and kept. A point that is not there is absent."""
        generation = self._ranking.generation(project_id)
        found, missing = self._ranking.lookup(project_id, point_ids)
        if missing:
            records = shard.retrieve(missing, with_payload=_RANKING_SELECTOR, with_vector=False)
            read = {r.id: _ranking_payload(r.payload) for r in records if r.payload}
            self._ranking.keep(project_id, generation, read)
            found.update(read)
        return found

    def _legs(
        self,
        project_id: str,
        text: str,
        dense_vector: list[float] | None,
        filters: SearchFilters,
        limit: int,
        *,
        with_payload: bool | None,
        facts: FactFilters | SummaryFilters | None = None,
        fused: bool = False,
    ) -> tuple[list[Hit], list[Hit], list[Hit] | None]:
        """`query`'s legs on the project's shard: the lexical hits, the dense hits and the engine's fused ones
        (None unless both legs ran fused). Payloads whole (`with_payload` True), their ranking fields (False: the
        legs return ids and scores, and the payloads come from `_ranking_of`) or none (None: each hit's payload
        is None)."""
        must = _edge_filter(conditions(project_id, filters, facts))
        sparse = self._lexical.query(text or "")
        lexical_query = qe.Query.Nearest(sparse, using=LEXICAL) if sparse.indices else None
        dense_query = qe.Query.Nearest(dense_vector, using=DENSE) if dense_vector is not None else None
        both = lexical_query is not None and dense_query is not None
        selector: Any = bool(with_payload)
        fuse = both and fused

        def leg(query: Any, fetch: int, payload: Any = selector, at_least: float | None = None) -> Any:
            return qe.QueryRequest(
                limit=fetch, query=query, filter=must, with_payload=payload, score_threshold=at_least
            )

        leg_queries = [q for q in (lexical_query, dense_query) if q is not None]
        legs = [leg(q, leg_fetch(limit)) for q in leg_queries]
        if not legs:
            return [], [], None
        fused_request = None
        if fuse:
            # The stubs type `query` as `Fusion`, but the values are its nested classes.
            fusion_query: Any = qe.Fusion.Rrf(k=RRF_K) if self.fusion == "rrf" else qe.Fusion.Dbsf()
            fused_request = qe.QueryRequest(
                limit=2 * limit,  # the whole union of the legs
                prefetches=[
                    qe.Prefetch(limit=limit, query=lexical_query, filter=must),
                    qe.Prefetch(limit=limit, query=dense_query, filter=must),
                ],
                query=fusion_query,
                filter=must,
                with_payload=selector,  # the union of the legs, each payload converted once
            )
        with self._shard(project_id, create=False) as shard:
            if shard is None:
                return [], [], None
            if len(legs) == 1:
                results = [shard.query(legs[0])]
            elif fused_request is None:
                results = shard.query_batch(qe.QueryBatchRequest(legs))
            else:
                results = shard.query_batch(qe.QueryBatchRequest([*legs, fused_request]))
            asked = [functools.partial(leg, q) for q in leg_queries]
            hits = _whole_ties(shard, asked, results[: len(legs)], limit, selector)
            if fused_request is not None:
                hits.append([(p.id, p.score, p.payload) for p in results[2]])
            read: Callable[[dict[str, Any]], dict[str, Any]] = _unpack
            if with_payload is False:
                kept = self._ranking_of(shard, project_id, (pid for leg_hits in hits for pid, _, _ in leg_hits))
                hits = [[(pid, score, kept.get(pid)) for pid, score, _ in leg_hits] for leg_hits in hits]
                read = _as_is
        lexical_hits = self._lexical_hits(hits[0], read) if lexical_query is not None else []
        dense_hits = _hits(hits[1 if both else 0], read) if dense_query is not None else []
        fused_hits = _hits(hits[-1], read) if fused_request is not None else None
        return lexical_hits, dense_hits, fused_hits

    def _lexical_hits(self, points: Iterable[Hit], read: Callable[[dict[str, Any]], dict[str, Any]]) -> list[Hit]:
        """The lexical leg's hits with their payloads read and the spread taken out of their scores."""
        unspread = self._lexical.unspread
        return [(pid, unspread(score, pid), read(stored) if stored else None) for pid, score, stored in points]

    def around(
        self, project_id: str, filters: SearchFilters, minute: Candidate, count: int, *, long: bool = False
    ) -> list[Candidate]:
        """`minute` and up to `count` minutes within `filters` each side of it in time, oldest first (`thread_window`),
        with `RANKING_FIELDS` payloads: a short thread read whole through its keyword index, a long one in time
        order from the timestamp index."""
        project_id = require_project(project_id)
        thread = filters.thread_id
        key = (filters, minute.minute_id, count, long)
        kept = self._thread_reads.window(project_id, thread, key) if thread else None
        if kept is not None:
            return [minute if c.minute_id == minute.minute_id else c for c in kept]
        generation = self._thread_reads.generation(project_id)
        conds = conditions(project_id, filters)
        must = _edge_filter(conds)

        def records(request: qe.ScrollRequest) -> list[Candidate]:
            return self._scrolled(project_id, request)

        def whole(limit: int) -> list[Candidate]:
            return records(qe.ScrollRequest(limit=limit, filter=must, with_payload=_RANKING_SELECTOR))

        def ordered(newest_first: bool, start_ms: int, limit: int) -> list[Candidate]:
            direction = qe.Direction.Desc if newest_first else qe.Direction.Asc
            order = qe.OrderBy("timestamp_ms", direction=direction, start_from=start_ms)
            return records(qe.ScrollRequest(limit=limit, filter=must, with_payload=_RANKING_SELECTOR, order_by=order))

        def run(at_ms: int) -> list[Candidate]:
            at = _edge_filter([*conds, Range("timestamp_ms", gte=at_ms, lt=at_ms + 1)])
            return records(qe.ScrollRequest(limit=WINDOW_RUN_CAP, filter=at, with_payload=_RANKING_SELECTOR))

        window = thread_window(None if long else whole, ordered, run, minute, window_ms(minute), count)
        if thread:
            self._thread_reads.keep_window(project_id, generation, thread, key, window)
        return window

    def in_threads(
        self, project_id: str, filters: SearchFilters, thread_ids: Sequence[str], limit: int
    ) -> list[Candidate]:
        """Up to `limit` minutes of these threads within `filters`, in no particular order, with `RANKING_FIELDS`
        payloads: fewer than `limit` is every one of them. Threads read whole before and not written since come
        from `ThreadReads`; the others in one read of the thread keyword index, kept when it read them whole."""
        project_id = require_project(project_id)
        check_limit(limit)
        found: list[Candidate] = []
        unread: list[str] = []
        for thread in sorted(set(thread_ids)):
            whole = self._thread_reads.whole(project_id, thread, filters)
            if whole is None:
                unread.append(thread)
            else:
                found += whole
        if len(found) >= limit or not unread:
            return found[:limit]
        generation = self._thread_reads.generation(project_id)
        left = limit - len(found)
        must = _edge_filter([*conditions(project_id, filters), MatchAny("thread_id", tuple(unread))])
        read = self._scrolled(project_id, qe.ScrollRequest(limit=left, filter=must, with_payload=_RANKING_SELECTOR))
        if len(read) < left:  # every minute of each unread thread
            by_thread: dict[str, list[Candidate]] = {thread: [] for thread in unread}
            for c in read:
                by_thread[c.payload["thread_id"]].append(c)
            self._thread_reads.keep_whole(project_id, generation, filters, by_thread)
        return found + read

    def _scrolled(self, project_id: str, request: qe.ScrollRequest) -> list[Candidate]:
        """The minutes a scroll reads, with `RANKING_FIELDS` payloads (the project's own only)."""
        with self._shard(project_id, create=False) as shard:
            found, _ = shard.scroll(request) if shard is not None else ([], None)
        payloads = (_ranking_payload(r.payload) for r in found if r.payload)
        return [Candidate(str(p.get("minute_id", "")), p) for p in payloads if p.get("project_id") == project_id]

    def retrieve(self, project_id: str, minute_ids: Sequence[str]) -> list[Candidate]:
        """The stored points of these minutes (in the order asked, unknown ids skipped)."""
        project_id = require_project(project_id)
        ids = list(dict.fromkeys(minute_ids))
        if not ids:
            return []
        with self._shard(project_id, create=False) as shard:
            if shard is None:
                return []
            # By id (a filtered scroll costs a third more); the shard is the project's, and `ordered_records`
            # drops a payload naming another.
            records = shard.retrieve([point_id(project_id, m) for m in ids], with_payload=True, with_vector=False)
        return ordered_records(project_id, ids, (_unpack(r.payload) for r in records))

    def get_points(
        self, project_id: str, keys: Sequence[str], *, tier_keys: Sequence[str] = (), with_vectors: bool = False
    ) -> list[StoredPoint]:
        """Points that are not minutes, by key (UUID strings), and every point of these tier keys; unknown skipped."""
        project_id = require_project(project_id)
        ids: set[int | uuid.UUID | str] = {fact_point_id(k) for k in keys}
        if not ids and not tier_keys:
            return []
        tenant = qe.FieldCondition("project_id", match=qe.MatchValue(project_id))
        selectors: list[Any] = []
        if ids:
            selectors.append(qe.HasIdCondition(ids))
        if tier_keys:
            selectors.append(qe.FieldCondition("tier_key", match=qe.MatchAny(list(tier_keys))))
        vector: Any = [DENSE] if with_vectors and self.dense_dimensions is not None else False
        found: list[tuple[dict[str, Any] | None, list[float] | None]] = []
        with self._shard(project_id, create=False) as shard:
            if shard is None:
                return []
            for selector in selectors:
                offset = None
                while True:
                    records, offset = shard.scroll(
                        qe.ScrollRequest(
                            offset=offset,
                            limit=SCROLL_PAGE,
                            filter=qe.Filter(must=[tenant, selector]),
                            with_payload=True,
                            with_vector=vector,
                        )
                    )
                    found += [(_unpack(r.payload), _dense_of(r.vector)) for r in records]
                    if offset is None:
                        break
        return stored_points(project_id, found)

    def count(self, project_id: str, kind: str = MINUTE) -> int:
        """Points of one kind stored for the project (its minutes by default)."""
        project_id = require_project(project_id)
        with self._shard(project_id, create=False) as shard:
            if shard is None:
                return 0
            of_kind: Any = (
                qe.IsEmptyCondition(KIND) if kind == MINUTE else qe.FieldCondition(KIND, match=qe.MatchValue(kind))
            )
            flt = qe.Filter(must=[qe.FieldCondition("project_id", match=qe.MatchValue(project_id)), of_kind])
            return shard.count(qe.CountRequest(exact=True, filter=flt))

    def annotate(self, project_id: str, annotations: Mapping[str, Mapping[str, Any]], *, kind: str = MINUTE) -> int:
        """Set the evaluate pool's annotation on points that exist (see `VectorEngine.annotate`); returns how many.

        One set_payload per point (~11 us): each point's annotation differs. A point
        that is not there (a minute not indexed yet) is skipped: qdrant-edge refuses
        the whole operation for an unknown id, so they are not batched.
        """
        project_id = require_project(project_id)
        if not annotations:
            return 0
        updates: list[tuple[Any, dict[str, Any]]] = []
        for key, annotation in annotations.items():
            pid = point_id(project_id, key) if kind == MINUTE else fact_point_id(key)
            packed = msgpack.packb({f: annotation.get(f) for f in ANNOTATION_FIELDS})
            stored: dict[str, Any] = {
                ANNOTATION_FIELD: binascii.b2a_base64(packed, newline=False).decode("ascii"),
                KIND: annotation_kind(kind, annotation),
            }
            scores = annotation.get("scores")
            if isinstance(scores, Mapping) and isinstance(scores.get("composite"), int | float):
                stored[COMPOSITE_FIELD] = float(scores["composite"])
            worth = importance(dict(scores)) if isinstance(scores, Mapping) else None
            if worth is not None:
                stored[IMPORTANCE_FIELD] = worth  # ranking reads it flat: the new scores, not index time's
            updates.append((pid, stored))
        done = self.set_payloads(project_id, updates)
        if done and kind == MINUTE:
            self._thread_reads.forget(project_id)  # what a filter lets through may have changed anywhere in it
            if self._hot is not None:
                self._hot.annotate(project_id, updates)
        return done

    def set_payloads(self, project_id: str, updates: Sequence[tuple[Any, dict[str, Any]]]) -> int:
        """Set these payload fields on each of these points of the project that exists; how many did."""
        done = 0
        with self._ranking.writes, self._shard(project_id, create=False) as shard:
            if shard is None:
                return 0
            try:
                for pid, stored in updates:
                    try:
                        shard.update(qe.UpdateOperation.set_payload([pid], stored))
                    except Exception as exc:
                        if "No point with id" not in str(exc):
                            raise _edge_error(self.path / project_id, exc) from exc
                        continue
                    done += 1
            finally:
                self._ranking.written(project_id, [pid for pid, _ in updates])
        return done

    def delete_project(self, project_id: str) -> None:
        """Remove every point of the project (its shard directory), waiting for queries in flight on it."""
        project_id = require_project(project_id)
        if not is_tenant(project_id):
            return
        with self._cond:
            entry = self._open.get(project_id)
            while entry is not None and not entry.idle:
                self._cond.wait()
                entry = self._open.get(project_id)
            self._check_open()
            if entry is not None and entry.shard is not None:
                del self._open[project_id]
                entry.shard.close()
            # Still under the lock: nobody reopens the shard while its directory goes.
            if (self.path / project_id).exists():
                shutil.rmtree(self.path / project_id)
            self._thread_reads.forget(project_id)
            if self._forgets:
                self._ranking.forget(project_id)
        if self._hot is not None:
            self._hot.drop(project_id)

    def close(self) -> None:
        """Close every shard (flushing it) and release the directory lock. The engine cannot be used afterwards."""
        with self._cond:
            if self._closed:
                return
            while not all(e.idle for e in self._open.values()):
                self._cond.wait()
            for entry in self._open.values():
                if entry.shard is not None:
                    entry.shard.close()
            self._open.clear()
            self._closed = True
            self._lock_file.close()
        if self._hot is not None:
            self._hot.close()

    # -- embedded-engine extras -----------------------------------------------------

    def optimize(self, project_id: str | None = None) -> dict[str, bool]:
        """Merge segments and build indexes, blocking until done; for one project or every one on disk.

        Returns, per project, whether anything was optimized.
        """
        projects = [require_project(project_id)] if project_id is not None else self.tenants()
        done: dict[str, bool] = {}
        for project in projects:
            with self._shard(project, create=False) as shard:
                if shard is not None:
                    done[project] = shard.optimize()
        if self._hot is not None:
            self._hot.optimize(project_id)
        return done

    def projects(self) -> list[str]:
        """Projects that have a shard on disk."""
        return sorted(p.name for p in self.path.iterdir() if p.is_dir() and is_valid_project_id(p.name))

    def tenants(self) -> list[str]:
        """Projects that have a shard on disk, and `GLOBAL_TENANT` when global facts have one."""
        return sorted(p.name for p in self.path.iterdir() if p.is_dir() and is_tenant(p.name))

    def broken_projects(self) -> list[str]:
        """Projects whose shard did not load and was replaced by an empty one: rebuild each from the log.

        Read from the set-aside directories, so a project stays here across
        restarts until `mark_reindexed`: a crash between setting a shard aside
        and queueing its rebuild loses nothing.
        """
        with self._cond:
            return sorted(self._broken)

    def mark_reindexed(self, project_id: str) -> None:
        """Record that the project's rebuild from the log is queued (its set-aside shards are renamed so)."""
        with self._cond:
            aside = self._broken.pop(project_id, [])
        for directory in aside:
            with contextlib.suppress(FileNotFoundError):  # an operator took it away meanwhile
                os.rename(directory, directory.with_name(REINDEXED_PREFIX + directory.name[len(BROKEN_PREFIX) :]))
        if aside:
            fsync_dir(self.path)

    # -- shards ---------------------------------------------------------------------

    @contextmanager
    def _shard(self, project_id: str, *, create: bool) -> Iterator[qe.EdgeShard | None]:
        entry = self._acquire(project_id, create)
        if entry is None:
            yield None
            return
        try:
            assert entry.shard is not None
            yield entry.shard
        finally:
            with self._cond:
                entry.users -= 1
                self._cond.notify_all()

    def _acquire(self, project_id: str, create: bool) -> _OpenShard | None:
        with self._cond:
            while True:
                self._check_open()
                entry = self._open.get(project_id)
                if entry is None:
                    break
                if entry.shard is not None:
                    self._open.move_to_end(project_id)
                    entry.users += 1
                    return entry
                self._cond.wait()  # another thread is opening this shard
            opening = self._open[project_id] = _OpenShard()
        # Opening a shard takes tens of ms (WAL replay, indexes): not under the lock.
        shard = None
        try:
            shard = self._load(project_id, create)
        finally:
            with self._cond:
                if shard is None:
                    del self._open[project_id]
                else:
                    opening.shard = shard
                    opening.users = 1
                    self._open.move_to_end(project_id)
                    self._evict()
                self._cond.notify_all()
        return opening if shard is not None else None

    def _evict(self) -> None:
        excess = len(self._open) - self._max_open
        for project_id in list(self._open):
            if excess <= 0:
                break
            entry = self._open[project_id]
            if entry.idle:
                del self._open[project_id]
                assert entry.shard is not None
                entry.shard.close()
                excess -= 1

    def _load(self, project_id: str, create: bool) -> qe.EdgeShard | None:
        if not is_tenant(project_id):
            if create:
                raise ValueError(
                    f"project_id {project_id[:40]!r} may only hold {PROJECT_ID_RULE} (or be {GLOBAL_TENANT!r})"
                )
            return None
        directory = self.path / project_id
        if not directory.is_dir():
            if not create:
                return None
            return self._create(project_id, directory)
        try:
            shard = self._open_placed(directory)
        except Exception as exc:
            error = _edge_error(directory, exc)
            if isinstance(error, ShardLockedError):
                raise error from exc
            if not create:
                raise VectorStoreError(
                    f"the vector shard {directory} does not load ({exc}): the index pool sets it aside and "
                    f"rebuilds it from the log at the project's next batch; to rebuild it now, run "
                    f"`pvm replay --project {project_id}`"
                ) from exc
            self._set_aside(project_id, directory, exc)
            self._thread_reads.forget(project_id)
            if self._forgets:
                self._ranking.forget(project_id)
            return self._create(project_id, directory)
        try:
            self._configure(shard, directory)
        except BaseException:
            shard.close()
            raise
        return shard

    def _configure(self, shard: qe.EdgeShard, directory: Path) -> None:
        dimensions = self.dense_dimensions
        if dimensions is not None:
            # Idempotent for the same size; a shard created lexical-only gains the vector.
            _edge_call(
                directory,
                lambda: shard.update(qe.UpdateOperation.create_dense_vector(DENSE, dimensions, qe.Distance.Cosine)),
            )
        for field, schema in _payload_indexes():
            if self._indexed is None or field in self._indexed:
                shard.update(qe.UpdateOperation.create_field_index(field, schema))

    def _create(self, project_id: str, directory: Path) -> qe.EdgeShard:
        """A new shard at `directory`, made whole in a temporary directory first (see the module docstring)."""
        temporary = self.path / f"{TEMP_PREFIX}{project_id}-{uuid.uuid4().hex}"
        config = self._config(self.dense_dimensions)
        try:
            shard = _edge_call(temporary, lambda: qe.EdgeShard.create(str(temporary), config))
            try:
                self._configure(shard, temporary)
            finally:
                shard.close()
            try:
                os.rename(temporary, directory)
            except OSError as exc:
                raise VectorStoreError(
                    f"cannot create the vector shard {directory} ({exc.strerror}): move away what is at that path"
                ) from exc
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
        fsync_dir(self.path)
        return _edge_call(directory, lambda: qe.EdgeShard.load(str(directory)))

    def _set_aside(self, project_id: str, directory: Path, error: Exception) -> None:
        aside = self.path / f"{BROKEN_PREFIX}{int(time.time() * 1000)}-{project_id}"
        os.rename(directory, aside)
        fsync_dir(self.path)
        with self._cond:
            self._broken.setdefault(project_id, []).append(aside)
        log.error(
            "vector shard %s does not load (%s): set aside as %s and replaced by an empty shard; "
            "the project's index must be rebuilt from the log (the index pool queues it)",
            directory,
            error,
            aside,
        )

    def _sweep(self) -> None:
        """Remove shards whose creation was interrupted; find set-aside shards whose rebuild is not queued yet."""
        for entry in self.path.iterdir():
            if entry.name.startswith(TEMP_PREFIX):
                log.warning("vector store %s: removing %s, a shard whose creation was interrupted", self.path, entry)
                shutil.rmtree(entry, ignore_errors=True)
                continue
            broken = _BROKEN_NAME.fullmatch(entry.name)
            if broken is not None and is_tenant(broken.group(2)):
                self._broken.setdefault(broken.group(2), []).append(entry)
        if self._broken:
            pending = ", ".join(sorted(self._broken))
            log.error("vector store %s: shards set aside and not rebuilt yet for %s", self.path, pending)

    def _open_placed(self, directory: Path) -> qe.EdgeShard:
        """Load the shard at `directory`; one written before `PLACEMENT` with it (`_placed`), and as it is where
        the engine refuses that (the placement is a speed, never a reason to set a shard aside)."""
        placed = self._placed(directory)
        if placed is not None:
            try:
                return qe.EdgeShard.load(str(directory), placed)
            except Exception as exc:
                if isinstance(_edge_error(directory, exc), ShardLockedError):
                    raise
                log.warning(
                    "vector shard %s: opened as it was, its payloads cold (it did not take the page-cache "
                    "placement: %s); `pvm replay --project %s` rebuilds it with it",
                    directory,
                    exc,
                    directory.name,
                )
        return qe.EdgeShard.load(str(directory))

    def _placed(self, directory: Path) -> qe.EdgeConfig | None:
        """The configuration to load a shard written with cold payloads (before `PLACEMENT`) with, so that its
        segments from now on are warmed; None for a shard placed so already, or one whose configuration does not
        read (it loads as it is, or fails as it would have)."""
        stored = _stored_config(directory)
        if stored is None:
            return None
        config, size = stored
        if config.get("payload_memory") == PLACEMENT_NAME and config.get("id_tracker_memory") == PLACEMENT_NAME:
            return None
        return self._config(size)

    def _config(self, dense_dimensions: int | None = None) -> qe.EdgeConfig:
        """A shard's configuration: the lexical leg, a dense vector of `dense_dimensions` (None: none), and the
        payloads and point ids memory-mapped and warmed into the page cache (`PLACEMENT`)."""
        vectors = (
            {DENSE: qe.EdgeVectorParams(size=dense_dimensions, distance=qe.Distance.Cosine)}
            if dense_dimensions is not None
            else None
        )
        return qe.EdgeConfig(
            vectors=vectors,
            sparse_vectors={LEXICAL: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
            wal_enabled=True,
            max_search_threads=self._search_threads,
            payload_memory=PLACEMENT,
            id_tracker_memory=PLACEMENT,
        )

    def _check_open(self) -> None:
        if self._closed:
            raise VectorStoreError(f"the vector engine on {self.path} is closed")


def stored_dense_dimensions(path: Path) -> int | None:
    """The length of the dense vectors the shards under `path` hold, without opening them or taking the lock.

    Read from each shard's saved configuration (qdrant-edge has no call that
    answers it). None when no shard holds dense vectors, when shards disagree
    (a model changed and only some projects were rebuilt), or when nothing
    readable is there: the caller then learns the length another way.
    """
    sizes: set[int] = set()
    try:
        directories = [d for d in Path(path).iterdir() if d.is_dir() and is_tenant(d.name)]
    except OSError:
        return None
    for directory in directories:
        stored = _stored_config(directory)
        if stored is not None and stored[1] is not None:  # else a lexical-only shard, or one being written
            sizes.add(stored[1])
    return sizes.pop() if len(sizes) == 1 else None


def _stored_config(directory: Path) -> tuple[dict[str, Any], int | None] | None:
    """A shard's saved configuration (SHARD_CONFIG_FILE) and the length of its dense vectors (None: it holds
    none); None where it does not read as one."""
    try:
        config = json.loads((directory / SHARD_CONFIG_FILE).read_text())
        vectors = config.get("vectors") or {}
        size = vectors[DENSE]["size"] if DENSE in vectors else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
        return None
    return config, size


def _payload_indexes() -> Iterable[tuple[str, Any]]:
    yield "project_id", qe.KeywordIndexParams(is_tenant=True)
    for field in KEYWORD_FIELDS:
        yield field, qe.PayloadSchemaType.Keyword
    for field in INTEGER_FIELDS:
        yield field, qe.IntegerIndexParams(lookup=False, range=True)
    for field in FLOAT_FIELDS:
        yield STORED_KEYS.get(field, field), qe.FloatIndexParams()


def _edge_filter(conds: list[Condition]) -> qe.Filter:
    return qe.Filter(must=[_edge_condition(c) for c in conds])


@functools.lru_cache(maxsize=4096)
def _edge_condition(c: Condition) -> Any:
    """qdrant-edge's form of a condition, built once: a search builds the same few (its tenant, minutes not
    pruned) every time, and each qdrant-edge object costs microseconds to make."""
    key = STORED_KEYS.get(c.key, c.key)
    if isinstance(c, Match):
        return qe.FieldCondition(key, match=qe.MatchValue(c.value))
    if isinstance(c, MatchAny):
        return qe.FieldCondition(key, match=qe.MatchAny(list(c.values)))
    if isinstance(c, Range):
        return qe.FieldCondition(key, range=qe.RangeFloat(gte=c.gte, lt=c.lt))
    if isinstance(c, Empty):
        return qe.IsEmptyCondition(key)
    if isinstance(c, EmptyOr):
        return qe.Filter(should=[qe.IsEmptyCondition(key), qe.FieldCondition(key, match=qe.MatchValue(c.value))])
    raise TypeError(f"not a search condition: {c!r}")


def _dense_of(vectors: Any) -> list[float] | None:
    dense = vectors.get(DENSE) if isinstance(vectors, dict) else None
    return [float(x) for x in dense] if dense is not None else None


def _whole_ties(
    shard: Any,
    legs: Sequence[Callable[[int, Any, float], Any]],
    results: Sequence[list[qe.ScoredPoint]],
    limit: int,
    selector: Any,
) -> list[list[Hit]]:
    """Each leg's hits (`legs`: its request for a count and a payload selector); a leg whose cut falls inside a run
    of tied scores (`cut_inside_tie`) is asked again for the whole run, ids and scores only, cut in the total
    order (`whole_run`), and the payloads of the tied points it keeps that the first fetch left out are read by id,
    so that `merge_legs` cuts the same points whatever order the engine returned ties in."""
    out: list[list[Hit]] = []
    for leg, points in zip(legs, results, strict=True):
        hits: list[Hit] = [(p.id, p.score, p.payload) for p in points]
        if cut_inside_tie(hits, limit, leg_fetch(limit)):
            wide = shard.query(leg(limit * TIE_FETCH_FACTOR, False, tie_floor(hits, limit)))
            hits, missing = whole_run(hits, [(p.id, p.score, None) for p in wide], limit)
            if missing:
                read = {r.id: r.payload for r in shard.retrieve(missing, with_payload=selector, with_vector=False)}
                hits = with_payloads(hits, read)
        out.append(hits)
    return out


def _as_is(payload: dict[str, Any]) -> dict[str, Any]:
    return payload


def _hits(points: Iterable[Hit], read: Callable[[dict[str, Any]], dict[str, Any]]) -> list[Hit]:
    return [(pid, score, read(stored) if stored else None) for pid, score, stored in points]


def _pack(point: MemoryPoint, packer: msgpack.Packer | None = None) -> dict[str, Any]:
    """A point's payload as stored: `DIRECT_FIELDS` as themselves, the composite flat, everything else in one string.

    qdrant-edge converts a Python payload value by value at a few microseconds
    each; a minute's nested payload (~40 values) made every upsert cost ~0.2 ms.
    One string for the parts nobody filters on makes it ~4x cheaper; base64 of
    msgpack rather than JSON because it packs in ~4 us where JSON took ~12.
    The project and minute id are the point's (`check_point` refused a payload
    claiming another project). `packer`, a default `msgpack.Packer`, saves
    making one per point.
    """
    payload = point.payload
    stored: dict[str, Any] = {"project_id": point.project_id}
    rest: dict[str, Any] = {}
    for key, value in payload.items():
        if key in _OWN:
            continue  # the point's own
        if value is not None and key in _DIRECT:
            stored[key] = value
        else:
            rest[key] = value
    scores = payload.get("scores")
    composite = scores.get("composite") if isinstance(scores, dict) else None
    if isinstance(composite, int | float) and not isinstance(composite, bool):
        stored[COMPOSITE_FIELD] = float(composite)
    worth = importance(scores)
    if worth is not None:
        stored[IMPORTANCE_FIELD] = worth
    try:
        packed = packer.pack(rest) if packer is not None else msgpack.packb(rest)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"payload of minute {point.minute_id!r} holds a value msgpack cannot pack: {exc}") from None
    blob = binascii.b2a_base64(packed, newline=False).decode("ascii")
    stored[PACKED_FIELD] = f"{len(point.minute_id)}:{point.minute_id}{blob}"
    return stored


def _packed_parts(packed: str) -> tuple[str, str]:
    """The minute id and the base64 msgpack of a `PACKED_FIELD` value."""
    length, _, rest = packed.partition(":")
    n = int(length)
    return rest[:n], rest[n:]


def _ranking_stored(stored: dict[str, Any]) -> dict[str, Any]:
    """The fields of a payload as stored that `_RANKING_SELECTOR` reads (those present)."""
    return {f: stored[f] for f in _RANKING_STORED if f in stored}


def _ranking_payload(stored: dict[str, Any]) -> dict[str, Any]:
    """`RANKING_FIELDS` of a payload stored by `_pack` and read through `_RANKING_SELECTOR`."""
    if JSON_PACKED_FIELD in stored:  # a point written before these fields existed: whole, as it was
        return _unpack(stored)
    payload = dict(stored)  # the selector read the ranking fields stored as themselves, and these three:
    packed = payload.pop(PACKED_FIELD, None)
    composite = payload.pop(COMPOSITE_FIELD, None)
    worth = payload.pop(IMPORTANCE_FIELD, None)
    if packed is not None:
        at = packed.index(":")  # `_packed_parts` without copying the blob
        payload["minute_id"] = packed[at + 1 : at + 1 + int(packed[:at])]
    if composite is not None:
        payload["scores"] = {"composite": composite}
    if worth is not None:
        payload.setdefault("scores", {})["importance"] = worth
    return payload


def _unpack(stored: dict[str, Any] | None) -> dict[str, Any]:
    if not stored:
        return {}
    payload = dict(stored)
    packed = payload.pop(PACKED_FIELD, None)
    payload.pop(COMPOSITE_FIELD, None)
    payload.pop(IMPORTANCE_FIELD, None)
    if packed is not None:
        payload["minute_id"], blob = _packed_parts(packed)
        payload.update(msgpack.unpackb(base64.b64decode(blob), strict_map_key=False))
    legacy = payload.pop(JSON_PACKED_FIELD, None)
    if legacy is not None:
        payload.update(json.loads(legacy))
    annotation = payload.pop(ANNOTATION_FIELD, None)
    if annotation is not None:
        fields = msgpack.unpackb(base64.b64decode(annotation), strict_map_key=False)
        payload.update({k: v for k, v in fields.items() if v is not None})
    if payload.get(KIND) is None:
        payload.pop(KIND, None)  # a minute restored from pruned by an annotation without `pruned_ms`
    return payload


_T = TypeVar("_T")


def _edge_call(directory: Path, call: Callable[[], _T]) -> _T:
    """Run a qdrant-edge call, turning its generic errors into ones that say what to do."""
    try:
        return call()
    except Exception as exc:
        raise _edge_error(directory, exc) from exc


def _edge_error(directory: Path, exc: Exception) -> VectorStoreError:
    """A qdrant-edge error on `directory` as one of ours, saying what to do."""
    message = str(exc)
    if "WAL" in message and "WouldBlock" in message:
        return ShardLockedError(
            f"the vector shard {directory} is open in another process: the embedded engine allows one "
            "process per shard (run the index pool and the reader in the process that owns it, `pvm up`, "
            "or use a Qdrant server via PVM_QDRANT_URL)"
        )
    if "already exists with different parameters" in message or "incompatible" in message.lower():
        return VectorConfigError(
            f"the vector shard {directory} holds vectors of another configuration ({message}); "
            "rebuild it (`pvm replay`) or configure the embedder it was built with"
        )
    return VectorStoreError(f"qdrant-edge failed on {directory}: {message}")


def _hold_lock(path: Path) -> IO[str]:
    """Hold an exclusive lock on `path` for the engine's life; fail at once if someone else holds it."""
    handle = open(path, "a+")  # noqa: SIM115 - held open until close()
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise ShardLockedError(
            f"the vector store {path.parent} is already open (lock held by pid {holder}): the embedded engine "
            "allows one process per directory — run the index pool and the reader in the process that owns it "
            "(`pvm up`), or use a Qdrant server via PVM_QDRANT_URL"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle
