"""The process's vector engine, embedder and searcher, built once from settings and shared.

The embedded engine locks its directory: only one process may open it, and in
that process the index pool and the reader must use the same engine object.
`shared_engine()` hands every caller in a process the same one.

The engine needs the dense vector length before it opens anything. It is
PVM_EMBED_DIMENSIONS, else the length the store already holds, else one quick
probe of the provider (`OpenAIEmbedder.dimensions`): a process over an existing
store starts while the provider is down, and a new one fails at once with an
error that says to set PVM_EMBED_DIMENSIONS.
"""

from __future__ import annotations

import logging
import threading
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from contracts.memory import RankWeights
from pvm import defaults
from pvm.config import Settings
from pvm.extras import ServerExtraMissing
from pvm.protocols import Embedder, VectorEngine

log = logging.getLogger(__name__)


@dataclass
class _Shared:
    key: tuple[str, str] | None = None
    engine: VectorEngine | None = None
    embedder: Embedder | None = None


_lock = threading.Lock()
_shared = _Shared()


def embedder_for(settings: Settings, stored_dimensions: int | None = None) -> Embedder:
    """The configured embedder: OpenAI-compatible when PVM_EMBED_MODEL is set, else none (lexical only).

    Indexing batches get PVM_EMBED_TIMEOUT and PVM_EMBED_MAX_RETRIES; search queries
    (`embed_query`) and the probe for the vector length one try of PVM_EMBED_QUERY_TIMEOUT.
    `stored_dimensions` (the length the vector store holds) spares that probe.
    """
    from pvm.embedders import embedder_from_settings

    return embedder_from_settings(
        settings.embed_model,
        settings.openai_base_url,
        settings.openai_api_key,
        settings.embed_dimensions,
        batch_size=settings.embed_batch_size,
        max_retries=settings.embed_max_retries,
        timeout=settings.embed_timeout_s,
        query_timeout=settings.embed_query_timeout_s,
        stored_dimensions=stored_dimensions,
    )


def stored_dense_dimensions(settings: Settings) -> int | None:
    """The length of the dense vectors the configured store already holds, when the embedder needs to know it.

    Read only when PVM_EMBED_MODEL is set without PVM_EMBED_DIMENSIONS. None when
    the store holds no dense vectors (or cannot say): the embedder probes instead.
    """
    if not settings.embed_model or settings.embed_dimensions is not None:
        return None
    if settings.qdrant_url:
        try:
            from qdrant_client import QdrantClient
        except ImportError as exc:
            raise ServerExtraMissing("qdrant_client", "the Qdrant server engine (PVM_QDRANT_URL)") from exc

        from pvm.vectors.server import stored_dense_dimensions as held_by_collection

        try:
            with closing(QdrantClient(url=settings.qdrant_url, api_key=settings.qdrant_api_key or None)) as client:
                return held_by_collection(client)
        except Exception as exc:  # the engine reports Qdrant's state when it is used; the provider may still answer
            log.warning("could not read the dense vector length from Qdrant (%s); asking the embedding provider", exc)
            return None
    from pvm.vectors.edge import stored_dense_dimensions as held_by_shards

    return held_by_shards(settings.vector_dir)


def make_engine(settings: Settings, dense_dimensions: int | None) -> VectorEngine:
    """A new engine: the Qdrant server at PVM_QDRANT_URL, else the embedded engine under $PVM_HOME/var/qdrant."""
    if settings.qdrant_url:
        from pvm.vectors.server import ServerEngine

        return ServerEngine.from_url(settings.qdrant_url, settings.qdrant_api_key, dense_dimensions=dense_dimensions)
    from pvm.vectors.edge import EdgeEngine

    return EdgeEngine(settings.vector_dir, dense_dimensions=dense_dimensions, hot_minutes=settings.search_hot_minutes)


def shared(settings: Settings) -> tuple[VectorEngine, Embedder]:
    """This process's engine and embedder for `settings` (created on first use)."""
    key = (settings.qdrant_url or str(settings.vector_dir.resolve()), settings.embed_model or "")
    with _lock:
        if _shared.engine is None or _shared.key != key:
            if _shared.engine is not None:
                _shared.engine.close()
                _shared.engine = _shared.embedder = _shared.key = None  # not handed out again if the next one fails
            embedder = embedder_for(settings, stored_dense_dimensions(settings))
            _shared.engine = make_engine(settings, embedder.dimensions)
            _shared.embedder = embedder
            _shared.key = key
        assert _shared.embedder is not None
        return _shared.engine, _shared.embedder


def shared_engine(settings: Settings) -> VectorEngine:
    return shared(settings)[0]


def searcher_for(settings: Settings, connection: Any = None) -> object:
    """A HybridSearch over this process's engine, weighted as configured, reading hits' minutes from Redis and the log.

    Minute points do not hold the minute itself: hits read it from the
    minute cache at PVM_REDIS_URL (or `connection`, a caller's client of it),
    else from the log under PVM_HOME (`pvm.stores.minutes.DurableMinutes`).
    """
    from pvm.connection import redis_from_settings
    from pvm.search import HybridSearch
    from pvm.stores.cache import MinuteCache
    from pvm.stores.log import LogReader
    from pvm.stores.minutes import DurableMinutes

    engine, embedder = shared(settings)
    redis_client = connection if connection is not None else redis_from_settings(settings)
    minutes = DurableMinutes(MinuteCache(redis_client), LogReader(settings.log_dir))
    return HybridSearch(engine, embedder, RankWeights(*ranking_weights(settings)), minutes=minutes)


def ranking_weights(settings: Settings) -> tuple[float, float, float, float]:
    """PVM_SEARCH_WEIGHTS, else the default for the mode: the semantic leg leads when dense vectors are on."""
    if settings.search_weights is not None:
        return settings.search_weights
    return defaults.SEARCH_WEIGHTS_WITH_EMBEDDINGS if settings.embed_model else defaults.SEARCH_WEIGHTS


def close_shared() -> None:
    """Close the process's engine (flushing it and releasing the embedded engine's lock)."""
    with _lock:
        engine, _shared.engine, _shared.key, _shared.embedder = _shared.engine, None, None, None
    if engine is not None:
        engine.close()
