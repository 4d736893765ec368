"""Server vector engine: a Qdrant server through qdrant-client (``PVM_QDRANT_URL``, optional API key).

One collection, ``{prefix}_minutes``, holds every project, with a tenant payload
index on ``project_id`` (``is_tenant=True``: Qdrant co-locates each tenant's
points). Per-tenant IDF comes from the query itself: every lexical search
sends ``SearchParams(idf=IdfCorpusParams(corpus=<project filter>))``, so term
rarity is computed over the project's own points, as the embedded engine's
shard-per-project gets it. That needs Qdrant ≥ 1.19 (per-tenant IDF
statistics); the engine checks the server version before first use and refuses
older servers rather than silently scoring with collection-wide IDF.

Why not a collection per project, the other honest way to per-tenant IDF:
Qdrant's advice for many tenants is one collection with a tenant index; each
collection costs the server its own segments, optimizer and WAL, project ids
would need mangling into collection names, and `pvm serve` replicas would race
to create collections. With the corpus filter the shared collection answers
exactly like the embedded engine (the shared test suite compares scores).

Every query, count, scroll and delete also carries a ``must`` filter on
``project_id``: tenancy fails closed. Global-tier facts carry the tenant
``_global`` (`pvm.vectors.GLOBAL_TENANT`) there, a name no project can have. Replicas of `pvm serve` are stateless;
the collection and its indexes are created on first use (idempotently).

Tests run this module against ``QdrantClient(":memory:")``, which speaks the
same API (brute force, payload indexes ignored, per-tenant IDF honoured).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from contracts.memory import SearchFilters
from pvm.extras import ServerExtraMissing
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
    FLOAT_FIELDS,
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
    VectorConfigError,
    annotation_kind,
    check_dense,
    check_fusion,
    check_limit,
    conditions,
    cut_inside_tie,
    fact_point_id,
    leg_fetch,
    merge_legs,
    ordered_records,
    point_id,
    require_project,
    stored_payload,
    stored_point_id,
    stored_points,
    thread_window,
    tie_floor,
    whole_run,
    window_ms,
    with_payloads,
)
from pvm.vectors.lexical import LexicalEncoder

try:
    from qdrant_client import QdrantClient, models
except ImportError as exc:
    raise ServerExtraMissing("qdrant_client", "the Qdrant server engine (PVM_QDRANT_URL)") from exc

COLLECTION = "minutes"
_RANKING_SELECTOR = models.PayloadSelectorInclude(include=list(RANKING_FIELDS))
MIN_SERVER_VERSION = (1, 19)  # per-tenant IDF statistics (`SearchParams.idf` corpus)
UPSERT_CHUNK = 256
SCROLL_PAGE = 256  # points per page when reading a tier key's points back


class ServerEngine:
    """A `VectorEngine` on a Qdrant server: one shared collection, tenant index, per-tenant IDF (module docstring)."""

    def __init__(
        self,
        client: QdrantClient,
        collection_prefix: str = "pvm",
        dense_dimensions: int | None = None,
        *,
        fusion: Fusion = "rrf",
        lexical: LexicalEncoder | None = None,
    ) -> None:
        if dense_dimensions is not None and dense_dimensions < 1:
            raise ValueError(f"dense_dimensions must be positive or None, got {dense_dimensions}")
        self.client = client
        self.collection = f"{collection_prefix}_{COLLECTION}"
        self.dense_dimensions = dense_dimensions
        self.fusion = check_fusion(fusion)
        self._lexical = lexical or LexicalEncoder()
        self._owns_client = False
        self._ready = False
        self._ready_lock = threading.Lock()

    @classmethod
    def from_url(
        cls,
        url: str,
        api_key: str | None = None,
        *,
        collection_prefix: str = "pvm",
        dense_dimensions: int | None = None,
        fusion: Fusion = "rrf",
        timeout: int = 10,
    ) -> ServerEngine:
        """An engine on the Qdrant server at `url` (PVM_QDRANT_URL), authenticating with `api_key` when given."""
        if not url:
            raise ValueError("PVM_QDRANT_URL is empty: give the Qdrant server URL, e.g. http://localhost:6333")
        engine = cls(
            QdrantClient(url=url, api_key=api_key or None, timeout=timeout),
            collection_prefix,
            dense_dimensions,
            fusion=fusion,
        )
        engine._owns_client = True
        return engine

    # -- VectorEngine ---------------------------------------------------------------

    def upsert(self, points: Sequence[MemoryPoint]) -> None:
        """Index points, idempotently (a minute id always maps to one point); all are checked before any is written."""
        structs: list[models.PointStruct] = []
        for point in points:
            payload = stored_payload(point)
            stored_id = stored_point_id(point)
            sparse = self._lexical.document(point.text, stored_id)
            vector: dict[str, Any] = {
                LEXICAL: models.SparseVector(indices=list(sparse.indices), values=list(sparse.values))
            }
            dense = check_dense(point.dense, self.dense_dimensions, f"minute {point.minute_id!r}")
            if dense is not None:
                vector[DENSE] = dense
            structs.append(models.PointStruct(id=str(stored_id), vector=vector, payload=payload))
        if not structs:
            return
        self._ensure()
        for start in range(0, len(structs), UPSERT_CHUNK):
            self.client.upsert(self.collection, points=structs[start : start + UPSERT_CHUNK], wait=True)

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
        (unless `fused` is False: then the legs alone, each leg searched once).

        Each leg keeps its best `limit` points in a total order (score, then point
        id: `merge_legs`), asking for more while its cut falls inside a run of equal
        scores, so the candidates are the same whatever order the points were
        written in; they are every point either leg kept (up to 2·limit), in fused
        order, then point id.

        The legs and the fusion go as one `query_batch_points` round trip, so
        each candidate carries its per-leg scores (`keyword`, `semantic`, ranks
        in `extra`) and Qdrant's fused score (`fused`). With
        ``with_payload=False`` each payload holds only `RANKING_FIELDS`.
        Minutes, or with `facts`, fact points within those filters (`conditions`).
        """
        project_id = require_project(project_id)
        check_limit(limit)
        dense_vector = check_dense(dense, self.dense_dimensions, "the query") if self.dense_dimensions else None
        must = _server_filter(conditions(project_id, filters, facts))
        idf = _tenant_idf(project_id)
        sparse = self._lexical.query(text or "")
        lexical_vector = (
            models.SparseVector(indices=list(sparse.indices), values=list(sparse.values)) if sparse.indices else None
        )
        both = lexical_vector is not None and dense_vector is not None
        fuse = both and fused
        selector: Any = True if with_payload else _RANKING_SELECTOR
        leg_payload = selector  # every leg candidate readable, also those beyond the engine's fused list
        legs: list[Callable[..., models.QueryRequest]] = []
        if lexical_vector is not None:
            legs.append(
                functools.partial(
                    models.QueryRequest,
                    query=lexical_vector,
                    using=LEXICAL,
                    filter=must,
                    with_payload=leg_payload,
                    params=idf,
                )
            )
        if dense_vector is not None:
            legs.append(
                functools.partial(
                    models.QueryRequest, query=dense_vector, using=DENSE, filter=must, with_payload=leg_payload
                )
            )
        requests = [leg(limit=leg_fetch(limit)) for leg in legs]
        if not requests:
            return []
        if fuse:
            fusion: Any = (
                models.RrfQuery(rrf=models.Rrf(k=RRF_K))
                if self.fusion == "rrf"
                else models.FusionQuery(fusion=models.Fusion.DBSF)
            )
            requests.append(
                models.QueryRequest(
                    prefetch=[
                        models.Prefetch(query=lexical_vector, using=LEXICAL, filter=must, limit=limit, params=idf),
                        models.Prefetch(query=dense_vector, using=DENSE, filter=must, limit=limit),
                    ],
                    query=fusion,
                    filter=must,
                    limit=2 * limit,  # the whole union of the legs
                    with_payload=selector,  # each payload sent once
                )
            )
        self._ensure()
        responses = self.client.query_batch_points(self.collection, requests)
        points = [response.points for response in responses]
        hits = [_hits(p) for p in points]
        for i, leg in enumerate(legs):
            if cut_inside_tie(hits[i], limit, leg_fetch(limit)):
                # The cut falls inside a tie: the whole run, ids and scores only, then the kept ones' payloads.
                (wide,) = self.client.query_batch_points(
                    self.collection,
                    [
                        leg(
                            limit=limit * TIE_FETCH_FACTOR,
                            with_payload=False,
                            score_threshold=tie_floor(hits[i], limit),
                        )
                    ],
                )
                hits[i], missing = whole_run(hits[i], _hits(wide.points), limit)
                if missing:
                    read = {
                        r.id: r.payload
                        for r in self.client.retrieve(
                            self.collection, missing, with_payload=selector, with_vectors=False
                        )
                    }
                    hits[i] = with_payloads(hits[i], read)
        unspread = self._lexical.unspread
        lexical_hits = (
            [(pid, unspread(score, pid), payload) for pid, score, payload in hits[0]]
            if lexical_vector is not None
            else []
        )
        dense_hits = hits[1 if both else 0] if dense_vector is not None else []
        fused_hits = hits[2] if fuse else None
        return merge_legs(project_id, lexical_hits, dense_hits, fused_hits, limit)

    def around(
        self, project_id: str, filters: SearchFilters, minute: Candidate, count: int, *, long: bool = False
    ) -> list[Candidate]:
        """`minute` and up to `count` minutes within `filters` each side of it in time, oldest first (`thread_window`),
        with `RANKING_FIELDS` payloads: a short thread read whole through its keyword index, a long one in time
        order from the timestamp index."""
        project_id = require_project(project_id)
        conds = conditions(project_id, filters)
        must = _server_filter(conds)
        self._ensure()

        def records(flt: models.Filter, limit: int, order: models.OrderBy | None = None) -> list[Candidate]:
            return self._scrolled(project_id, flt, limit, order)

        def whole(limit: int) -> list[Candidate]:
            return records(must, limit)

        def ordered(newest_first: bool, start_ms: int, limit: int) -> list[Candidate]:
            direction = models.Direction.DESC if newest_first else models.Direction.ASC
            return records(must, limit, models.OrderBy(key="timestamp_ms", direction=direction, start_from=start_ms))

        def run(at_ms: int) -> list[Candidate]:
            return records(_server_filter([*conds, Range("timestamp_ms", gte=at_ms, lt=at_ms + 1)]), WINDOW_RUN_CAP)

        return thread_window(None if long else whole, ordered, run, minute, window_ms(minute), count)

    def in_threads(
        self, project_id: str, filters: SearchFilters, thread_ids: Sequence[str], limit: int
    ) -> list[Candidate]:
        """Up to `limit` minutes of these threads within `filters`, in no particular order, with `RANKING_FIELDS`
        payloads (one scroll): fewer than `limit` is every one of them."""
        project_id = require_project(project_id)
        check_limit(limit)
        threads = tuple(sorted(set(thread_ids)))
        if not threads:
            return []
        self._ensure()
        return self._scrolled(
            project_id, _server_filter([*conditions(project_id, filters), MatchAny("thread_id", threads)]), limit
        )

    def _scrolled(
        self, project_id: str, flt: models.Filter, limit: int, order: models.OrderBy | None = None
    ) -> list[Candidate]:
        """The minutes a scroll reads, with `RANKING_FIELDS` payloads (the project's own only)."""
        found, _ = self.client.scroll(
            self.collection,
            scroll_filter=flt,
            limit=limit,
            order_by=order,
            with_payload=_RANKING_SELECTOR,
            with_vectors=False,
        )
        payloads = (r.payload for r in found if r.payload)
        return [Candidate(str(p.get("minute_id", "")), p) for p in payloads if p.get("project_id") == project_id]

    def retrieve(self, project_id: str, minute_ids: Sequence[str]) -> list[Candidate]:
        """The stored points of these minutes (in the order asked, unknown ids skipped)."""
        project_id = require_project(project_id)
        ids = list(dict.fromkeys(minute_ids))
        if not ids:
            return []
        self._ensure()
        flt = models.Filter(
            must=[
                _project_condition(project_id),
                models.HasIdCondition(has_id=[str(point_id(project_id, m)) for m in ids]),
            ]
        )
        records, _ = self.client.scroll(
            self.collection, scroll_filter=flt, limit=len(ids), with_payload=True, with_vectors=False
        )
        return ordered_records(project_id, ids, (r.payload or {} for r in records))

    def get_points(
        self, project_id: str, keys: Sequence[str], *, tier_keys: Sequence[str] = (), with_vectors: bool = False
    ) -> list[StoredPoint]:
        """Points that are not minutes, by key (UUID strings), and every point of these tier keys; unknown skipped."""
        project_id = require_project(project_id)
        ids = [str(fact_point_id(k)) for k in dict.fromkeys(keys)]
        selectors: list[Any] = []
        if ids:
            selectors.append(models.HasIdCondition(has_id=list(ids)))
        if tier_keys:
            selectors.append(models.FieldCondition(key="tier_key", match=models.MatchAny(any=list(tier_keys))))
        if not selectors:
            return []
        self._ensure()
        vectors: Any = [DENSE] if with_vectors and self.dense_dimensions is not None else False
        found: list[tuple[dict[str, Any] | None, list[float] | None]] = []
        for selector in selectors:
            offset = None
            while True:
                records, offset = self.client.scroll(
                    self.collection,
                    scroll_filter=models.Filter(must=[_project_condition(project_id), selector]),
                    limit=SCROLL_PAGE,
                    offset=offset,
                    with_payload=True,
                    with_vectors=vectors,
                )
                found += [(r.payload, _dense_of(r.vector)) for r in records]
                if offset is None:
                    break
        return stored_points(project_id, found)

    def count(self, project_id: str, kind: str = MINUTE) -> int:
        """Points of one kind stored for the project (its minutes by default)."""
        project_id = require_project(project_id)
        self._ensure()
        of_kind: Any = (
            models.IsEmptyCondition(is_empty=models.PayloadField(key=KIND))
            if kind == MINUTE
            else models.FieldCondition(key=KIND, match=models.MatchValue(value=kind))
        )
        flt = models.Filter(must=[_project_condition(project_id), of_kind])
        return self.client.count(self.collection, count_filter=flt, exact=True).count

    def annotate(self, project_id: str, annotations: Mapping[str, Mapping[str, Any]], *, kind: str = MINUTE) -> int:
        """Set the evaluate pool's annotation on points that exist (see `VectorEngine.annotate`); returns how many.

        Which points exist is read first (one scroll), then every annotation goes in one batch request: the
        server refuses a batch that names an unknown point.
        """
        project_id = require_project(project_id)
        if not annotations:
            return 0
        self._ensure()
        ids = {str(point_id(project_id, key) if kind == MINUTE else fact_point_id(key)): key for key in annotations}
        flt = models.Filter(must=[_project_condition(project_id), models.HasIdCondition(has_id=list(ids))])
        records, _ = self.client.scroll(
            self.collection, scroll_filter=flt, limit=len(ids), with_payload=False, with_vectors=False
        )
        operations: list[Any] = []
        for record in records:
            annotation = annotations[ids[str(record.id)]]
            payload: dict[str, Any] = {f: annotation.get(f) for f in ANNOTATION_FIELDS}
            payload[KIND] = annotation_kind(kind, annotation)
            operations.append(
                models.SetPayloadOperation(set_payload=models.SetPayload(payload=payload, points=[record.id]))
            )
        if operations:
            self.client.batch_update_points(self.collection, update_operations=operations, wait=True)
        return len(operations)

    def delete_project(self, project_id: str) -> None:
        """Remove every point of the project."""
        project_id = require_project(project_id)
        self._ensure()
        flt = models.Filter(must=[_project_condition(project_id)])
        self.client.delete(self.collection, points_selector=models.FilterSelector(filter=flt), wait=True)

    def close(self) -> None:
        """Close the client if this engine created it (`from_url`); a client passed in stays the caller's."""
        if self._owns_client:
            self.client.close()

    # -- collection -----------------------------------------------------------------

    def _ensure(self) -> None:
        """Check the server and create the collection and its indexes once (safe when replicas race)."""
        if self._ready:
            return
        with self._ready_lock:
            if self._ready:
                return
            self._check_version()
            if not self.client.collection_exists(self.collection):
                try:
                    self.client.create_collection(
                        self.collection,
                        vectors_config=(
                            {DENSE: models.VectorParams(size=self.dense_dimensions, distance=models.Distance.COSINE)}
                            if self.dense_dimensions is not None
                            else {}
                        ),
                        sparse_vectors_config={LEXICAL: models.SparseVectorParams(modifier=models.Modifier.IDF)},
                    )
                except Exception:
                    if not self.client.collection_exists(self.collection):
                        raise
            info = self.client.get_collection(self.collection)
            self._check_vectors(info.config.params)
            present = set(info.payload_schema or {})
            for field, schema in _payload_indexes():
                if field not in present:
                    self.client.create_payload_index(self.collection, field, schema, wait=True)
            self._ready = True

    def _check_version(self) -> None:
        version = self.client.info().version
        try:
            parts = tuple(int(p) for p in version.split("-")[0].split(".")[:2])
        except ValueError:
            return  # a development build: trust it
        if parts < MIN_SERVER_VERSION:
            need = ".".join(map(str, MIN_SERVER_VERSION))
            raise VectorConfigError(
                f"Qdrant server {version} is too old: PVM needs ≥ {need} for per-tenant IDF "
                "(SearchParams.idf corpus); upgrade the server"
            )

    def _check_vectors(self, params: models.CollectionParams) -> None:
        sparse = (params.sparse_vectors or {}).get(LEXICAL)
        if sparse is None or sparse.modifier != models.Modifier.IDF:
            raise VectorConfigError(
                f"collection {self.collection} has no '{LEXICAL}' sparse vector with the IDF modifier; "
                "it was not made by PVM: choose another collection prefix or delete it"
            )
        if self.dense_dimensions is None:
            return
        vectors = params.vectors if isinstance(params.vectors, dict) else {}
        existing = vectors.get(DENSE)
        if existing is None:
            self.client.create_vector_name(
                self.collection,
                DENSE,
                models.DenseVectorNameConfig(
                    dense=models.DenseVectorConfig(size=self.dense_dimensions, distance=models.Distance.COSINE)
                ),
            )
        elif existing.size != self.dense_dimensions:
            raise VectorConfigError(
                f"collection {self.collection} holds {existing.size}-dimension dense vectors but the embedder "
                f"makes {self.dense_dimensions}: configure the embedder it was built with, or use another "
                "collection prefix and rebuild (`pvm replay`)"
            )


def stored_dense_dimensions(client: QdrantClient, collection_prefix: str = "pvm") -> int | None:
    """The length of the dense vectors the collection holds; None when there is no collection or it is lexical-only."""
    collection = f"{collection_prefix}_{COLLECTION}"
    if not client.collection_exists(collection):
        return None
    vectors = client.get_collection(collection).config.params.vectors
    dense = vectors.get(DENSE) if isinstance(vectors, dict) else None
    return dense.size if dense is not None else None


def _payload_indexes() -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = [
        ("project_id", models.KeywordIndexParams(type=models.KeywordIndexType.KEYWORD, is_tenant=True))
    ]
    out += [(f, models.PayloadSchemaType.KEYWORD) for f in KEYWORD_FIELDS]
    out += [
        (f, models.IntegerIndexParams(type=models.IntegerIndexType.INTEGER, lookup=False, range=True))
        for f in INTEGER_FIELDS
    ]
    out += [(f, models.PayloadSchemaType.FLOAT) for f in FLOAT_FIELDS]
    return out


def _project_condition(project_id: str) -> models.FieldCondition:
    return models.FieldCondition(key="project_id", match=models.MatchValue(value=project_id))


def _tenant_idf(project_id: str) -> models.SearchParams:
    """IDF statistics over the project's own points."""
    return models.SearchParams(idf=models.IdfCorpusParams(corpus=models.Filter(must=[_project_condition(project_id)])))


def _server_filter(conds: list[Condition]) -> models.Filter:
    must: list[Any] = []
    for c in conds:
        if isinstance(c, Match):
            must.append(models.FieldCondition(key=c.key, match=models.MatchValue(value=c.value)))
        elif isinstance(c, MatchAny):
            must.append(models.FieldCondition(key=c.key, match=models.MatchAny(any=list(c.values))))
        elif isinstance(c, Range):
            must.append(models.FieldCondition(key=c.key, range=models.Range(gte=c.gte, lt=c.lt)))
        elif isinstance(c, Empty):
            must.append(models.IsEmptyCondition(is_empty=models.PayloadField(key=c.key)))
        elif isinstance(c, EmptyOr):
            must.append(
                models.Filter(
                    should=[
                        models.IsEmptyCondition(is_empty=models.PayloadField(key=c.key)),
                        models.FieldCondition(key=c.key, match=models.MatchValue(value=c.value)),
                    ]
                )
            )
    return models.Filter(must=must)


def _dense_of(vector: Any) -> list[float] | None:
    dense = vector.get(DENSE) if isinstance(vector, dict) else None
    return [float(x) for x in dense] if isinstance(dense, list) else None


def _hits(points: list[models.ScoredPoint]) -> list[Hit]:
    return [(p.id, p.score, p.payload) for p in points]
