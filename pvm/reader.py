"""The reader library: each agent's bounded, relevant, fresh context, assembled in milliseconds.

`ContextReader.build_context()` puts together, for one agent in one project:
the project's newest minutes (Redis), the minutes those reference (Redis, then
the log), the agent's track record (Redis), what we know (the current facts of
the task, the project and, when granted, the global tier) and the rules that
apply to the task (Redis, `pvm.context_facts`), and similar past experience
(hybrid search, when a task is given), then trims all of it to a token budget
and says how fresh each part is. Every call names a project; nothing crosses
projects, and the global tier is read only when the caller is granted it.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from contracts import decode_durable_fields, keys
from contracts.errors import InvalidFact, PvmError
from contracts.facts import GLOBAL_KEY, Fact, FactType, TierKey
from contracts.memory import BudgetReport, ContextPackage, SearchFilters, SearchHit, agent_lines, hit_line, minute_line
from contracts.minute import is_valid_project_id, utc_now_iso
from contracts.summaries import SYSTEM_EVENT_TYPES, Chunk, Episode, SummaryError, ThreadRef, chunk_line, episode_line
from pvm import context_facts, defaults
from pvm.config import Settings
from pvm.context_facts import CURRENT_READ, PROMOTED_MARKER, FactMemo, KnownFact
from pvm.knowledge import check_key
from pvm.stores.agent_memory import AgentMemoryStore
from pvm.stores.cache import MinuteCache
from pvm.stores.facts import FactStore
from pvm.stores.log import LogReader
from pvm.stores.minutes import DurableMinutes
from pvm.stores.summaries import THREAD_READ, ThreadView, parse_thread_read, thread_keys
from pvm.wire import Sent, Unanswered

if TYPE_CHECKING:
    from pvm.search import SearchResult

log = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4  # the usual estimate for English under BPE tokenizers; no tokenizer dependency

# Everything build_context needs from Redis before it searches, in one round trip (all keys share the project's
# hash tag). HMGET is chunked: Lua's unpack() takes a few thousand values at most.
_CONTEXT_READ = """
-- KEYS: recent window, minutes by id, log head, index head, agent memory, agent capabilities
-- ARGV[1]: how many recent minutes. Returns: the cached bytes of the recent minutes, oldest first (nil when
-- evicted), then the log head, index head and agent memory hashes (flat) and the capabilities.
local n = tonumber(ARGV[1])
local ids = {}
if n > 0 then ids = redis.call('ZRANGE', KEYS[1], -n, -1) end
local bodies = {}
for start = 1, #ids, 1000 do
  local part = redis.call('HMGET', KEYS[2], unpack(ids, start, math.min(start + 999, #ids)))
  for _, body in ipairs(part) do bodies[#bodies + 1] = body end
end
return {bodies, redis.call('HGETALL', KEYS[3]), redis.call('HGETALL', KEYS[4]),
        redis.call('HGETALL', KEYS[5]), redis.call('SMEMBERS', KEYS[6])}
"""


class ReaderError(PvmError, ValueError):
    """A read that cannot be made as asked (no project, a bad budget, task id or thread); the message names it."""


class SearchUnavailable(PvmError, RuntimeError):
    """A search asked of a reader built without a vector store."""


class Searcher(Protocol):
    """Finds a project's minutes for a text (`pvm.search.HybridSearch`)."""

    def search_result(
        self,
        project_id: str,
        query: str,
        filters: SearchFilters = ...,
        k: int = ...,
        *,
        prefer: Any = ...,
        kinds: Collection[str] = ...,
        payloads: bool = ...,
    ) -> SearchResult: ...

    def with_payloads(self, project_id: str, hits: Sequence[SearchHit]) -> list[SearchHit]: ...


_WORD = re.compile(r"[a-z0-9]+")


def _words(hit: SearchHit) -> frozenset[str]:
    return frozenset(_WORD.findall(str(hit.minute.get("memory_note") or "").lower()))  # no note: never a repeat


def diverse(hits: Sequence[SearchHit], k: int) -> list[SearchHit]:
    """The best `k` hits, in order, skipping any that repeats a better one (agents often log the same note).

    A context has room for a few past experiences; five agents' copies of one
    note would fill it with one fact.
    """
    kept: list[SearchHit] = []
    seen: list[frozenset[str]] = []
    for hit in hits:
        words = _words(hit)
        if words and any(len(words & w) / len(words | w) >= defaults.CONTEXT_NEAR_DUPLICATE for w in seen):
            continue
        kept.append(hit)
        seen.append(words)
        if len(kept) == k:
            break
    return kept


def estimate_tokens(text: str) -> int:
    """Tokens a text will cost in a prompt (≈ 4 characters each, at least 1)."""
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def require_project(project_id: object) -> str:
    """Tenancy fails closed: every read names a project."""
    if not isinstance(project_id, str) or not project_id:
        raise ReaderError("project_id is required: PVM never reads across projects; pass the project to read")
    return project_id


def windowed(fields: dict[str, Any]) -> bool:
    """Whether a minute belongs in the recent activity: what agents said, not a knowledge change (its view
    is the facts section) nor a chunk summary (the thread's)."""
    return fields.get("event_type") not in SYSTEM_EVENT_TYPES


def line_cost(line: str) -> int:
    """What one item's prompt line costs in the budget: its tokens and one for the line break."""
    return estimate_tokens(line) + 1


@dataclass
class _Section:
    name: str
    items: list[Any]
    lines: list[str]
    limit: int | None = None  # the most tokens this section may use (None: whatever is left)
    dropped: int = 0  # items already left out before fitting (the facts' tier split), reported as cut


def fit_budget(sections: Sequence[_Section], budget_tokens: int) -> tuple[dict[str, list[Any]], BudgetReport]:
    """Keep items in section priority order until the budget is spent; report tokens used and items cut.

    Sections come most important first; within a section items come most
    important first. A section whose next item does not fit (in what is left,
    or in its own limit) stops taking items, and the space left goes to the
    next section.
    """
    kept: dict[str, list[Any]] = {}
    tokens: dict[str, int] = {}
    cut: dict[str, int] = {}
    left = budget_tokens
    for section in sections:
        kept[section.name] = []
        tokens[section.name] = 0
        cut[section.name] = section.dropped
        room = left if section.limit is None else min(left, section.limit)
        for i, (item, line) in enumerate(zip(section.items, section.lines, strict=True)):
            cost = line_cost(line)
            if cost > room:
                cut[section.name] += len(section.items) - i
                break
            kept[section.name].append(item)
            tokens[section.name] += cost
            left -= cost
            room -= cost
    return kept, BudgetReport(budget_tokens, budget_tokens - left, tokens, {k: v for k, v in cut.items() if v})


class MinuteMemo:
    """Decoded minutes and their prompt lines by their cached bytes: a minute never changes once durable.

    Every context reads the project's recent window, and most of it is the
    same minutes call after call: decoding them and writing their lines again
    was about a tenth of a context. Each caller gets its own copy of the
    fields (the nested ``data`` is shared: read, never write it). Thread-safe;
    past `size` entries it starts over: a cache, not a store.
    """

    def __init__(self, size: int = defaults.CONTEXT_MINUTE_MEMO) -> None:
        self.size = size
        self._known: dict[bytes, tuple[dict[str, Any], str]] = {}
        self._lines: dict[tuple[Any, str], str] = {}  # (project, minute id): ids are unique within a project only
        self._lock = threading.Lock()

    def fields(self, raw: bytes) -> dict[str, Any]:
        """`decode_durable_fields(raw)`, remembered; its line is remembered under the minute's id."""
        found = self._known.get(raw)
        if found is None:
            fields = decode_durable_fields(raw)
            found = (fields, minute_line(fields))
            with self._lock:
                if len(self._known) >= self.size:
                    self._known.clear()
                    self._lines.clear()
                self._known[raw] = found
                if isinstance(fields.get("id"), str):
                    self._lines[(fields.get("project_id"), fields["id"])] = found[1]
        return dict(found[0])

    def line(self, minute: dict[str, Any]) -> str:
        """`minute_line(minute)`: remembered for a minute this memo decoded, written anew for any other."""
        minute_id = minute.get("id")
        found = self._lines.get((minute.get("project_id"), minute_id)) if isinstance(minute_id, str) else None
        return found if found is not None else minute_line(minute)


class ContextReader:
    """Reads memory for agents. Thread-safe; keep one per process."""

    def __init__(
        self,
        connection: redis.Redis,
        log: LogReader,
        searcher: Searcher | None = None,
        recent_n: int = defaults.CONTEXT_RECENT,
        experience_k: int = defaults.CONTEXT_EXPERIENCE_K,
        fact_tier_split: Sequence[float] = defaults.FACT_TIER_SPLIT,
        thread_recent: int = defaults.SUMMARY_RECENT,
        recent_share: float = defaults.CONTEXT_RECENT_SHARE,
        retrieved_share: float = defaults.CONTEXT_RETRIEVED_SHARE,
    ) -> None:
        """`fact_tier_split`: the task, project and global weights of the facts section (`PVM_FACT_TIER_SPLIT`).

        A context built for a thread shows its `thread_recent` newest minutes (PVM_SUMMARY_RECENT) within
        `recent_share` of the budget (PVM_CONTEXT_RECENT_SHARE), then its chunk summaries and episodes within
        `retrieved_share` (PVM_CONTEXT_RETRIEVED_SHARE) plus what the recent minutes left.
        """
        self.connection = connection
        self._unanswered = Unanswered(connection)  # counters: sent without waiting for their replies
        self.cache = MinuteCache(connection)
        self.log = log
        self.agents = AgentMemoryStore(connection)
        self.searcher = searcher
        self.recent_n = recent_n
        self.experience_k = experience_k
        split = tuple(float(w) for w in fact_tier_split)
        if len(split) != 3 or not all(math.isfinite(w) and w >= 0 for w in split) or not sum(split):
            raise ReaderError(
                f"fact_tier_split must be three weights (task, project, global), each >= 0 and not all 0, "
                f"such as {defaults.FACT_TIER_SPLIT}; got {fact_tier_split!r} (PVM_FACT_TIER_SPLIT)"
            )
        self.fact_tier_split = split
        for name, share in (("recent_share", recent_share), ("retrieved_share", retrieved_share)):
            if not (math.isfinite(share) and 0 <= share <= 1):
                raise ReaderError(f"{name} must be a share of the budget from 0 to 1, got {share!r}")
        self.thread_recent = thread_recent
        self.recent_share = recent_share
        self.retrieved_share = retrieved_share
        self._thread_read = connection.register_script(THREAD_READ)
        self._context_read = connection.register_script(_CONTEXT_READ)
        self._current_read = connection.register_script(CURRENT_READ)
        self._facts = FactMemo(line_cost)
        self._minutes = MinuteMemo()
        # Whole minutes by id (cache, then log): references, and the minutes of search hits (points do not hold them).
        self.minutes = DurableMinutes(self.cache, log, self._minutes.fields)
        if searcher is not None and getattr(searcher, "minutes", False) is None:
            searcher.minutes = self.minutes  # type: ignore[attr-defined]  # a HybridSearch built without a source
        self.fact_store = FactStore(connection)
        self._owned: list[Callable[[], None]] = []  # what `close()` releases: only what `from_settings` opened

    @classmethod
    def from_settings(cls, settings: Settings | None = None, *, search: bool | None = None) -> ContextReader:
        """A reader of the configured Redis and log (PVM_REDIS_URL, PVM_HOME), weighted as PVM_* settings say.

        `search`: None (the default) searches when PVM_QDRANT_URL names a Qdrant
        server, which any number of readers share; True also opens the embedded
        engine under $PVM_HOME, which only one process may hold (so not beside a
        running `pvm up` / `pvm serve`: read through `pvm.Client` there); False
        never searches. The engine needs the server extra. `close()` (or a
        `with` block) releases the connection and the engine it opened.
        """
        from pvm.connection import redis_from_settings

        settings = settings or Settings.from_env()
        connection = redis_from_settings(settings)
        searcher: Searcher | None = None
        wanted = bool(settings.qdrant_url) if search is None else search
        if wanted:
            from pvm import engines

            try:
                searcher = engines.searcher_for(settings, connection)  # type: ignore[assignment]
            except BaseException:
                connection.close()
                raise
        reader = cls(
            connection,
            LogReader(settings.log_dir),
            searcher,
            fact_tier_split=settings.fact_tier_split,
            thread_recent=settings.summary_recent,
            recent_share=settings.context_recent_share,
            retrieved_share=settings.context_retrieved_share,
        )
        reader._owned.append(connection.close)
        if searcher is not None:
            from pvm.engines import close_shared

            reader._owned.append(close_shared)
        return reader

    def close(self) -> None:
        """Release what `from_settings` opened (its Redis connection, its engine); a reader given them keeps them."""
        owned, self._owned = self._owned, []
        for release in reversed(owned):
            release()

    def __enter__(self) -> ContextReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- single reads --------------------------------------------------------------

    def get_recent(self, project_id: str, n: int = 50) -> list[dict[str, Any]]:
        """The project's newest `n` minutes, oldest first (Redis cache, the log when the cache is short)."""
        require_project(project_id)
        ids = self.cache.recent_ids(project_id, n)
        cached = self.cache.get_many(project_id, ids)
        return self._recent(project_id, n, [cached.get(i) for i in ids])

    def _recent(self, project_id: str, n: int, cached: Sequence[bytes | None]) -> list[dict[str, Any]]:
        """`get_recent` given the cached bytes of the recent window's ids (None where evicted)."""
        minutes = [self._minutes.fields(raw) for raw in cached if raw is not None]
        if len(minutes) < n:
            # The log holds knowledge changes too; the window never does (`CachedMinute.windowed`).
            from_log = [f for f in (r.fields for r in self.log.get_recent(project_id, n)) if windowed(f)]
            if len(from_log) > len(minutes):
                minutes = from_log
        return minutes

    def get_by_ids(self, project_id: str, ids: Sequence[str]) -> list[dict[str, Any]]:
        """Minutes of the project with these ids, in the order asked (`DurableMinutes.minutes_by_id`: the log for
        those this reader has indexed, the Redis cache for the rest, then the log again)."""
        require_project(project_id)
        found = self.minutes.minutes_by_id(project_id, list(ids))
        return [found[i] for i in ids if i in found]

    def _by_ids(self, project_id: str, ids: Sequence[str], cached: dict[str, bytes]) -> list[dict[str, Any]]:
        """The referenced minutes given the cached bytes found for the ids (the cache's HMGET went out with the
        context's first reads), the log for the rest."""
        found = self.minutes.found(project_id, ids, cached)
        return [found[i] for i in ids if i in found]

    def search(
        self,
        project_id: str,
        query: str,
        filters: SearchFilters | None = None,
        k: int = defaults.SEARCH_K,
        *,
        prefer: str | None = None,
    ) -> list[SearchHit]:
        """Hybrid search over the project's indexed minutes.

        Relevance decides; `prefer="recent"` lets recency lead (as a query
        saying "latest" or "current" does), `prefer="relevant"` never.
        """
        return self.search_result(project_id, query, filters, k, prefer=prefer).hits

    def search_result(
        self,
        project_id: str,
        query: str,
        filters: SearchFilters | None = None,
        k: int = defaults.SEARCH_K,
        *,
        prefer: str | None = None,
        kinds: Collection[str] = ("minute",),
    ) -> SearchResult:
        """`search`'s hits and, when the answer is lexical-only for want of a query embedding, why (`degraded`).

        `kinds`: minutes only by default; any of "minute", "fact", "summary" (`pvm.search.KINDS`) ranked together.
        """
        require_project(project_id)
        if self.searcher is None:
            raise SearchUnavailable(
                "this reader has no vector store configured; semantic search is unavailable: build it with "
                "ContextReader.from_settings(search=True), or give it a searcher"
            )
        result = self.searcher.search_result(
            project_id, query, filters or SearchFilters(), k, prefer=prefer, kinds=kinds
        )
        self._count_access(project_id, [h.minute_id for h in result.hits])
        return result

    # -- learned keys ------------------------------------------------------------------

    def recall(
        self, project_id: str, key: str, *, task_id: str | None = None, include_global: bool = False
    ) -> Fact | None:
        """The current value of a learned key (`Emitter.learn`) as its fact (`.value`), or None; one round trip.

        The task's tier first (when `task_id` names one), then the project's,
        then the global tier, read only with `include_global` (the caller is
        granted it). Raises ValueError naming ``key`` or ``task_id`` when it
        cannot name one.
        """
        require_project(project_id)
        check_key(key)
        return self.fact_store.recall_first(_tier_keys(project_id, task_id, include_global), key)

    # -- the context -------------------------------------------------------------------

    def build_context(
        self,
        project_id: str,
        agent_id: str,
        task: str | None = None,
        budget_tokens: int = defaults.CONTEXT_BUDGET_TOKENS,
        *,
        task_id: str | None = None,
        tags: Sequence[str] = (),
        include_global: bool = False,
        thread: str | None = None,
    ) -> ContextPackage:
        """Assemble an agent's context under a token budget.

        `task` is the task's text; `task_id` names the task whose facts (the
        task tier) join the project's; `tags` are the task's tags, which rules
        match too. The global tier is read only with `include_global` (the
        caller is granted it: the API passes its token's grant), so tenancy
        fails closed. `thread` (a thread id, ``task:<id>`` or ``project``) builds
        the context for one thread: its newest minutes verbatim stand for the
        project's, followed by its chunk summaries, newest first, and its
        episodes, most significant first (the budget split in `__init__`).

        Besides the search, it waits on Redis at most twice, and mostly not at
        all (`pvm.wire`): one write reads the recent window, its cached
        minutes, both heads, the agent's memory and the current facts of every
        tier read, sent before the search and read after it; one reads the
        referenced minutes, sent as soon as the recent minutes name them and
        read when their section (last in priority) is built; and the access
        counts of the experience and facts that fit the budget are sent
        without waiting for replies (``CLIENT REPLY SKIP``, where the server
        has it).
        """
        require_project(project_id)
        if not isinstance(agent_id, str) or not agent_id:
            raise ReaderError("agent_id is required: the context is built for one agent")
        if budget_tokens < 1:
            raise ReaderError(f"budget_tokens must be at least 1, got {budget_tokens}")
        if isinstance(tags, str) or not all(isinstance(t, str) for t in tags):
            raise ReaderError(f"tags must be a list of strings, such as ['deploy', 'payments']; got {tags!r}")
        tier_keys = _tier_keys(project_id, task_id, include_global)
        thread_ref = _thread_ref(thread)
        read_at = time.time()
        context_keys = [
            keys.recent_window(project_id),
            keys.minute_by_id(project_id),
            keys.log_head(project_id),
            keys.index_head(project_id),
            keys.agent_memory(project_id, agent_id),
            keys.agent_capabilities(project_id, agent_id),
        ]
        calls = [(self._context_read, context_keys, [max(0, self.recent_n)])]
        calls += [(self._current_read, k, [PROMOTED_MARKER]) for k in context_facts.read_keys(tier_keys)]
        if thread_ref is not None:  # in the same round trip
            calls.append((self._thread_read, thread_keys(project_id, thread_ref), [max(0, self.thread_recent)]))
        sent = self._send_scripts(calls)  # its replies are read after the search: Redis works while it runs
        try:
            experience, search_error, degraded = self._experience(project_id, agent_id, task)
        except BaseException:
            sent.drop()
            raise
        replies = self._script_replies(sent, calls)
        (bodies, log_head, index_head, memory_hash, capabilities), *fact_replies = replies
        view = parse_thread_read(project_id, thread_ref, fact_replies.pop()) if thread_ref is not None else None
        recent = list(view.recent) if view is not None else self._recent(project_id, self.recent_n, bodies)
        freshness = _freshness(_decoded(_hash(log_head)), _decoded(_hash(index_head)), read_at)
        memory = AgentMemoryStore.parse(agent_id, _hash(memory_hash), capabilities)
        current = context_facts.questioned_beside(
            [k for k in (self._facts.known(raw) for reply in fact_replies for raw in reply) if k.holds_at(read_at)],
            self._facts.cost,
        )
        grouped = context_facts.by_tier(current, tier_keys)
        task_words = context_facts.words(task or "", *tags)
        procedures = [k for facts in grouped.values() for k in facts if k.fact.type is FactType.PROCEDURE]
        rules = context_facts.choose_rules(procedures, task_words, context_facts.words(*tags))
        recent_ids = {m["id"] for m in recent}
        wanted: list[str] = []
        for m in reversed(recent):  # references of the newest minutes first
            for ref in m.get("context_references") or ():
                if ref not in recent_ids and ref not in wanted:
                    wanted.append(ref)
        # Read while the sections before them are built: the referenced minutes come last in priority.
        referenced_sent = Sent(self.connection, [("HMGET", keys.minute_by_id(project_id), *wanted)]) if wanted else None
        try:  # a connection holding an unread reply never goes back to the pool
            sections = [
                _Section("agent_memory", [memory], ["\n".join(agent_lines(memory))]),
                _Section(
                    "rules",
                    rules,
                    [k.line for k in rules],
                    limit=math.floor(budget_tokens * defaults.CONTEXT_RULE_SHARE),
                ),
            ]
            room = min(
                math.floor(budget_tokens * defaults.CONTEXT_FACT_SHARE),
                budget_tokens - fit_budget(sections, budget_tokens)[1].used_tokens,
            )
            facts_by_tier = {
                tier: [k for k in facts if k.fact.type is not FactType.PROCEDURE] for tier, facts in grouped.items()
            }
            chosen = context_facts.choose_facts(facts_by_tier, task_words, room, self.fact_tier_split)
            sections.append(
                _Section(
                    "facts", chosen.facts, [k.line for k in chosen.facts], limit=room, dropped=sum(chosen.cut.values())
                )
            )
            if view is not None:  # a thread's share is of what the agent's memory, the rules and what we know leave
                sections += self._thread_sections(view, recent, sections, budget_tokens)
            sections.append(_Section("relevant_experience", experience, [hit_line(h) for h in experience]))
            head = fit_budget(sections, budget_tokens)[0]
            counted = [h.minute_id for h in head["relevant_experience"]]
            counters = _access_counters(project_id, counted)
            counters += _fact_read_counters([*head["rules"], *head["facts"]], utc_now_iso())
            self._unanswered.send(counters)  # nobody waits on a counter
            referenced = self._referenced(project_id, wanted, referenced_sent)
        except BaseException:
            if referenced_sent is not None:
                referenced_sent.drop()
            raise
        newest_first = list(reversed(recent))
        if view is None:
            sections.append(_Section("recent", newest_first, [self._minutes.line(m) for m in newest_first]))
        sections.append(_Section("referenced", referenced, [self._minutes.line(m) for m in referenced]))
        kept, report = fit_budget(sections, budget_tokens)
        report = replace(report, tiers=chosen.tokens, tier_cut=chosen.cut)
        if search_error:
            freshness["index"]["error"] = search_error
        if degraded:
            freshness["index"]["degraded"] = degraded  # "dense leg skipped: <reason>": experience is lexical-only
        return ContextPackage(
            project_id=project_id,
            agent_id=agent_id,
            task=task,
            recent=tuple(reversed(kept["recent"])),
            referenced=tuple(kept["referenced"]),
            agent_memory=memory,
            relevant_experience=tuple(kept["relevant_experience"]),
            budget=report,
            freshness=freshness,
            full_log_available=self.log.has_project(project_id),
            facts=tuple(k.record for k in kept["facts"]),
            rules=tuple(k.record for k in kept["rules"]),
            thread=None if thread_ref is None else str(thread_ref),
            summaries=tuple(kept.get("summaries", ())),
            episodes=tuple(e.to_dict() for e in kept.get("episodes", ())),
        )

    def _thread_sections(
        self, view: ThreadView, recent: list[dict[str, Any]], before: list[_Section], budget_tokens: int
    ) -> list[_Section]:
        """A thread's sections: its newest minutes within the recent share, then its chunk summaries (newest first)
        and episodes (most significant first) within the retrieved share plus what the recent minutes left; both
        shares are of the budget the sections `before` (agent memory, rules, facts) leave.

        When not every summary fits, the newest chunks keep theirs and the older ones are shown by their
        decisions only (``compact``), as many in full as leave room for the decisions of the rest; a chunk
        that decided nothing is then cut."""
        newest_first = list(reversed(recent))
        left = budget_tokens - fit_budget(before, budget_tokens)[1].used_tokens
        recent_room = math.floor(left * self.recent_share)
        thread_recent = _Section(
            "recent", newest_first, [self._minutes.line(m) for m in newest_first], limit=recent_room
        )
        fitted = fit_budget([*before, thread_recent], budget_tokens)[1]
        retrieved_room = math.floor(left * self.retrieved_share) + recent_room - fitted.sections["recent"]
        room = min(retrieved_room, budget_tokens - fitted.used_tokens)
        chunks, lines = _chunk_lines(list(reversed(view.chunks)), room)
        summaries = _Section("summaries", chunks, lines, limit=retrieved_room, dropped=len(view.chunks) - len(chunks))
        used = fit_budget([*before, thread_recent, summaries], budget_tokens)[1].sections["summaries"]
        episodes = distinct_episodes(view.episodes)
        return [
            thread_recent,
            summaries,
            _Section("episodes", episodes, [episode_line(e.to_dict()) for e in episodes], limit=retrieved_room - used),
        ]

    def _experience(
        self, project_id: str, agent_id: str, task: str | None
    ) -> tuple[list[SearchHit], str | None, str | None]:
        """The context's relevant experience for `task`: its hits, the search's error (the vector store is down: the
        rest of the context still answers) and why it degraded to lexical-only, if it did."""
        if not task or self.searcher is None:
            return [], None, None
        try:
            # The hits' minutes decide which are kept; only the kept ones' points are read (their category, insights).
            found = self.searcher.search_result(
                project_id,
                task,
                SearchFilters(),
                self.experience_k * defaults.CONTEXT_EXPERIENCE_OVERFETCH,
                payloads=False,
            )
            # Knowledge changes are minutes too (and minute points); what they say is the facts section's.
            said = [h for h in found.hits if windowed(h.minute)]
            kept = self.searcher.with_payloads(project_id, diverse(said, self.experience_k))
        except Exception as exc:
            log.warning("context for %s/%s without relevant experience: %s", project_id, agent_id, exc)
            return [], f"{type(exc).__name__}: {exc}", None
        return kept, None, found.degraded

    def _send_scripts(self, calls: Sequence[tuple[Script, Sequence[str], Sequence[Any]]]) -> Sent:
        """Send registered scripts in one write, their replies to be read later (`_script_replies`): the caller
        works while Redis runs them."""
        return Sent(self.connection, [("EVALSHA", s.sha, len(names), *names, *args) for s, names, args in calls])

    def _script_replies(self, sent: Sent, calls: Sequence[tuple[Script, Sequence[str], Sequence[Any]]]) -> list[Any]:
        """The replies of scripts `_send_scripts` sent, in order; as `_run_scripts` where they could not all be read
        (nothing sent, a connection lost) or one failed (a script Redis no longer holds is loaded; any other error
        raises)."""
        replies = sent.replies()
        if replies is None or any(isinstance(r, Exception) for r in replies):
            return self._run_scripts(calls)
        return replies

    def _run_scripts(self, calls: Sequence[tuple[Script, Sequence[str], Sequence[Any]]]) -> list[Any]:
        """Run registered scripts in one pipeline (one round trip) and return their replies, in order.

        A script Redis no longer holds (a restart, SCRIPT FLUSH) is loaded and the pipeline sent again; any
        other error is raised. (A `Script` called inside a pipeline would cost a SCRIPT EXISTS round trip.)
        """
        replies: list[Any] = []
        for attempt in range(2):
            pipe = self.connection.pipeline(transaction=False)
            for script, names, args in calls:
                pipe.evalsha(script.sha, len(names), *names, *args)
            replies = pipe.execute(raise_on_error=False)
            lost = {id(s): s for (s, _, _), r in zip(calls, replies, strict=True) if isinstance(r, NoScriptError)}
            if not lost or attempt:
                break
            for script in lost.values():
                self.connection.script_load(script.script)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    def freshness(self, project_id: str) -> dict[str, Any]:
        """How far each stage is behind the newest durable minute of the project (read-your-writes, visible)."""
        require_project(project_id)
        now = time.time()
        pipe = self.connection.pipeline(transaction=False)
        pipe.hgetall(keys.log_head(project_id))
        pipe.hgetall(keys.index_head(project_id))
        log_head, index_head = (_decoded(raw) for raw in pipe.execute())
        return _freshness(log_head, index_head, now)

    def _count_access(self, project_id: str, minute_ids: Sequence[str]) -> None:
        self._unanswered.send(_access_counters(project_id, minute_ids))

    def _referenced(self, project_id: str, wanted: list[str], sent: Sent | None) -> list[dict[str, Any]]:
        """The referenced minutes a context wants, from the cache's reply `sent` read now (read again the plain way
        where it could not be) or the log."""
        if not wanted or sent is None:
            return []
        replies = sent.replies()
        values = replies[0] if replies is not None else None
        if not isinstance(values, list):
            values = self.connection.hmget(keys.minute_by_id(project_id), wanted)
        cached = {i: b for i, b in zip(wanted, values, strict=True) if b is not None}
        return self._by_ids(project_id, wanted, cached)


def _freshness(log_head: dict[str, str], index_head: dict[str, str], now: float) -> dict[str, Any]:
    """`ContextReader.freshness` from the two heads as read at `now`.

    Both heads are contiguous: every seq at or below the log head's is durable,
    every seq at or below the index head's is searchable. Above the index
    head, ``max_seq`` is the newest minute indexed and ``gaps`` counts the
    seqs below it still missing; ``behind`` is every durable minute not yet
    searchable (exact, whatever order the index workers finished in). A head
    written before ``max_seq`` existed reads as having no gaps.
    """
    durable_seq = int(log_head.get("seq", 0))
    indexed_seq = int(index_head.get("seq", 0))
    max_seq = max(indexed_seq, int(index_head.get("max_seq", 0)))
    gaps = int(index_head.get("gaps", 0))
    return {
        "durable": {
            "seq": durable_seq,
            "newest_id": log_head.get("id"),
            "age_s": round(now - float(log_head["durable_at"]), 3) if "durable_at" in log_head else None,
        },
        "cache": {"seq": durable_seq, "behind": 0},  # written by the log pool right after the fsync
        "index": {
            "seq": indexed_seq,
            "behind": max(0, durable_seq - max_seq) + gaps,
            "age_s": round(now - float(index_head["indexed_at"]), 3) if "indexed_at" in index_head else None,
            "max_seq": max_seq,
            "gaps": gaps,
        },
    }


def _chunk_lines(newest_first: Sequence[Chunk], room: int) -> tuple[list[dict[str, Any]], list[str]]:
    """The chunks a thread context shows, newest first, and their lines: the newest `k` in full and the older ones
    that decided something by their decisions (``compact``), `k` the most for which all of it fits in `room`."""
    full = [c.to_dict() for c in newest_first]
    compact = [{**d, "compact": True} for d in full]
    full_lines = [chunk_line(d) for d in full]
    compact_lines = [chunk_line(d) if d["decisions"] else "" for d in compact]
    compact_after = [0] * (len(full) + 1)  # compact_after[k]: what the compact lines of chunks k.. cost
    for i in range(len(full) - 1, -1, -1):
        compact_after[i] = compact_after[i + 1] + (line_cost(compact_lines[i]) if compact_lines[i] else 0)
    k, spent = 0, 0
    for i, line in enumerate(full_lines):
        spent += line_cost(line)
        if spent + compact_after[i + 1] > room:
            break
        k = i + 1
    if k == len(full):
        return full, full_lines
    items = full[:k] + [d for d, line in zip(compact[k:], compact_lines[k:], strict=True) if line]
    return items, full_lines[:k] + [line for line in compact_lines[k:] if line]


def distinct_episodes(episodes: Sequence[Episode]) -> list[Episode]:
    """A thread's episodes as a context shows them: most significant first (then newest), and one of each story:
    the same decision said three times over a thread is three episodes in the store and one line in a prompt
    (the most significant, newest one, kinds and title alike)."""
    seen: set[tuple[tuple[str, ...], str, str | None]] = set()
    out = []
    for episode in sorted(episodes, key=lambda e: (-e.significance, -e.last_seq)):
        story = (tuple(k.value for k in episode.kinds), episode.title.strip().lower(), episode.outcome)
        if story not in seen:
            seen.add(story)
            out.append(episode)
    return out


def _thread_ref(thread: str | None) -> ThreadRef | None:
    """The thread a context is built for, or None; ValueError naming ``thread`` when it names none."""
    if thread is None:
        return None
    try:
        return ThreadRef.parse(thread)
    except SummaryError as exc:
        raise ReaderError(f"thread: {exc.problem}") from None


def _tier_keys(project_id: str, task_id: str | None, include_global: bool) -> list[TierKey]:
    """The tier keys a context reads: its task's (when named), its project's, and global only when granted."""
    if not is_valid_project_id(project_id):
        return []  # no fact can live in a project the contract refuses: nothing to read
    tiers = [TierKey.for_project(project_id)]
    if task_id is not None:
        try:
            tiers.insert(0, TierKey.for_task(project_id, task_id))
        except InvalidFact as exc:
            raise ReaderError(f"task_id: {exc.problem}") from None
    if include_global:
        tiers.append(GLOBAL_KEY)
    return tiers


# Counts a read of each fact id (ARGV[2..]) in the read statistics hash KEYS[1], and its time (ARGV[1]).
_FACT_READS = """
for i = 2, #ARGV do
  redis.call('HINCRBY', KEYS[1], ARGV[i], 1)
  redis.call('HSET', KEYS[1], ARGV[i] .. ':at', ARGV[1])
end
return #ARGV - 1
"""


def _access_counters(project_id: str, minute_ids: Sequence[str]) -> list[tuple[Any, ...]]:
    """The commands that count one access to each of these minutes (`keys.access_counts`)."""
    return [("HINCRBY", keys.access_counts(project_id), minute_id, 1) for minute_id in minute_ids]


def _fact_read_counters(kept: Sequence[KnownFact], at: str) -> list[tuple[Any, ...]]:
    """The commands that count the reads of the facts a context keeps (`keys.fact_reads`), one a tier's hash."""
    by_hash: dict[str, list[str]] = {}
    for known in kept:
        by_hash.setdefault(keys.fact_reads(known.fact.tier_key), []).append(known.fact.id)
    return [("EVAL", _FACT_READS, 1, name, at, *ids) for name, ids in by_hash.items()]


def _hash(flat: Sequence[bytes]) -> dict[bytes, bytes]:
    """A hash from HGETALL inside a script: field, value, field, value, ..."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _decoded(raw: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in raw.items()}
