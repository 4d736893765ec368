"""The lexical sparse vector of a text: English stopwords dropped, words stemmed, BM25 term weights.

Both engines index exactly these vectors (qdrant-edge's `Bm25`, which needs no
server), so the embedded and the server backend score a query alike. A
document vector holds each stem once with its BM25 term-frequency weight
(k, b and the expected length folded in); a query vector holds each stem with
weight 1. The IDF half of BM25 is not in the vector: the collection's
`lexical` sparse vector carries Qdrant's IDF modifier, which applies it at
query time over the tenant's own points.

Changing the settings here changes every document vector: rebuild the index
(`pvm replay`) afterwards.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from pvm.extras import ServerExtraMissing

if TYPE_CHECKING:
    import qdrant_edge

# Coordination minutes are short; BM25's default expected length (256 tokens,
# written for web pages) would make every minute look "short" and flatten the
# length normalization.
AVG_MINUTE_TOKENS = 48.0
LANGUAGE = "english"  # the stopword list and the Snowball stemmer
# A document's weights are scaled by 1 + SPREAD * (1 - its point id as a fraction of all ids): equal texts score
# apart, lowest point id first (the total order's own tie-break), so a leg's cut seldom falls inside a run of equal
# scores and seldom needs the second fetch that puts such a run in order. Near-ties in relevance closer than this
# share of their score are ordered by point id as well; ties the spread leaves (float32 rounding) are still caught.
SPREAD = 1e-3


_IDS = float(1 << 128)


class LexicalEncoder:
    """Turns text into the sparse vectors of the `lexical` leg: `document` for indexing, `query` for searching.

    `spread` (default `SPREAD`; 0 writes the plain BM25 weights of an index from before it) scales a document's
    weights by its point id, and `unspread` takes that back out of a score.
    """

    def __init__(self, avg_len: float = AVG_MINUTE_TOKENS, language: str = LANGUAGE, spread: float = SPREAD) -> None:
        try:
            import qdrant_edge
        except ImportError as exc:
            raise ServerExtraMissing("qdrant_edge", "the lexical vectors (BM25)") from exc
        if not 0.0 <= spread < 0.1:
            raise ValueError(f"spread must be at least 0 and below 0.1 (a share of a score), got {spread!r}")
        self._bm25 = qdrant_edge.Bm25(qdrant_edge.Bm25Config(language=language, avg_len=avg_len))
        self.spread = spread

    def document(self, text: str, point: uuid.UUID | None = None) -> qdrant_edge.SparseVector:
        """The vector a minute is indexed with (term-frequency weights), spread by its `point` id."""
        vector = self._bm25.embed_document(text)
        if point is None or not self.spread or not vector.indices:
            return vector
        scale = self._scale(point)
        return type(vector)(indices=vector.indices, values=[v * scale for v in vector.values])

    def query(self, text: str) -> qdrant_edge.SparseVector:
        """The vector a search sends (weight 1 per distinct stem); empty when the text holds only stopwords."""
        return self._bm25.embed_query(text)

    def unspread(self, score: float, point: Any) -> float:
        """A lexical score of the point with id `point` (a UUID or its string), its spread taken out, to 5
        significant digits: the float32 rounding of the engine's sum goes with them, so equal texts score equal."""
        if not self.spread:
            return float(score)
        pid = point if isinstance(point, uuid.UUID) else uuid.UUID(str(point))
        return float(f"{score / self._scale(pid):.5g}")

    def _scale(self, point: uuid.UUID) -> float:
        """1 + spread for the lowest point id, falling to 1 for the highest."""
        return 1.0 + self.spread * (1.0 - point.int / _IDS)
