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

from typing import TYPE_CHECKING

from pvm.extras import ServerExtraMissing

if TYPE_CHECKING:
    import qdrant_edge

# Coordination minutes are short; BM25's default expected length (256 tokens,
# written for web pages) would make every minute look "short" and flatten the
# length normalization.
AVG_MINUTE_TOKENS = 48.0
LANGUAGE = "english"  # the stopword list and the Snowball stemmer


class LexicalEncoder:
    """Turns text into the sparse vectors of the `lexical` leg: `document` for indexing, `query` for searching."""

    def __init__(self, avg_len: float = AVG_MINUTE_TOKENS, language: str = LANGUAGE) -> None:
        try:
            import qdrant_edge
        except ImportError as exc:
            raise ServerExtraMissing("qdrant_edge", "the lexical vectors (BM25)") from exc
        self._bm25 = qdrant_edge.Bm25(qdrant_edge.Bm25Config(language=language, avg_len=avg_len))

    def document(self, text: str) -> qdrant_edge.SparseVector:
        """The vector a minute is indexed with (term-frequency weights)."""
        return self._bm25.embed_document(text)

    def query(self, text: str) -> qdrant_edge.SparseVector:
        """The vector a search sends (weight 1 per distinct stem); empty when the text holds only stopwords."""
        return self._bm25.embed_query(text)
