"""The facts routes of the reader API: read a project's long-term memory, and change it only by writing minutes.

Reads go to the facts store (`pvm.stores.facts`, the current view in Redis) or,
with ``q``, to hybrid search over the fact points (``kind=fact``). Every change
(assert by hand, promote, retract, learn) is a knowledge-change minute built by
the contract's builders (`contracts.fact_changes`) and appended to the shard
streams by the same script as ``POST /v1/minutes``: the API never writes the
store. The facts pool applies the minute once the log has made it durable, so
a change answers 202 and shows in the reads a moment later; `pvm replay`
rebuilds it like any other.

Tenancy: every route names its project in the path (checked, with the token's
projects, before a handler runs). A project's task and project tiers are its
own; the global tier, shared by every project of the deployment, is read and
written only with a token that grants it (`TokenScope.allows_global`):
naming it without the grant is 403, and reads that were not told to look there
never do.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, NoReturn

from starlette.requests import Request
from starlette.responses import JSONResponse

from contracts import Minute, new_minute_id
from contracts.errors import ContractError, InvalidFact
from contracts.fact_changes import (
    FactRetracted,
    PromotionReason,
    asserted_minute,
    change_minute,
    contradicted_minute,
    learned_minute,
    promoted_minute,
    retracted_minute,
    superseded_minute,
    tier_promoted_minute,
)
from contracts.facts import (
    FACT_ID_PATTERN,
    GLOBAL_KEY,
    MAX_FACT_TEXT,
    MAX_FACT_VALUE,
    MAX_RELATIONSHIPS,
    MAX_TAG_LENGTH,
    MAX_TAGS,
    Fact,
    FactStatus,
    FactType,
    RelationKind,
    Relationship,
    Slot,
    Tier,
    TierKey,
    check_time,
    normalize_text,
)
from contracts.ids import RequestIds
from contracts.memory import FactHit, SearchFilters
from contracts.minute import MAX_NAME_LENGTH, iso_from_ms, utc_now_iso
from pvm import defaults
from pvm.search import HybridSearch
from pvm.stores.facts import FactStore
from workers.api.auth import TokenScope
from workers.api.fields import (
    AGENT_ID,
    BLANK,
    BOOLEAN,
    NON_BLANK,
    STRING,
    TASK_ID,
    Body,
    Field,
    Value,
    body_field,
    choices,
    integer,
    path_param,
    query_param,
)
from workers.api.request import (
    BadRequest,
    Conflict,
    Forbidden,
    InvalidField,
    NotFound,
    Unavailable,
    agent_field,
    minute_id_field,
)
from workers.rules.fact_timeline import fit, on_promotion, place
from workers.runtime.clock import ChangeClock

FACT_TYPES = tuple(t.value for t in FactType)
TIERS = tuple(t.value for t in Tier)
STATUSES = tuple(s.value for s in FactStatus)
# What a list shows unless asked otherwise: current knowledge.
DEFAULT_STATUSES = (FactStatus.PROMOTED.value,)
# Pending and promoted facts are listed as of a time (they must hold then); superseded and retracted ones by what
# became of them (`current` reads them that way too).
LIVE_STATUSES = (FactStatus.PENDING.value, FactStatus.PROMOTED.value)
SEARCH_MAX = defaults.API_FACTS_SEARCH_MAX
LEASE_WAIT_S = defaults.API_FACTS_LEASE_WAIT_S
# A change's further minutes (the values it supersedes or contradicts) get ids derived from its first under this
# name: a retry with the same minute_id makes the same minutes with the same ids, and the log keeps each once.
FOLLOWING_KIND = "fact-change"

# -- the fields each route reads (workers/api/openapi.py describes the routes from these) ------------------------------

# A name the contract takes as a slot's subject or attribute (and a learned key): non-blank, at most MAX_NAME_LENGTH.
_NAME = Value("string", min_length=1, max_length=MAX_NAME_LENGTH, pattern=NON_BLANK)
_FACT_TEXT = Value("string", min_length=1, max_length=MAX_FACT_TEXT, pattern=NON_BLANK)
_FACT_VALUE = Value(
    one_of=(
        Value("string", min_length=1, max_length=MAX_FACT_VALUE, pattern=NON_BLANK),
        Value("number"),
        Value("boolean"),
    ),
    description="text, a number or a boolean",
)
_UNIT = Value("number", minimum=0, maximum=1)

TIER = query_param(
    "tier",
    choices(TIERS),
    "tiers (repeat or comma-separate); default: the task's (with task) and the project's. global needs a token that "
    "grants it",
)
TASK = query_param("task", TASK_ID, "a task id: its tier is read (with tier=task, required)")
TYPE = query_param("type", choices(FACT_TYPES), "fact types (repeat or comma-separate)")
STATUS = query_param("status", choices(STATUSES), "statuses (default: promoted)")
SUBJECT = query_param("subject", STRING, "one subject (compared normalized)")
ATTRIBUTE = query_param("attribute", STRING, "one attribute (compared normalized)")
SEARCH = query_param("q", STRING, "hybrid search over the facts (kind=fact points), best first")
AS_OF = query_param("as_of", Value(ref="FactTime"), "what held then and PVM had recorded by then")
LIMIT = query_param("limit", integer(1, defaults.API_FACTS_MAX, defaults.API_FACTS_LIMIT), "page size")
OFFSET = query_param("offset", integer(0, defaults.API_FACTS_MAX_OFFSET, 0), "facts skipped")
LIST_PARAMS = (TIER, TASK, TYPE, STATUS, SUBJECT, ATTRIBUTE, SEARCH, AS_OF, LIMIT, OFFSET)

FACT_ID = path_param(
    "fact_id",
    Value(ref="FactId"),
    "a fact of the project (task or project tier), or of the global tier with a token that grants it",
    "26715822-4642-5d0d-8e8d-756d5f3d703a",
)
RECALL_TIER = query_param(
    "tier",
    choices(TIERS),
    "look only in these tiers (task needs the task parameter: 400 without it; global needs the grant)",
)
RECALL_TASK = query_param("task", TASK_ID, "a task id: its tier is looked in first")
KEY = query_param("key", _NAME, "the learned key", "deploy window")
# In the path a key is one segment: a key with / is recalled by ?key=.
KEY_IN_PATH = path_param("key", replace(_NAME, pattern=f"^[^/]*[^/{BLANK}][^/]*$"), "the learned key", "oncall")
RECALL_PARAMS = (KEY, RECALL_TIER, RECALL_TASK)
RECALL_PATH_PARAMS = (KEY_IN_PATH, RECALL_TIER, RECALL_TASK)

_AGENT_AND_ID = (
    # `agent_field` refuses an empty one: a change names its agent or leaves it out.
    body_field("agent_id", replace(AGENT_ID, min_length=1), "who makes the change (the minute's agent_id)"),
    body_field(
        "minute_id",
        Value(ref="MinuteId"),
        "the change minute's id: set it to make a retry idempotent (default: a new id)",
    ),
)
_FACT_TYPE = body_field("type", Value(enum=FACT_TYPES, default=FactType.FACT.value))
ASSERT_BODY = Body(
    (
        body_field("subject", _NAME, "what the fact is about (service:auth)", required=True),
        body_field("attribute", _NAME, "which property of it (session_ttl)", required=True),
        body_field("value", _FACT_VALUE, required=True),
        _FACT_TYPE,
        body_field("text", _FACT_TEXT, "the fact as a sentence (default: subject attribute: value)"),
        body_field(
            "tier",
            Value(enum=(Tier.TASK.value, Tier.PROJECT.value)),
            "default: task with task_id, else project. The global tier is written only by promotion or learn",
        ),
        body_field("task_id", TASK_ID),
        body_field("confidence", replace(_UNIT, default=1.0)),
        body_field("importance", _UNIT, "default: by type"),
        body_field("status", Value(enum=LIVE_STATUSES, default=FactStatus.PROMOTED.value)),
        body_field("valid_from", Value(ref="FactTime"), "when it starts to hold (default: now)"),
        body_field("valid_until", Value(ref="FactTime"), "when it stops holding (default: open)"),
        body_field(
            "tags",
            Value("array", items=replace(_NAME, max_length=MAX_TAG_LENGTH), max_items=MAX_TAGS),
            "tags",
        ),
        body_field(
            "single_valued",
            BOOLEAN,
            "one value at a time in the slot (default: by type and attribute): a newer value supersedes the older",
        ),
        *_AGENT_AND_ID,
    ),
    "the fact",
)
PROMOTE_BODY = Body(
    (
        body_field(
            "to_tier",
            Value(enum=(Tier.PROJECT.value, Tier.GLOBAL.value)),
            "copy the fact one tier up (task -> project -> global) with a new id; left out: promote a pending fact "
            "in place",
        ),
        *_AGENT_AND_ID,
    ),
    "what to promote to (empty: in place)",
    required=False,
)
RETRACT_BODY = Body((body_field("reason", _FACT_TEXT, "why"), *_AGENT_AND_ID), "why (optional)", required=False)
LEARN_BODY = Body(
    (
        body_field("key", _NAME, "the key (the slot learned / key)", required=True),
        body_field("value", _FACT_VALUE, required=True),
        body_field(
            "tier",
            Value(enum=TIERS),
            "default: task with task_id, else project; global needs a token that grants it",
        ),
        body_field("task_id", TASK_ID),
        _FACT_TYPE,
        body_field("text", _FACT_TEXT, "default: key = value"),
        *_AGENT_AND_ID,
    ),
    "the key and its value",
)

GLOBAL_GRANT = (
    'the global tier needs a token that grants it ("global": true in PVM_API_TOKENS_FILE: pvm token new --global)'
)


def global_refused(verb: str) -> str:
    """The 403 message for the global tier."""
    return f"this token may not {verb} the global tier: {GLOBAL_GRANT}"


Write = Callable[[Sequence[Minute]], list[str]]


@dataclass(frozen=True)
class FactRoutes:
    """The handlers of the facts routes, over one facts store, a searcher (for ``q``) and the streams' writer.

    Each handler takes the request, its body and the token's scope (the project in the path is already
    checked against it) and returns the JSON answer, or a JSONResponse for a 202.
    """

    store: FactStore
    searcher: object | None
    write: Write

    # -- reads ------------------------------------------------------------------------------------------------

    def list_facts(self, request: Request, body: bytes, scope: TokenScope) -> Any:
        """``GET /v1/projects/{p}/facts``: the facts of the tiers asked for, filtered, a page at a time."""
        project_id = request.path_params["project_id"]
        task = _task_param(request, TASK)
        tiers = TIER.choices(request) or ((Tier.TASK.value,) if task else ()) + (Tier.PROJECT.value,)
        tier_keys = _tier_keys(project_id, tiers, task, scope, "read")
        types = TYPE.choices(request) or None
        statuses = STATUS.choices(request) or DEFAULT_STATUSES
        as_of = _as_of(request)
        subject, attribute = _normalized(request, SUBJECT), _normalized(request, ATTRIBUTE)
        limit = LIMIT.integer(request)
        offset = OFFSET.integer(request)
        query = SEARCH.text(request)
        degraded = None
        if query is not None:
            found, degraded, more = self._search(project_id, query, task, tiers, types, statuses, as_of, offset + limit)
        else:
            found = self._current(tier_keys, types, statuses, as_of)
            more = False
        kept = [f for f in found if _matches(f, subject, attribute)]
        page = kept[offset : offset + limit]
        more = more or len(kept) > offset + limit
        return {
            "facts": [f.to_dict() for f in page],
            "next_offset": offset + limit if more else None,
            "degraded": degraded,
        }

    def _current(
        self, tier_keys: list[TierKey], types: tuple[str, ...] | None, statuses: tuple[str, ...], as_of: str | None
    ) -> list[Fact]:
        if as_of is not None:
            return self.store.current(tier_keys, types, statuses, as_of)
        live = [s for s in statuses if s in LIVE_STATUSES]
        facts = self.store.current(tier_keys, types, live) if live else []
        ended = {FactStatus(s) for s in statuses if s not in LIVE_STATUSES}
        if ended:
            # Superseded and retracted facts no longer hold now: listed by their status, newest first.
            for tier_key in tier_keys:
                held = self.store.in_tier(tier_key) if types is None else _of_types(self.store, tier_key, types)
                facts += sorted((f for f in held if f.status in ended), key=_newest_first)
        return facts

    def _search(
        self,
        project_id: str,
        query: str,
        task: str | None,
        tiers: tuple[str, ...],
        types: tuple[str, ...] | None,
        statuses: tuple[str, ...],
        as_of: str | None,
        wanted: int,
    ) -> tuple[list[Fact], str | None, bool]:
        """Hybrid search over the fact points: the facts best first, why it is lexical-only (or None), and more?

        A task's facts carry its task id, which the other tiers' lack: the task tier is searched on its own
        (filtered by the task) and the other tiers together, and the hits merged by score.
        """
        if not isinstance(self.searcher, HybridSearch):
            raise Unavailable("this server has no vector store configured; searching facts (q) is unavailable")
        k = min(wanted, SEARCH_MAX)
        others = tuple(t for t in tiers if t != Tier.TASK.value)
        legs: list[tuple[tuple[str, ...], str | None]] = [(others, None)] if others else []
        if Tier.TASK.value in tiers:
            legs.append(((Tier.TASK.value,), task))
        hits: list[FactHit] = []
        degraded = None
        more = False
        for leg_tiers, leg_task in legs:
            result = self.searcher.search_result(
                project_id,
                query,
                SearchFilters(task_id=leg_task),
                k,
                kinds=("fact",),
                fact_types=types or (),
                tiers=leg_tiers,
                statuses=statuses,
                as_of=as_of,
            )
            hits += result.facts
            degraded = degraded or result.degraded
            more = more or (len(result.facts) >= k and k < SEARCH_MAX)
        hits.sort(key=lambda h: (-h.score, h.fact_id))
        return [Fact.from_dict(hit.fact) for hit in hits[:k]], degraded, more or len(hits) > k

    def show(self, request: Request, body: bytes, scope: TokenScope) -> Any:
        """``GET /v1/projects/{p}/facts/{id}``: one fact, any status."""
        return self._find(request, scope).to_dict()

    def history(self, request: Request, body: bytes, scope: TokenScope) -> Any:
        """``GET /v1/projects/{p}/facts/{id}/history``: the history of the fact's slot, oldest valid_from first."""
        fact = self._find(request, scope)
        return {"facts": [f.to_dict() for f in self.store.history(fact.tier_key, fact.id)]}

    def recall(self, request: Request, body: bytes, scope: TokenScope) -> Any:
        """``GET /v1/projects/{p}/recall/{key}``: a learned key's value, task tier first, then project, then global.

        The global tier is searched when the token grants it (or only it, with ``tier=global``).
        """
        project_id = request.path_params["project_id"]
        key = KEY_IN_PATH.text(request) or KEY.text(request)
        if not key:
            raise BadRequest("the learned key to recall is required: GET .../recall/{key} (or .../recall?key=...)")
        task = _task_param(request, RECALL_TASK)
        asked = RECALL_TIER.choices(request)
        if asked:
            searched = _tier_keys(project_id, asked, task, scope, "read")
        else:
            searched = [TierKey.for_task(project_id, task)] if task else []
            searched.append(TierKey.for_project(project_id))
            if scope.allows_global:
                searched.append(GLOBAL_KEY)
        for tier_key in searched:
            try:
                fact = self.store.recall(tier_key, key)
            except InvalidFact as exc:
                raise BadRequest(f"query parameter key: {exc.problem}") from None
            if fact is not None and fact.status is not FactStatus.RETRACTED:  # a retracted value is forgotten
                return {"key": key, "fact": fact.to_dict(), "searched": [str(t) for t in searched]}
        return {"key": key, "fact": None, "searched": [str(t) for t in searched]}

    def _find(self, request: Request, scope: TokenScope) -> Fact:
        """The fact in the path: the project's own (task or project tier), else, with the grant, a global one."""
        project_id = request.path_params["project_id"]
        fact_id = FACT_ID.raw(request) or ""
        if not FACT_ID_PATTERN.fullmatch(fact_id):
            raise BadRequest(f"path parameter fact_id {fact_id[:40]!r} is not a fact id (a lowercase version-5 UUID)")
        own = self.store.stored(TierKey.for_project(project_id), [fact_id]).get(fact_id)
        if own is not None and own.fact.project_id == project_id:
            return own.fact
        if scope.allows_global:
            shared = self.store.get(GLOBAL_KEY, fact_id)
            if shared is not None:
                return shared
        where = f"project {project_id}" + (" or the global tier" if scope.allows_global else "")
        raise NotFound(f"no fact {fact_id} in {where}")

    # -- changes: each one minute through the streams ---------------------------------------------------------

    def assert_fact(self, request: Request, body: bytes, scope: TokenScope) -> Any:
        """``POST /v1/projects/{p}/facts``: a fact asserted by hand (``fact_asserted``), in a task or the project."""
        project_id = request.path_params["project_id"]
        given = ASSERT_BODY.parse(body)
        task = _task_field(given)
        tier = _tier_field(given, task, default=Tier.TASK if task else Tier.PROJECT)
        if tier is Tier.GLOBAL:
            raise InvalidField(
                "tier",
                "the global tier is written only by promotion (POST .../facts/{fact_id}/promote with "
                '{"to_tier": "global"}) or by learning (POST .../learn)',
            )
        tier_key = _tier_key(project_id, tier, task)
        minute_id, now = _minute_id(given), utc_now_iso()  # `now`: recorded_at; the minute's own time may be later
        status = given.get("status", FactStatus.PROMOTED.value)
        if status not in ASSERT_BODY.field("status").value.enum:
            raise InvalidField("status", f"{status!r}: a fact is asserted pending or promoted")
        with _fields_named():
            fact = Fact.new(
                type=given.get("type", FactType.FACT.value),
                text=given["text"] if "text" in given else f"{given['subject']} {given['attribute']}: {given['value']}",
                subject=given["subject"],
                attribute=given["attribute"],
                value=_value(given["value"]),
                tier_key=tier_key,
                confidence=given.get("confidence", 1.0),
                source_minute_ids=(minute_id,),
                importance=given.get("importance"),
                status=status,
                valid_from=given.get("valid_from"),
                valid_until=given.get("valid_until"),
                recorded_at=now,
                tags=_tags(given.get("tags", [])),
                single_valued=given.get("single_valued"),
            )
        return self._fitted(fact, minute_id, agent_field(given))

    def promote(self, request: Request, body: bytes, scope: TokenScope) -> Any:
        """``POST …/facts/{id}/promote``: pending → promoted, or with ``to_tier`` a copy one tier up."""
        given = PROMOTE_BODY.parse(body)
        fact = self._find(request, scope)
        to_tier = given.get("to_tier")
        with _fields_named():
            if to_tier is None:
                if fact.status is not FactStatus.PENDING:
                    raise Conflict(
                        f"fact {fact.id} is {fact.status.value}: only a pending fact is promoted "
                        '(send {"to_tier": ...} to copy it one tier up)'
                    )
                return self._promoted(fact, _minute_id(given), agent_field(given))
            parent = fact.tier_key.parent
            if to_tier not in TIERS or parent is None or parent.tier.value != to_tier:
                above = f"to {parent.tier.value}" if parent is not None else "nowhere: global is the top"
                raise InvalidField("to_tier", f"{str(to_tier)[:40]!r}: a fact of {fact.tier_key} is promoted {above}")
            if parent.tier is Tier.GLOBAL and not scope.allows_global:
                raise Forbidden(global_refused("write"))
            if fact.status not in (FactStatus.PENDING, FactStatus.PROMOTED):
                raise Conflict(f"fact {fact.id} is {fact.status.value}: only a current fact is promoted to {to_tier}")
            return self._fitted(fact, _minute_id(given), agent_field(given), promoted=True)

    def retract(self, request: Request, body: bytes, scope: TokenScope) -> Any:
        """``POST …/facts/{id}/retract``: the fact is withdrawn (it stays in history)."""
        project_id = request.path_params["project_id"]
        given = RETRACT_BODY.parse(body)
        fact = self._find(request, scope)
        if fact.status is FactStatus.RETRACTED:
            raise Conflict(f"fact {fact.id} is retracted already")
        reason = given.get("reason")
        with _fields_named():
            if fact.tier is Tier.GLOBAL:
                # A change to the global tier lives in the log of the project that made it.
                minute = change_minute(
                    FactRetracted(fact.id, fact.tier_key, reason),
                    project_id=project_id,
                    agent_id=agent_field(given),
                    minute_id=_minute_id(given),
                    memory_note=f"retracted: {fact.slot} = {fact.value}" + (f" ({reason})" if reason else ""),
                )
            else:
                minute = retracted_minute(fact, reason, agent_id=agent_field(given), minute_id=_minute_id(given))
        return self._written(fact.id, minute)

    def learn(self, request: Request, body: bytes, scope: TokenScope) -> Any:
        """``POST /v1/projects/{p}/learn``: ``learn(key, value)`` into a task, the project or the global tier."""
        project_id = request.path_params["project_id"]
        given = LEARN_BODY.parse(body)
        task = _task_field(given)
        tier = _tier_field(given, task, default=Tier.TASK if task else Tier.PROJECT)
        if tier is Tier.GLOBAL and not scope.allows_global:
            raise Forbidden(global_refused("write"))
        tier_key = _tier_key(project_id, tier, task)
        with _fields_named():
            minute = learned_minute(
                given["key"] if isinstance(given["key"], str) else _not_text("key", given["key"]),
                _value(given["value"]),
                tier_key,
                type=given.get("type", FactType.FACT.value),
                text=given.get("text"),
                project_id=project_id if tier is Tier.GLOBAL else None,
                agent_id=agent_field(given),
                minute_id=_minute_id(given),
            )
        return self._written(str(minute.data["fact"]["id"]), minute)

    def _written(self, fact_id: str, minute: Minute, *more: Minute) -> JSONResponse:
        stream_ids = self.write([minute, *more])
        answer: dict[str, Any] = {"fact_id": fact_id, "minute_id": minute.id, "stream_id": stream_ids[0]}
        if more:
            answer["also"] = [{"event_type": m.event_type, "minute_id": m.id} for m in more]
        return JSONResponse(answer, status_code=202)

    def _fitted(self, fact: Fact, minute_id: str, agent_id: str | None, promoted: bool = False) -> JSONResponse:
        """Write `fact` into its key (or, `promoted`, a copy of it one tier up) and fit it into its slot's timeline.

        By the facts pool's rule (docs/facts.md, invariant 10), decided under the slot's lease like the pool:
        each single-valued value of the slot that holds when the new one starts is superseded there, the new
        one is superseded by the earliest value starting after it, and one from the same instant contradicts
        it. A value the slot holds already (at the new one's start, or later: `workers.rules.fact_timeline.place`)
        is not written again: 409, or the first answer for a retry (the same ``minute_id``); a value whose
        every period there ended by then comes back as its next period (``period``), a new fact. The change
        minutes are timed after the slot's newest change, so the store applies them in this order.
        """
        target = fact.tier_key.parent if promoted else fact.tier_key
        assert target is not None  # a promotion's target was checked by the caller
        slot = (target, fact.slot)
        owner = f"api:{uuid.uuid4().hex}"
        if not self._lease(owner, slot):
            raise Unavailable(
                f"the slot {fact.slot} of {target} stayed leased by a facts worker for {LEASE_WAIT_S} s; retry"
            )
        try:
            (view,) = self.store.slot_views([slot])
            clock = ChangeClock(view.last_ms)
            ids = RequestIds(minute_id, FOLLOWING_KIND)
            ids.next()  # the first minute's: `minute_id` itself
            when = iso_from_ms(clock.now())
            with _fields_named():
                if promoted:
                    first = tier_promoted_minute(fact, agent_id=agent_id, minute_id=minute_id, timestamp=when)
                    fresh = Fact.from_dict(first.data["fact"])
                else:
                    fresh = fact
            placing = place(view.facts, fresh)
            held = placing.restates
            if held is not None:
                if minute_id in held.source_minute_ids or (promoted and held.promoted_from == fact.id):
                    return JSONResponse({"fact_id": held.id, "minute_id": minute_id, "stream_id": None}, 202)
                raise Conflict(
                    f"the slot {fresh.slot} of {target} holds the value {fresh.value!r} already, as fact {held.id} "
                    f"({held.status.value}); promote, retract or edit that one"
                )
            if placing.period:  # the value held here before and was replaced: this is its next period
                with _fields_named():
                    if promoted:
                        first = tier_promoted_minute(
                            fact, agent_id=agent_id, minute_id=minute_id, timestamp=when, period=placing.period
                        )
                        fresh = Fact.from_dict(first.data["fact"])
                    else:
                        fresh = fresh.with_(period=placing.period)
            fitting = fit(view.facts, fresh)
            with _fields_named():
                if not promoted:
                    fresh = fresh.with_(
                        relationships=tuple(
                            Relationship(RelationKind.SUPERSEDES, f.id) for f in fitting.older[-MAX_RELATIONSHIPS:]
                        )
                    )
                    first = asserted_minute(fresh, agent_id=agent_id, minute_id=minute_id, timestamp=when)
                # A change to the global tier lives in the log of the project that made it.
                by = {"project_id": fact.project_id if target.tier is Tier.GLOBAL else None, "agent_id": agent_id}
                more = [
                    superseded_minute(old, fresh, minute_id=ids.next(), timestamp=iso_from_ms(clock.now()), **by)
                    for old in fitting.older
                ]
                if fitting.later is not None:
                    more.append(
                        superseded_minute(
                            fresh, fitting.later, minute_id=ids.next(), timestamp=iso_from_ms(clock.now()), **by
                        )
                    )
                more += [
                    contradicted_minute(fresh, other, minute_id=ids.next(), timestamp=iso_from_ms(clock.now()), **by)
                    for other in fitting.same
                ]
            return self._written(fresh.id, first, *more)
        finally:
            self.store.release_slots(owner, [slot])

    def _promoted(self, fact: Fact, minute_id: str, agent_id: str | None) -> JSONResponse:
        """Promote a pending `fact` by hand; trusted now, it supersedes the values of its slot it replaced.

        The same rule as the facts pool's (`workers.rules.fact_timeline.on_promotion`), under the slot's lease.
        """
        slot = (fact.tier_key, fact.slot)
        owner = f"api:{uuid.uuid4().hex}"
        if not self._lease(owner, slot):
            raise Unavailable(
                f"the slot {fact.slot} of {fact.tier_key} stayed leased by a facts worker for {LEASE_WAIT_S} s; retry"
            )
        try:
            (view,) = self.store.slot_views([slot])
            clock = ChangeClock(view.last_ms)
            ids = RequestIds(minute_id, FOLLOWING_KIND)
            with _fields_named():
                first = promoted_minute(
                    fact,
                    PromotionReason.BY_HAND,
                    agent_id=agent_id,
                    minute_id=ids.next(),
                    timestamp=iso_from_ms(clock.now()),
                )
                more = [
                    superseded_minute(
                        old, fact, agent_id=agent_id, minute_id=ids.next(), timestamp=iso_from_ms(clock.now())
                    )
                    for old in on_promotion(view.facts, fact)
                ]
            return self._written(fact.id, first, *more)
        finally:
            self.store.release_slots(owner, [slot])

    def _lease(self, owner: str, slot: tuple[TierKey, Slot]) -> bool:
        deadline = time.monotonic() + LEASE_WAIT_S
        while not self.store.lease_slots(owner, [slot], defaults.FACTS_SLOT_LEASE_MS)[0]:
            if time.monotonic() >= deadline:
                return False
            time.sleep(defaults.FACTS_LEASE_POLL_S)
        return True


# -- parameters and fields ------------------------------------------------------------------------------------


def _task_param(request: Request, field: Field) -> str | None:
    task = field.text(request)
    if task is not None:
        try:
            TierKey.for_task("p", task)
        except InvalidFact as exc:
            raise BadRequest(f"query parameter {field.name}: {exc.problem}") from None
    return task


def _normalized(request: Request, field: Field) -> str | None:
    raw = field.text(request)
    return normalize_text(raw) if raw else None


def _as_of(request: Request) -> str | None:
    raw = AS_OF.text(request)
    if raw is not None:
        try:
            check_time(raw, AS_OF.name)
        except InvalidFact as exc:
            raise BadRequest(f"query parameter {AS_OF.name}={raw[:40]!r}: {exc.problem}") from None
    return raw


def _tier_keys(project_id: str, tiers: Sequence[str], task: str | None, scope: TokenScope, verb: str) -> list[TierKey]:
    """The keys of the tiers named, in the order task, project, global; 400 / 403 naming what is missing."""
    keys: list[TierKey] = []
    if Tier.TASK.value in tiers:
        if task is None:
            raise BadRequest(
                "query parameter task (a task id) is required with tier=task: each task is a tier of its own"
            )
        keys.append(TierKey.for_task(project_id, task))
    if Tier.PROJECT.value in tiers:
        keys.append(TierKey.for_project(project_id))
    if Tier.GLOBAL.value in tiers:
        if not scope.allows_global:
            raise Forbidden(global_refused(verb))
        keys.append(GLOBAL_KEY)
    return keys


def _task_field(given: dict[str, Any]) -> str | None:
    task = given.get("task_id")
    if task is None:
        return None
    try:
        TierKey.for_task("p", task)
    except InvalidFact as exc:
        raise InvalidField("task_id", exc.problem) from None
    return str(task)


def _tier_field(given: dict[str, Any], task: str | None, default: Tier) -> Tier:
    raw = given.get("tier", default.value)
    if raw not in TIERS:
        raise InvalidField("tier", f"{str(raw)[:40]!r} must be one of {', '.join(TIERS)}")
    tier = Tier(raw)
    if tier is Tier.TASK and task is None:
        raise InvalidField("task_id", "is required with tier task: each task is a tier of its own")
    if tier is not Tier.TASK and task is not None:
        raise InvalidField("task_id", f"names a task, but tier is {tier.value}: leave one out")
    return tier


def _tier_key(project_id: str, tier: Tier, task: str | None) -> TierKey:
    if tier is Tier.TASK:
        return TierKey.for_task(project_id, str(task))
    return GLOBAL_KEY if tier is Tier.GLOBAL else TierKey.for_project(project_id)


def _minute_id(given: dict[str, Any]) -> str:
    """The change minute's id: the client's (a retry is then written once) or a new one."""
    chosen = minute_id_field(given)
    return new_minute_id() if chosen is None else chosen


def _value(raw: Any) -> str | int | float | bool:
    if isinstance(raw, (str, int, float, bool)):
        return raw
    return _not_text("value", raw)


def _not_text(field: str, raw: Any) -> NoReturn:
    raise InvalidField(field, f"must be text, a number or a boolean, got {type(raw).__name__}")


def _tags(raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, list):
        raise InvalidField("tags", f"must be a list of text, got {type(raw).__name__}")
    return tuple(raw)


def _matches(fact: Fact, subject: str | None, attribute: str | None) -> bool:
    return (subject is None or fact.slot.subject == subject) and (attribute is None or fact.slot.attribute == attribute)


def _newest_first(fact: Fact) -> tuple[float, str]:
    return (-check_time(fact.valid_from, "valid_from").timestamp(), fact.id)


def _of_types(store: FactStore, tier_key: TierKey, types: Sequence[str]) -> list[Fact]:
    return [f for t in types for f in store.by_type(tier_key, t)]


@contextmanager
def _fields_named() -> Iterator[None]:
    """Turns the contract's refusals (`InvalidFact`, `InvalidMinute`) into 422s naming the body field."""
    try:
        yield
    except ContractError as exc:
        field = getattr(exc, "field", "") or "body"
        raise InvalidField(_body_field(field), getattr(exc, "problem", str(exc))) from None


def _body_field(field: str) -> str:
    """The body field a contract error's field came from (``data.fact.confidence`` -> ``confidence``)."""
    for prefix in ("data.fact.", "fact.", "data."):
        if field.startswith(prefix):
            field = field[len(prefix) :]
    return {"source_minute_ids": "minute_id", "id": "minute_id"}.get(field, field)
