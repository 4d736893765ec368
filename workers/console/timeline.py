"""The console's timeline pages: a project's log newest first, filtered and paged, and one minute with everything
PVM made of it (what it references and what references it, its point in the vector engine, the facts it asserted
or changed, the chunk and episodes of its thread).

Every read is bounded, whatever the size of the log. A timeline page reads the log backward from its cursor (the
seq it reads before: `LogReader.backward` skips what is newer unread) until it holds a page of minutes or has
scanned `SCAN_LIMIT` records, and then says where it stopped and links on from there. The minute page reads its
minute and those it references by id, and looks for the minutes that reference it among the `REFERRER_SCAN`
after it.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from starlette.routing import Route

from contracts import FACT_EVENT_TYPES, KNOWN_EVENT_TYPES, Minute, keys
from contracts.errors import InvalidMinute
from contracts.fact_changes import fact_change
from contracts.facts import GLOBAL_KEY, Fact, Tier, TierKey
from contracts.minute import parse_timestamp
from contracts.summaries import THREAD_SOURCES, Chunk, Episode, SummaryError, ThreadKind, ThreadRef, thread_of
from pvm.stores.log import LogRecord
from workers.api.request import OUTAGES, BadRequest, NotFound
from workers.console.site import Page, Site, Visit, segment

PAGE_MINUTES = 100  # minutes a timeline page shows unless `n` says otherwise
MAX_PAGE_MINUTES = 1_000
# Records one timeline page reads at most looking for minutes its filters admit: a filter that matches nothing
# costs this much per page, never the whole log.
SCAN_LIMIT = 20_000
# Minutes after a minute that its page looks through for those that reference it.
REFERRER_SCAN = 10_000
REFERRERS_SHOWN = 200  # referring minutes the minute page lists at most
NOTE_CHARS = 160  # a note as a timeline row shortens it

# An age typed into since/until: "15m", "2 h", "3d".
_AGE = re.compile(r"(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d|w)", re.IGNORECASE)
_AGE_SECONDS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3_600, "d": 86_400, "w": 604_800}
TIME_FORMS = (
    "a UTC time such as 2026-03-01 or 2026-03-01 14:30 (ISO 8601; an offset is kept), or an age such as 15m, 2h, 3d"
)


# -- filters ------------------------------------------------------------------------------------------------


def instant(name: str, raw: str, now: float) -> int | None:
    """The Unix ms a since/until parameter names (None when empty); `BadRequest` naming `name` otherwise."""
    if not raw:
        return None
    age = _AGE.fullmatch(raw)
    if age is not None:
        return int((now - float(age.group(1)) * _AGE_SECONDS[age.group(2).lower()]) * 1000)
    try:
        at = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise BadRequest(f"{name}: {raw[:40]!r} is not a time; write {TIME_FORMS}") from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)  # the console shows every time in UTC
    return int(at.timestamp() * 1000)


def minute_ms(timestamp: object) -> int | None:
    """A minute's timestamp as Unix ms; None when it does not parse (a minute logged under older rules)."""
    if not isinstance(timestamp, str):
        return None
    try:
        return int(parse_timestamp(timestamp).timestamp() * 1000)
    except InvalidMinute:
        return None


@dataclass(frozen=True)
class TimelineFilters:
    """What a timeline page shows of the log: minutes of this agent, event type, task and thread (each exact,
    '' for any), with a timestamp at or after `since` and before `until` (as typed; `since_ms`/`until_ms` read)."""

    agent: str = ""
    event_type: str = ""
    task: str = ""
    thread: str = ""
    since: str = ""
    until: str = ""
    since_ms: int | None = None
    until_ms: int | None = None

    @classmethod
    def of(cls, visit: Visit, now: float | None = None) -> TimelineFilters:
        """The filters a request's query names; `BadRequest` naming the parameter that is not a time."""
        clock = time.time() if now is None else now
        since, until = visit.param("since"), visit.param("until")
        filters = cls(
            agent=visit.param("agent"),
            event_type=visit.param("event_type"),
            task=visit.param("task"),
            thread=visit.param("thread"),
            since=since,
            until=until,
            since_ms=instant("since", since, clock),
            until_ms=instant("until", until, clock),
        )
        if filters.since_ms is not None and filters.until_ms is not None and filters.until_ms <= filters.since_ms:
            raise BadRequest(f"until: {until!r} is not after since {since!r}; no minute could match")
        return filters

    @property
    def narrowing(self) -> bool:
        """Whether any filter is set."""
        return bool(self.agent or self.event_type or self.task or self.thread or self.since or self.until)

    def params(self) -> dict[str, str]:
        """The filters as query parameters, for the pager's links."""
        return {
            "agent": self.agent,
            "event_type": self.event_type,
            "task": self.task,
            "thread": self.thread,
            "since": self.since,
            "until": self.until,
        }

    def needles(self) -> tuple[bytes, ...]:
        """Bytes a minute's encoding must hold for the exact filters to admit it: msgpack writes a string as its
        UTF-8 bytes, so a record without them is passed over undecoded."""
        return tuple(v.encode() for v in (self.agent, self.event_type, self.task, self.thread) if v)

    def admits(self, fields: Mapping[str, Any]) -> bool:
        """Whether a minute's fields pass every filter."""
        if self.agent and fields.get("agent_id") != self.agent:
            return False
        if self.event_type and fields.get("event_type") != self.event_type:
            return False
        if self.task and _task_of(fields) != self.task:
            return False
        if self.thread and fields.get("thread_id") != self.thread:
            return False
        if self.since_ms is not None or self.until_ms is not None:
            at = minute_ms(fields.get("timestamp"))
            if at is None:
                return False
            if self.since_ms is not None and at < self.since_ms:
                return False
            if self.until_ms is not None and at >= self.until_ms:
                return False
        return True


def _task_of(fields: Mapping[str, Any]) -> str | None:
    data = fields.get("data")
    task = data.get("task_id") if isinstance(data, Mapping) else None
    return task if isinstance(task, str) else None


def page_size(visit: Visit) -> tuple[int, bool]:
    """How many minutes a page shows (`n`, default `PAGE_MINUTES`), and whether a larger `n` was capped."""
    raw = visit.param("n")
    if not raw:
        return PAGE_MINUTES, False
    try:
        n = int(raw)
    except ValueError:
        raise BadRequest(f"n: {raw[:40]!r} is not a whole number; ask for 1 to {MAX_PAGE_MINUTES} minutes") from None
    if n < 1:
        raise BadRequest(f"n: {n} minutes is too few; ask for 1 to {MAX_PAGE_MINUTES}")
    return min(n, MAX_PAGE_MINUTES), n > MAX_PAGE_MINUTES


def cursor(visit: Visit) -> int | None:
    """The log seq a page reads before (`before`), None for the newest page."""
    raw = visit.param("before")
    if not raw:
        return None
    try:
        seq = int(raw)
    except ValueError:
        seq = 0
    if seq < 1:
        raise BadRequest(f"before: {raw[:40]!r} is not a log seq (a whole number from 1); the pager's links carry one")
    return seq


# -- rows ---------------------------------------------------------------------------------------------------


def shorten(text: str, limit: int = NOTE_CHARS) -> str:
    """`text` on one line, cut to `limit` characters with an ellipsis."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


@dataclass(frozen=True)
class MinuteRow:
    """A minute as a timeline row (and the minute page's lists) shows it."""

    seq: int
    id: str
    timestamp: str
    agent: str | None
    event_type: str
    task: str | None
    thread: str | None
    note: str  # shortened
    durable_at: float

    @classmethod
    def of(cls, record: LogRecord, fields: Mapping[str, Any]) -> MinuteRow:
        note = fields.get("memory_note")
        return cls(
            seq=record.seq,
            id=record.id,
            timestamp=str(fields.get("timestamp") or ""),
            agent=fields.get("agent_id"),
            event_type=str(fields.get("event_type") or ""),
            task=_task_of(fields),
            thread=fields.get("thread_id"),
            note=shorten(note) if isinstance(note, str) else "",
            durable_at=record.durable_at,
        )

    @property
    def minute_path(self) -> str:
        """Its minute page, under the project's path."""
        return minute_path(self.id)

    @property
    def agent_path(self) -> str:
        """Its agent's page under the project's path ('' for none)."""
        return "agents/" + segment(self.agent) if self.agent else ""

    @property
    def thread_path(self) -> str:
        """Its thread's page under the project's path ('' for none)."""
        return thread_path(ThreadKind.THREAD, self.thread)

    @property
    def task_path(self) -> str:
        """Its task's thread page under the project's path ('' for none, or a task id no thread can have)."""
        return thread_path(ThreadKind.TASK, self.task)


def minute_path(minute_id: str) -> str:
    """A minute's page under the project's path."""
    return "minutes/" + segment(minute_id)


def thread_path(kind: ThreadKind, name: str | None) -> str:
    """A thread's page under the project's path, by kind and name; '' for none or a name no thread can have."""
    if not name:
        return ""
    try:
        return "threads/" + segment(str(ThreadRef(kind, name)))
    except SummaryError:
        return ""


@dataclass(frozen=True)
class TimelinePage:
    """One page of the timeline: its rows newest first, and where the next (older) page starts."""

    rows: list[MinuteRow]
    scanned: int  # records read
    older: int | None  # the cursor of the next page; None when the log ends here
    stopped: bool  # the scan reached SCAN_LIMIT before the page was full


def read_page(
    records: Iterable[LogRecord], filters: TimelineFilters, n: int, scan_limit: int = SCAN_LIMIT
) -> TimelinePage:
    """Up to `n` minutes `filters` admits from `records` (newest first), reading at most `scan_limit` records."""
    needles = filters.needles()
    rows: list[MinuteRow] = []
    scanned = last_seq = 0
    for record in records:
        scanned += 1
        last_seq = record.seq
        if all(needle in record.minute_bytes for needle in needles):
            fields = record.fields
            if filters.admits(fields):
                rows.append(MinuteRow.of(record, fields))
                if len(rows) >= n:
                    break
        if scanned >= scan_limit:
            older = last_seq if last_seq > 1 else None
            return TimelinePage(rows, scanned, older, stopped=older is not None)
    full = len(rows) >= n
    older = rows[-1].seq if full and rows[-1].seq > 1 else None
    return TimelinePage(rows, scanned, older, stopped=False)


def timeline_page(visit: Visit) -> Page:
    """The project's log newest first, filtered, a page at a time."""
    filters = TimelineFilters.of(visit)
    n, capped = page_size(visit)
    before = cursor(visit)
    project_id = visit.project_id
    log = visit.stores.reader.log
    page = read_page(log.backward(project_id, before_seq=before), filters, n, SCAN_LIMIT)
    agents = sorted(_text(a) for a in visit.stores.connection.smembers(keys.agents(project_id)))
    return Page(
        "timeline.html",
        "Timeline",
        {
            "page": page,
            "filters": filters,
            "n": n,
            "n_param": n if n != PAGE_MINUTES else None,
            "capped": capped,
            "max_n": MAX_PAGE_MINUTES,
            "before": before,
            "scan_limit": SCAN_LIMIT,
            "agents": agents,
            "event_types": sorted(KNOWN_EVENT_TYPES),
            "time_forms": TIME_FORMS,
        },
    )


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


# -- one minute ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reference:
    """A minute this one references: its row, or None when the project's log does not hold it."""

    id: str
    row: MinuteRow | None

    @property
    def minute_path(self) -> str:
        return minute_path(self.id)


@dataclass(frozen=True)
class Referrers:
    """The minutes after this one that reference it, among the next `looked` minutes of the log."""

    rows: list[MinuteRow]
    looked: int  # minutes read after this one
    limit: int  # the most the page reads
    more: bool  # more referred to it than the page lists


@dataclass(frozen=True)
class IndexPoint:
    """What the vector engine holds of a minute: its point's payload, or why there is none."""

    payload: dict[str, Any] | None
    why_none: str = ""

    @property
    def category(self) -> str:
        return str((self.payload or {}).get("category") or "")

    @property
    def scores(self) -> dict[str, Any]:
        scores = (self.payload or {}).get("scores")
        return dict(scores) if isinstance(scores, Mapping) else {}

    @property
    def insights(self) -> list[dict[str, Any]]:
        found = (self.payload or {}).get("insights") or ()
        return [i for i in found if isinstance(i, Mapping)]  # type: ignore[misc]

    @property
    def annotations(self) -> dict[str, Any]:
        """The evaluate pool's marks on the point that are set (pruned, merged, in conflict)."""
        payload = self.payload or {}
        return {k: payload[k] for k in ("pruned_ms", "merged_into", "merged_from", "conflict_with") if payload.get(k)}


@dataclass(frozen=True)
class ChangedFact:
    """A fact a minute asserted or changed: the change minute, its event type, and the fact as the store holds it
    now (None when the store does not hold it, or `hidden`: a global fact this token may not read)."""

    fact_id: str
    change: str  # the event type of the knowledge change
    minute_id: str  # the minute that carries the change
    fact: Fact | None
    sourced: bool  # the fact names this minute among its sources
    hidden: bool = False

    @property
    def minute_path(self) -> str:
        return minute_path(self.minute_id)


@dataclass(frozen=True)
class ThreadPlace:
    """Where a minute stands in its thread: the chunks that stand for it, the episodes that link it, or not yet."""

    thread: str  # the ThreadRef as text
    chunks: list[Chunk]
    episodes: list[Episode]
    chunked_seq: int  # the thread's minutes up to this seq are in chunks
    seen: bool  # the summarize pool has seen the thread

    @property
    def path(self) -> str:
        return "threads/" + segment(self.thread)


def references(visit: Visit, ids: Iterable[str]) -> list[Reference]:
    """The minutes of the project with these ids, in the order given; ids the log lacks too."""
    wanted = list(dict.fromkeys(ids))
    found = visit.stores.reader.log.get_by_ids(visit.project_id, wanted) if wanted else {}
    return [Reference(i, MinuteRow.of(found[i], found[i].fields) if i in found else None) for i in wanted]


def referrers(
    records: Iterator[LogRecord], minute_id: str, limit: int = REFERRER_SCAN
) -> tuple[Referrers, list[LogRecord]]:
    """The records among the next `limit` that reference `minute_id` (and their records, for the facts)."""
    needle = minute_id.encode()
    rows: list[MinuteRow] = []
    found: list[LogRecord] = []
    looked = 0
    for record in records:
        if looked >= limit:
            break
        looked += 1
        if needle not in record.minute_bytes:  # most minutes do not name it: passed over undecoded
            continue
        fields = record.fields
        if minute_id in (fields.get("context_references") or ()):
            found.append(record)
            if len(rows) < REFERRERS_SHOWN:
                rows.append(MinuteRow.of(record, fields))
    return Referrers(rows, looked, limit, more=len(found) > len(rows)), found


def index_point(visit: Visit, minute: Minute) -> IndexPoint:
    """The minute's point in the vector engine, or why there is none."""
    if minute.event_type in FACT_EVENT_TYPES:
        return IndexPoint(None, "a knowledge change is indexed as its fact's point, not as a minute of its own")
    engine = getattr(visit.stores.reader.searcher, "engine", None)
    if engine is None:
        return IndexPoint(None, "this server does not search (no vector engine)")
    try:
        found = engine.retrieve(minute.project_id, [minute.id])
    except OUTAGES as exc:  # the rest of the page reads the log and Redis: it still answers
        return IndexPoint(None, f"the vector engine did not answer: {exc}")
    if not found:
        return IndexPoint(None, "not indexed yet: the index pool has not made its point (pools show how far behind)")
    return IndexPoint(dict(found[0].payload))


def _changed(minute: Minute) -> tuple[str, TierKey] | None:
    """The fact a knowledge-change minute changes and its tier key; None for a minute that changes none."""
    try:
        change = fact_change(minute)
    except InvalidMinute:
        return None
    held = getattr(change, "fact", None)
    if isinstance(held, Fact):
        return held.id, held.tier_key
    fact_id = getattr(change, "fact_id", None)
    return (fact_id, change.tier_key) if isinstance(fact_id, str) else None


def changed_facts(visit: Visit, minute: Minute, referring: Iterable[LogRecord]) -> list[ChangedFact]:
    """The facts this minute changed (a knowledge change) and those the knowledge changes that reference it
    changed (the facts pool's change minutes reference the minutes a fact came from), with each fact as the
    store holds it now."""
    changes: list[tuple[str, str, str, TierKey]] = []
    for source in (minute, *(r.minute for r in referring)):
        if source.event_type in FACT_EVENT_TYPES and (changed := _changed(source)) is not None:
            changes.append((changed[0], source.event_type, source.id, changed[1]))
    if not changes:
        return []
    store = visit.stores.reader.fact_store
    project_id = minute.project_id
    ids = list(dict.fromkeys(fact_id for fact_id, _, _, key in changes if key.tier is not Tier.GLOBAL))
    held = {fid: s.fact for fid, s in store.stored(TierKey.for_project(project_id), ids).items()}
    held = {fid: fact for fid, fact in held.items() if fact.project_id == project_id}
    shared = list(dict.fromkeys(fact_id for fact_id, _, _, key in changes if key.tier is Tier.GLOBAL))
    if shared and visit.scope.allows_global:
        held.update({fid: s.fact for fid, s in store.stored(GLOBAL_KEY, shared).items()})
    hidden = not visit.scope.allows_global
    return [
        ChangedFact(
            fid,
            kind,
            minute_id,
            held.get(fid),
            sourced=fid in held and minute.id in held[fid].source_minute_ids,
            hidden=hidden and key.tier is Tier.GLOBAL,
        )
        for fid, kind, minute_id, key in changes
    ]


def thread_place(visit: Visit, minute: Minute, seq: int) -> ThreadPlace | None:
    """The chunks and episodes of the minute's thread that hold it; None for a minute in no thread."""
    settings = visit.stores.settings
    thread = thread_of(minute, settings.thread_by if settings is not None else THREAD_SOURCES)
    if thread is None:
        return None
    project_id = minute.project_id
    seen = bool(visit.stores.connection.hexists(keys.summary_threads(project_id), thread.digest))
    view = visit.stores.summaries.thread_view(project_id, thread, 0)
    chunks = [c for c in view.chunks if any(first <= seq <= last for first, last in c.seq_ranges)]
    episodes = [e for e in view.episodes if minute.id in e.minute_ids]
    return ThreadPlace(str(thread), chunks, episodes, view.chunked_seq, seen)


@dataclass(frozen=True)
class MinuteView:
    """Everything the minute page shows."""

    record: LogRecord
    minute: Minute
    fields: dict[str, Any]
    data_json: str
    task: str | None
    references: list[Reference]
    referrers: Referrers
    point: IndexPoint
    facts: list[ChangedFact]
    place: ThreadPlace | None


def minute_page(visit: Visit) -> Page:
    """One minute: its fields, the minutes it references and those that reference it, and what the pools made
    of it."""
    project_id = visit.project_id
    minute_id = str(visit.request.path_params["minute_id"])
    log = visit.stores.reader.log
    record = log.get_by_ids(project_id, [minute_id]).get(minute_id)
    if record is None:
        raise NotFound(f"no minute {minute_id} in project {project_id}; the timeline lists the minutes it has")
    minute = record.minute
    fields = record.fields
    found, referring = referrers(log.history(project_id, after_seq=record.seq), minute.id, REFERRER_SCAN)
    view = MinuteView(
        record=record,
        minute=minute,
        fields=fields,
        data_json=json.dumps(fields.get("data") or {}, indent=2, sort_keys=True, ensure_ascii=False, default=repr),
        task=_task_of(fields),
        references=references(visit, minute.context_references),
        referrers=found,
        point=index_point(visit, minute),
        facts=changed_facts(visit, minute, referring),
        place=thread_place(visit, minute, record.seq),
    )
    return Page("minute.html", f"Minute {minute_id}", {"view": view, "row": MinuteRow.of(record, fields)})


def routes(site: Site) -> list[Route]:
    return [
        Route("/ui/projects/{project_id}/timeline", site.page(timeline_page)),
        Route("/ui/projects/{project_id}/minutes/{minute_id}", site.page(minute_page)),
    ]
