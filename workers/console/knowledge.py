"""The console's knowledge pages: what a project knows (by tier and type, now or as of any past instant, with its
learned keys and procedural rules), one fact with its history and the minutes behind it, and the forms that change
knowledge (assert, promote, retract, learn).

Reads ask the API's own facts handlers (`workers.api.fact_routes.FactRoutes`) with the page's filters as their
query, so the console and ``GET /v1/projects/{p}/facts`` agree on what held when, and refuse the same things in the
same words. Changes call the API's change handlers with the JSON body the API takes: each is a knowledge-change
minute on the shard streams like any other change, and shows once the facts pool has applied it (a moment later).
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from contracts.fact_changes import LEARNED_SUBJECT
from contracts.facts import FACT_ID_PATTERN, GLOBAL_KEY, FactStatus, FactType, Tier, TierKey
from contracts.minute import ID_PATTERN, MAX_ID_LENGTH
from pvm.stores.fact_projection import StoredFact, order_key_ms
from workers.api.auth import TokenScope
from workers.api.request import BadRequest, NotFound
from workers.console.site import Page, Site, Visit

FACT_TYPES = tuple(t.value for t in FactType)
TIERS = tuple(t.value for t in Tier)
STATUSES = tuple(s.value for s in FactStatus)
# What the knowledge page lists unless asked otherwise: what PVM holds as true, and what waits for someone to
# promote or retract it.
SHOWN_STATUSES = (FactStatus.PROMOTED.value, FactStatus.PENDING.value)
PAGE_SIZE = 100  # facts a knowledge page lists unless `limit` says otherwise (the API allows up to 1000)
RULES_SHOWN = 100  # procedural rules (highest priority first) and learned keys a page lists
HISTORY_SHOWN = 200  # values of a slot the fact page lists, newest last
# The confirmations a change redirects with (?done=...), and what each says.
DONE = {
    "asserted": "Asserted",
    "learned": "Learned",
    "promoted": "Promoted",
    "retracted": "Retracted",
}
TIER_TITLES = {
    Tier.TASK.value: "Task tier",
    Tier.PROJECT.value: "Project tier",
    Tier.GLOBAL.value: "Global tier (every project of this deployment)",
}


# -- what the pages show -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Filters:
    """The knowledge page's query: which tiers, types and statuses, as of when, and which page."""

    as_of: str  # '' for now; else ISO 8601 with an offset (a time typed without one is read as UTC)
    task: str
    tier: str  # '' for every tier the token sees
    type: str
    subject: str
    statuses: tuple[str, ...]
    limit: str
    offset: str

    @classmethod
    def of(cls, visit: Visit) -> Filters:
        statuses = tuple(
            dict.fromkeys(s for raw in visit.request.query_params.getlist("status") for s in raw.split(",") if s)
        )
        return cls(
            as_of=_instant(visit.param("as_of")),
            task=visit.param("task"),
            tier=visit.param("tier"),
            type=visit.param("type"),
            subject=visit.param("subject"),
            statuses=statuses or SHOWN_STATUSES,
            limit=visit.param("limit", str(PAGE_SIZE)),
            offset=visit.param("offset", "0"),
        )

    def tiers(self, visit: Visit) -> tuple[str, ...]:
        """The tiers listed: the one asked for, else the task's (with a task), the project's and, when the token
        grants it, the global tier."""
        if self.tier:
            return (self.tier,)
        return (
            ((Tier.TASK.value,) if self.task else ())
            + (Tier.PROJECT.value,)
            + ((Tier.GLOBAL.value,) if visit.scope.allows_global else ())
        )

    def kept(self, **changed: Any) -> dict[str, Any]:
        """The filters as query parameters (for the pager's links), with `changed` ones replaced."""
        params: dict[str, Any] = {
            "as_of": self.as_of,
            "task": self.task,
            "tier": self.tier,
            "type": self.type,
            "subject": self.subject,
            "status": list(self.statuses) if self.statuses != SHOWN_STATUSES else (),
            "limit": self.limit if self.limit != str(PAGE_SIZE) else "",
        }
        params.update(changed)
        return params


@dataclass(frozen=True)
class TierFacts:
    """One tier's facts on a page, grouped by type (in the order of `FactType`; types with none left out)."""

    tier: str
    key: str  # the tier key: task:<p>:<task>, project:<p> or global
    title: str
    by_type: list[tuple[str, list[dict[str, Any]]]]

    @property
    def count(self) -> int:
        return sum(len(facts) for _, facts in self.by_type)


@dataclass(frozen=True)
class Change:
    """A minute behind a fact as the store keeps it: the one that made it, or the newest that set some fields."""

    minute_id: str
    at_ms: int
    made: bool  # the minute that first wrote the fact (asserted, learned or promoted it one tier up)
    fields: tuple[str, ...]  # the fields whose current value this minute set (empty for `made`)


@dataclass(frozen=True)
class HistoryEntry:
    """One value of the fact's slot, with the minutes behind it."""

    fact: dict[str, Any]
    changes: list[Change]
    promoted_at: str | None


@dataclass(frozen=True)
class Problem:
    """Why a change from a form was refused: which form, the API's message and (when it names one) the field."""

    form: str
    message: str
    status: int
    field: str | None = None


@dataclass(frozen=True)
class Done:
    """The confirmation a page shows after a change: what was done, the minute that records it, the fact."""

    verb: str
    minute_id: str | None
    fact_id: str | None = None

    @classmethod
    def of(cls, visit: Visit) -> Done | None:
        verb = DONE.get(visit.param("done"))
        if verb is None:
            return None
        return cls(verb, _minute_id(visit.param("minute")), _fact_id(visit.param("fact")))


# -- pages --------------------------------------------------------------------------------------------------------


def knowledge_page(visit: Visit) -> Page:
    """What the project knows now, or as of a past instant: by tier and type, its learned keys and its rules."""
    return _knowledge(visit)


def _knowledge(visit: Visit, problem: Problem | None = None, given: dict[str, str] | None = None) -> Page:
    facts = visit.stores.facts
    filters = Filters.of(visit)
    tiers = filters.tiers(visit)
    common = {"tier": ",".join(tiers), "task": filters.task, "as_of": filters.as_of}
    listing = facts.list_facts(
        _asking(
            visit.request,
            **common,
            type=filters.type,
            subject=filters.subject,
            status=",".join(filters.statuses),
            limit=filters.limit,
            offset=filters.offset,
        ),
        b"",
        visit.scope,
    )
    learned = facts.list_facts(
        _asking(visit.request, **common, subject=LEARNED_SUBJECT, limit=str(RULES_SHOWN)), b"", visit.scope
    )["facts"]
    tier_keys = [_tier_key(visit.project_id, tier, filters.task) for tier in tiers]
    rules = facts.store.procedural_rules(tier_keys, as_of=filters.as_of or None)[:RULES_SHOWN]
    # Learned keys have a section of their own: the types' tables leave them out.
    listed = [f for f in listing["facts"] if f["subject"] != LEARNED_SUBJECT]
    by_tier = [
        TierFacts(tier, str(key), TIER_TITLES[tier], _by_type(f for f in listed if f["tier_key"] == str(key)))
        for tier, key in zip(tiers, tier_keys, strict=True)
    ]
    return Page(
        "knowledge.html",
        "Knowledge",
        {
            "filters": filters,
            "tiers": by_tier,
            "learned": learned,
            "rules": rules,
            "next_offset": listing["next_offset"],
            "fact_types": FACT_TYPES,
            "statuses": STATUSES,
            "all_tiers": TIERS if visit.scope.allows_global else TIERS[:2],
            "allows_global": visit.scope.allows_global,
            "done": Done.of(visit),
            "problem": problem,
            "given": given or {},
            "page_size": PAGE_SIZE,
        },
        status=200 if problem is None else problem.status,
    )


def fact_page(visit: Visit) -> Page:
    """One fact with the history of its slot and the minutes behind each value."""
    return _fact(visit)


def _fact(visit: Visit, problem: Problem | None = None) -> Page:
    facts = visit.stores.facts
    shown = facts.show(visit.request, b"", visit.scope)
    history = facts.history(visit.request, b"", visit.scope)["facts"]
    tier_key = TierKey.parse(shown["tier_key"])
    kept = history[-HISTORY_SHOWN:]
    stored = facts.store.stored(tier_key, [f["id"] for f in kept])
    entries = [HistoryEntry(f, _changes(stored.get(f["id"])), _promoted_at(stored.get(f["id"]))) for f in kept]
    parent = tier_key.parent
    promotable_to = (
        parent.tier.value
        if parent is not None
        and shown["status"] in (FactStatus.PENDING.value, FactStatus.PROMOTED.value)
        and (parent.tier is not Tier.GLOBAL or visit.scope.allows_global)
        else None
    )
    done = Done.of(visit)
    return Page(
        "fact.html",
        f"Fact: {shown['subject']} / {shown['attribute']}",
        {
            "fact": shown,
            "history": entries,
            "history_total": len(history),
            "promotable_to": promotable_to,
            "done": done,
            "problem": problem,
        },
        status=200 if problem is None else problem.status,
    )


# -- changes: each through the API's own handler, so each is a minute in the log -----------------------------------


def assert_action(visit: Visit) -> Page | Response:
    """Assert a fact by hand (the API's ``POST /v1/projects/{p}/facts``)."""
    form = visit.form
    body: dict[str, Any] = _filled(
        form,
        ("subject", "attribute", "value", "type", "tier", "task_id", "status", "text", "agent_id"),
    )
    for name in ("valid_from", "valid_until"):
        if form.get(name, "").strip():
            body[name] = _instant(form[name].strip())
    if form.get("confidence", "").strip():
        body["confidence"] = _number(form["confidence"].strip())
    try:
        answer = _answer(visit.stores.facts.assert_fact(visit.request, _json(body), visit.scope))
    except BadRequest as exc:
        return _knowledge(visit, _problem("assert", exc), dict(form))
    return _back(visit, "knowledge", "asserted", answer)


def learn_action(visit: Visit) -> Page | Response:
    """Learn a key's value (the API's ``POST /v1/projects/{p}/learn``)."""
    body = _filled(visit.form, ("key", "value", "tier", "task_id", "agent_id"))
    try:
        answer = _answer(visit.stores.facts.learn(visit.request, _json(body), visit.scope))
    except BadRequest as exc:
        return _knowledge(visit, _problem("learn", exc), dict(visit.form))
    return _back(visit, "knowledge", "learned", answer)


def promote_action(visit: Visit) -> Page | Response:
    """Promote a pending fact in place, or copy a current one a tier up (``POST …/facts/{id}/promote``)."""
    return _fact_change(visit, visit.stores.facts.promote, ("to_tier",), "promote", "promoted")


def retract_action(visit: Visit) -> Page | Response:
    """Retract a fact, with an optional reason (``POST …/facts/{id}/retract``)."""
    return _fact_change(visit, visit.stores.facts.retract, ("reason",), "retract", "retracted")


def _fact_change(
    visit: Visit,
    handler: Callable[[Request, bytes, TokenScope], Any],
    fields: tuple[str, ...],
    form: str,
    done: str,
) -> Page | Response:
    """A change to one fact through the API's `handler`: back to the fact page with the change's minute, or the
    fact page again with the API's refusal at its buttons (an unknown fact stays a 404 page)."""
    try:
        answer = _answer(handler(visit.request, _json(_filled(visit.form, fields)), visit.scope))
    except NotFound:
        raise
    except BadRequest as exc:
        return _fact(visit, _problem(form, exc))
    return _back(visit, f"facts/{visit.request.path_params['fact_id']}", done, answer)


def routes(site: Site) -> list[Route]:
    base = "/ui/projects/{project_id}"
    return [
        Route(f"{base}/knowledge", site.page(knowledge_page)),
        Route(f"{base}/facts", site.action(assert_action), methods=["POST"]),
        Route(f"{base}/learn", site.action(learn_action), methods=["POST"]),
        Route(f"{base}/facts/{{fact_id}}", site.page(fact_page)),
        Route(f"{base}/facts/{{fact_id}}/promote", site.action(promote_action), methods=["POST"]),
        Route(f"{base}/facts/{{fact_id}}/retract", site.action(retract_action), methods=["POST"]),
    ]


# -- how the pages talk to the API's handlers -----------------------------------------------------------------------


def _asking(request: Request, **query: str) -> Request:
    """`request` as an API handler reads it, with `query` (the parameters that are set) as its query string."""
    scope = dict(request.scope)
    scope["query_string"] = urllib.parse.urlencode({k: v for k, v in query.items() if v}).encode()
    return Request(scope)


def _filled(form: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """The form's fields among `names` that were filled in, stripped: an empty field is left out, so the API's
    default applies."""
    return {name: form[name].strip() for name in names if form.get(name, "").strip()}


def _json(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


def _answer(response: Any) -> dict[str, Any]:
    """The JSON a change handler answered (a 202 JSONResponse)."""
    if isinstance(response, JSONResponse):
        return dict(json.loads(bytes(response.body)))
    return dict(response)


def _back(visit: Visit, page: str, done: str, answer: dict[str, Any]) -> RedirectResponse:
    """Post/redirect/get: back to the page, saying what was done and which minute records it."""
    params = {"done": done, "minute": answer.get("minute_id") or "", "fact": answer.get("fact_id") or ""}
    target = f"/ui/projects/{visit.project_id}/{page}?" + urllib.parse.urlencode({k: v for k, v in params.items() if v})
    return RedirectResponse(target, status_code=303)


def _problem(form: str, exc: BadRequest) -> Problem:
    return Problem(form, str(exc), exc.status, getattr(exc, "field", None))


# -- reading the form and the query --------------------------------------------------------------------------------


def _instant(raw: str) -> str:
    """An instant typed into a form as the API takes it: ISO 8601 with an offset. A time without one (what a
    browser's datetime-local input sends) is read as UTC; anything else goes as typed, for the API to refuse by
    name."""
    if not raw:
        return raw
    try:
        parsed = datetime.fromisoformat(raw)
    except ValueError:
        return raw
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC).isoformat().replace("+00:00", "Z")
    return raw


def _number(raw: str) -> float | str:
    """A number typed into a form; text that is none goes as typed, for the API to refuse by name."""
    try:
        return float(raw)
    except ValueError:
        return raw


def _minute_id(raw: str) -> str | None:
    return raw if raw and len(raw) <= MAX_ID_LENGTH and ID_PATTERN.fullmatch(raw) else None


def _fact_id(raw: str) -> str | None:
    return raw if FACT_ID_PATTERN.fullmatch(raw) else None


def _tier_key(project_id: str, tier: str, task: str) -> TierKey:
    if tier == Tier.TASK.value:
        return TierKey.for_task(project_id, task)
    return GLOBAL_KEY if tier == Tier.GLOBAL.value else TierKey.for_project(project_id)


def _by_type(facts: Any) -> list[tuple[str, list[dict[str, Any]]]]:
    grouped: dict[str, list[dict[str, Any]]] = {t: [] for t in FACT_TYPES}
    for fact in facts:
        grouped[fact["type"]].append(fact)
    return [(t, grouped[t]) for t in FACT_TYPES if grouped[t]]


def _changes(stored: StoredFact | None) -> list[Change]:
    """The minutes behind a stored fact: the one that made it, then the newest to set each of its other fields
    (the store keeps the last writer of each field; the log keeps every minute)."""
    if stored is None:
        return []
    made = stored.created
    by_minute: dict[str, list[str]] = {}
    for name, key in stored.versions.items():
        if key != made:
            by_minute.setdefault(key, []).append(name)
    changes = [Change(_minute_of(made), order_key_ms(made), True, ())]
    changes += [Change(_minute_of(k), order_key_ms(k), False, tuple(sorted(by_minute[k]))) for k in sorted(by_minute)]
    return changes


def _minute_of(order_key: str) -> str:
    return order_key.partition("|")[2]


def _promoted_at(stored: StoredFact | None) -> str | None:
    return None if stored is None else stored.promoted_at
