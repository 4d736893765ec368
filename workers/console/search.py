"""The console's search page: the API's search (`GET /v1/projects/{p}/search`) as a form, each hit with the parts
of its score and links to its minute, fact or thread, and a lexical-only answer saying so.

The query is read exactly as the API reads it (`filters_from_query`, the same fields and bounds), so a search
here finds what an agent's search finds; without a query the page is the form alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.routing import Route

from contracts.memory import FactHit, SearchHit, SummaryHit
from pvm.search import DEFAULT_KINDS, KINDS, PREFERENCES, Hit
from workers.api import fields
from workers.api.app import filters_from_query, prefer_param
from workers.api.request import Unavailable, list_param
from workers.console.site import Page, Site, Visit

SOURCES_SHOWN = 12  # source minutes a fact or summary hit links; the rest are counted
# The parts of a score (pvm.search), in the order they make it, with what each is; any other part follows by name.
PARTS = {
    "keyword": "the lexical leg's score, 0..1 over the candidates",
    "semantic": "the dense leg's score, 0..1 over the candidates (absent: lexical only)",
    "fused": "the engine's fused relevance",
    "thread_match": "its thread's best keyword and semantic scores fused, where that beat its own",
    "recency": "0.5 ** (age / half-life)",
    "importance": "the stored scores without their recency",
    "slot": "1: one of its leg's own best, placed above the rest",
    "newness": "its place between the oldest and newest candidate, when recency leads",
    "thread": "lifted by a better hit of its thread nearby",
    "dense_share": "the dense leg's share of relevance for this query",
    "agreement": "how far the legs' tops agree",
    "support": "how far the words back the dense leg's top",
    "flatness": "how little the words single out",
}


@dataclass(frozen=True)
class HitRow:
    """One hit as the page shows it: its kind, score and parts, what it says, and what it links to."""

    kind: str
    score: float
    parts: dict[str, float]
    composite: float | None  # a minute's stored composite score (`Scores.composite`), when it has one
    title: str
    detail: str
    ref: str  # the minute, fact or summary id
    sources: tuple[str, ...]  # a fact's or summary's source minutes (at most SOURCES_SHOWN)
    more_sources: int
    thread: str  # a summary's thread; a minute's thread id


def hit_row(hit: Hit) -> HitRow:
    """A hit of any kind as a row."""
    if isinstance(hit, SearchHit):
        minute = hit.minute
        who = f"{minute.get('agent_id')}: " if minute.get("agent_id") else ""
        return HitRow(
            kind="minute",
            score=hit.score,
            parts=dict(hit.parts),
            composite=hit.scores.composite if hit.scores else None,
            title=f"{who}{minute.get('memory_note') or minute.get('event_type', '')}",
            detail=f"{minute.get('event_type', '')} · {hit.category}",
            ref=hit.minute_id,
            sources=(),
            more_sources=0,
            thread=str(minute.get("thread_id") or ""),
        )
    sources = hit.sources
    if isinstance(hit, FactHit):
        fact = hit.fact
        title = str(fact.get("text") or "")
        detail = f"{fact.get('type', 'fact')} · {fact.get('status', '')} · {fact.get('tier_key', '')}"
        ref, thread = hit.fact_id, ""
    else:
        assert isinstance(hit, SummaryHit)
        title, detail, ref, thread = hit.text, f"{hit.of} summary", hit.summary_id, hit.thread
    return HitRow(
        kind=hit.kind,
        score=hit.score,
        parts=dict(hit.parts),
        composite=None,
        title=title,
        detail=detail,
        ref=ref,
        sources=sources[:SOURCES_SHOWN],
        more_sources=max(0, len(sources) - SOURCES_SHOWN),
        thread=thread,
    )


def part_names(rows: list[HitRow]) -> list[str]:
    """Every score part the hits carry, as columns: the usual ones in their order, then the rest by name."""
    seen = {name for row in rows for name in row.parts}
    return [p for p in PARTS if p in seen] + sorted(seen - set(PARTS))


def form_values(visit: Visit, kinds: tuple[str, ...]) -> dict[str, Any]:
    """The form's fields as sent, to show them again."""
    names = ("q", "k", "prefer", "task_id", "thread_id", "since_ms", "until_ms", "min_composite", "include_pruned")
    values: dict[str, Any] = {name: visit.param(name) for name in names}
    for name in ("category", "event_type", "agent"):
        values[name] = ", ".join(list_param(visit.request, name))
    values["kinds"] = kinds
    return values


def search_page(visit: Visit) -> Page:
    """The form, and with a query its hits, best first."""
    request = visit.request
    # Every parameter is checked before the query is looked at, so a bad one is named on any form.
    kinds = fields.SEARCH_KINDS.choices(request) or DEFAULT_KINDS
    k = fields.SEARCH_K.integer(request)
    filters = filters_from_query(request)
    prefer = prefer_param(visit.request)
    form = form_values(visit, kinds)
    values: dict[str, Any] = {
        "form": form,
        "all_kinds": KINDS,
        "preferences": PREFERENCES,
        "k_max": fields.SEARCH_K_MAX,
        "part_notes": PARTS,
        "result": None,
    }
    if not form["q"]:
        return Page("search.html", "Search", values)
    if visit.stores.reader.searcher is None:
        raise Unavailable("this server has no vector store configured; search is unavailable")
    result = visit.stores.reader.search_result(visit.project_id, form["q"], filters, k, prefer=prefer, kinds=kinds)
    rows = [hit_row(h) for h in result.ranked]
    values.update(result=result, rows=rows, parts=part_names(rows))
    return Page("search.html", f"Search: {form['q']}", values)


def routes(site: Site) -> list[Route]:
    return [Route("/ui/projects/{project_id}/search", site.page(search_page))]
