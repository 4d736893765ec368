"""PAIR: check an agent's output against its task's success criteria, and revise it from the project's memory.

A round: a *fresh* judge (it sees only the task, the criteria and the output,
never the author's context) scores the output 0-100 and names the gaps, one per
criterion not met; for each gap PVM retrieves the project's top memories
(hybrid search over minutes and facts); a reviser writes a revision from the
gaps and those memories; the next round judges the revision. The loop stops at
the target score (PVM_PAIR_TARGET, 95), at the round limit (PVM_PAIR_ROUNDS, 3:
at most that many judgments and one revision fewer), or when a revision changes
nothing. It returns every round and the best output it saw.

Every judgment is a ``pair_evaluation`` minute and every revision a
``pair_revision`` minute (`contracts.pair`), written through the caller's
`record` (an `Emitter.emit`, or the API's append), so a run is auditable and
replay never calls a model; the evaluate pool reads a task's newest score as
its outcome.

    with Pair.from_settings(settings) as pair:
        result = pair.run("apollo", task, criteria, output, task_id="T-7")
    result.to_dict()["rounds"]  # [{"round": 1, "score": 62, "gaps": [...], "retrieved": [...], "revision": ...}]

Judges and revisers are protocols (`Judge`, `Reviser`, in `pvm.pair_roles`
with their records and re-exported here): the deterministic `ChecklistJudge`
(`pvm.checklist`) and `ExtractiveReviser` (`pvm.pair_roles`) are the offline
defaults; `pvm.pair_llm` has the LLM pair (PVM_PAIR_JUDGE=llm,
PVM_PAIR_REVISER=llm), which fall back to these for a round their model fails.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from contracts.facts import as_sentence, is_valid_task_id, sentence_key
from contracts.memory import FactHit, SearchFilters, SearchHit, SummaryHit
from contracts.minute import Minute
from contracts.pair import (
    MAX_OUTPUT_CHARS,
    MAX_ROUNDS,
    MAX_TASK_CHARS,
    PAIR_EVENT_TYPES,
    Gap,
    PairError,
    PairEvaluation,
    PairRevision,
    Retrieved,
    check_criteria,
    check_run_size,
    check_text,
    pair_minute,
)
from pvm import defaults
from pvm.checklist import ChecklistJudge, Verdict
from pvm.pair_roles import (
    ExtractiveReviser,
    GapMemories,
    Judge,
    Memory,
    Retriever,
    Revised,
    Reviser,
    covers,
    sentences,
)

if TYPE_CHECKING:
    from pvm.config import Settings

__all__ = [
    "MEMORY_TEXT_KEYS",
    "STOP_NO_PROGRESS",
    "STOP_ROUNDS",
    "STOP_TARGET",
    "ChecklistJudge",
    "ExtractiveReviser",
    "GapMemories",
    "Judge",
    "Memory",
    "Pair",
    "PairResult",
    "PairRound",
    "Record",
    "Retriever",
    "Revised",
    "Reviser",
    "SearchRetriever",
    "Searcher",
    "Verdict",
    "covers",
    "gap_query",
    "memory_of",
    "run_pair",
    "sentences",
]

STOP_TARGET = "target"  # the score reached the target
STOP_ROUNDS = "rounds"  # the round limit was reached
STOP_NO_PROGRESS = "no_progress"  # the reviser changed nothing: another round would judge the same text
# What a minute's memory says, besides its note, in order: the texts a reviser can quote.
MEMORY_TEXT_KEYS = ("resolution", "decision", "recommendation", "assignment_reasoning", "reason", "error", "outcome")


# -- retrieval -----------------------------------------------------------------------------------------------------


class Searcher(Protocol):
    """`pvm.search.HybridSearch`, as far as PAIR uses it."""

    def search(
        self, project_id: str, query: str, filters: SearchFilters | None = None, k: int = ..., *, kinds: Collection[str]
    ) -> Sequence[SearchHit | FactHit]: ...


def memory_of(hit: SearchHit | FactHit | SummaryHit) -> Memory:
    """A search hit as a memory: a fact's sentence; a chunk's summary or an episode's story; a minute's note and
    the texts of its data."""
    if isinstance(hit, FactHit):
        return Memory(hit.fact_id, "fact", str(hit.fact.get("text") or ""), hit.score)
    if isinstance(hit, SummaryHit):
        return Memory(hit.summary_id, "summary", as_sentence(hit.text) if hit.text.strip() else "", hit.score)
    minute = hit.minute
    data = minute.get("data") or {}
    texts = [minute.get("memory_note")] + [data.get(key) for key in MEMORY_TEXT_KEYS]
    parts = [t.strip() for t in texts if isinstance(t, str) and t.strip()]
    return Memory(hit.minute_id, "minute", " ".join(as_sentence(p) for p in dict.fromkeys(parts)), hit.score)


class SearchRetriever:
    """The project's minutes, facts and thread summaries (chunks, episodes) for a gap, by hybrid search ranked
    together; PAIR's own minutes are never retrieved."""

    def __init__(self, searcher: Searcher, kinds: Collection[str] = ("minute", "fact", "summary")) -> None:
        self.searcher = searcher
        self.kinds = tuple(kinds)

    def retrieve(self, project_id: str, query: str, k: int) -> list[Memory]:
        # PAIR minutes are left out (an earlier run's revision would quote itself): a few extra hits make room for
        # them, and a search that lost more than that to them asks again for many more.
        asked = k + defaults.PAIR_SEARCH_EXTRA
        while True:
            hits = self.searcher.search(project_id, query, SearchFilters(), asked, kinds=self.kinds)
            found = said_once(m for m in (memory_of(h) for h in hits if not _is_pair(h)) if m.text)
            if len(found) >= k or len(hits) < asked or asked >= defaults.PAIR_SEARCH_MAX:
                return found[:k]
            asked = min(asked * 4, defaults.PAIR_SEARCH_MAX)


def said_once(memories: Iterable[Memory]) -> list[Memory]:
    """The memories in their order, each text once (the first, best-ranked, of those that say it, whatever the case,
    spacing or final stop): agents repeat one another, and a gap's memories listed one sentence five times."""
    seen: set[str] = set()
    out: list[Memory] = []
    for memory in memories:
        key = sentence_key(memory.text)
        if key not in seen:
            seen.add(key)
            out.append(memory)
    return out


def _is_pair(hit: SearchHit | FactHit | SummaryHit) -> bool:
    return isinstance(hit, SearchHit) and hit.minute.get("event_type") in PAIR_EVENT_TYPES


def gap_query(gap: Gap) -> str:
    """What is searched for a gap: the criterion, then what the output lacks (what it must not hold is no query)."""
    return " ".join([gap.criterion, *gap.missing])[:MAX_TASK_CHARS]


# -- the loop ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PairRound:
    """One round: the judgment, and (unless it ended the loop) the memories retrieved and the revision."""

    round: int
    score: int
    gaps: tuple[Gap, ...]
    judge: str
    judge_fallback: str | None
    evaluation_id: str
    retrieved: tuple[GapMemories, ...] = ()
    revision: str | None = None
    reviser: str | None = None
    reviser_fallback: str | None = None
    revision_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "score": self.score,
            "gaps": [g.to_dict() for g in self.gaps],
            "judge": self.judge,
            "judge_fallback": self.judge_fallback,
            "evaluation_id": self.evaluation_id,
            "retrieved": [
                {"criterion": r.gap.criterion, "query": r.query, "memories": [m.to_dict() for m in r.memories]}
                for r in self.retrieved
            ],
            "revision": self.revision,
            "reviser": self.reviser,
            "reviser_fallback": self.reviser_fallback,
            "revision_id": self.revision_id,
        }


@dataclass(frozen=True, slots=True)
class PairResult:
    """A finished run: its rounds, the best output seen and its score, and why it stopped."""

    run_id: str
    project_id: str
    task_id: str | None
    target: int
    max_rounds: int
    rounds: tuple[PairRound, ...]
    output: str  # the best-scored output (the first of equals): the original when no revision scored higher
    score: int
    stopped: str  # STOP_TARGET, STOP_ROUNDS or STOP_NO_PROGRESS
    minute_ids: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """The run as plain JSON values (what the API answers)."""
        return {
            "run_id": self.run_id,
            "project_id": self.project_id,
            "task_id": self.task_id,
            "target": self.target,
            "max_rounds": self.max_rounds,
            "score": self.score,
            "reached_target": self.score >= self.target,
            "stopped": self.stopped,
            "output": self.output,
            "rounds": [r.to_dict() for r in self.rounds],
            "minute_ids": list(self.minute_ids),
        }


Record = Callable[[Minute], object]


class Pair:
    """The PAIR loop over a judge, a reviser and a retriever; minutes go to `record` (None: not recorded)."""

    def __init__(
        self,
        judge: Judge | None = None,
        reviser: Reviser | None = None,
        retriever: Retriever | None = None,
        record: Record | None = None,
        *,
        target: int = defaults.PAIR_TARGET,
        rounds: int = defaults.PAIR_ROUNDS,
        k: int = defaults.PAIR_K,
        close: Callable[[], None] | None = None,
    ) -> None:
        if isinstance(target, bool) or not isinstance(target, int) or not 1 <= target <= 100:
            raise ValueError(f"target={target!r} must be a score from 1 to 100 (PVM_PAIR_TARGET)")
        if isinstance(rounds, bool) or not isinstance(rounds, int) or not 1 <= rounds <= MAX_ROUNDS:
            raise ValueError(f"rounds={rounds!r} must be from 1 to {MAX_ROUNDS} (PVM_PAIR_ROUNDS)")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= defaults.PAIR_MAX_K:
            raise ValueError(f"k={k!r} must be from 1 to {defaults.PAIR_MAX_K} memories per gap (PVM_PAIR_K)")
        self.judge = judge or ChecklistJudge()
        self.reviser = reviser or ExtractiveReviser()
        self.retriever = retriever
        self.record = record
        self.target = target
        self.rounds = rounds
        self.k = k
        self._close = close

    @classmethod
    def from_settings(
        cls, settings: Settings, *, retriever: Retriever | None = None, record: Record | None = None
    ) -> Pair:
        """The loop the settings ask for: PVM_PAIR_JUDGE / _REVISER / _TARGET / _ROUNDS / _K.

        Without `retriever`, this process's search engine (`pvm.engines`, the
        server extra); without `record`, an `Emitter` the returned loop owns:
        use it as a context manager, or call `close()`.
        """
        closers: list[Callable[[], None]] = []
        judge: Judge = ChecklistJudge()
        reviser: Reviser = ExtractiveReviser()
        if settings.pair_judge == "llm" or settings.pair_reviser == "llm":
            from pvm.llm import require_llm
            from pvm.pair_llm import LLMJudge, LLMReviser

            llm = require_llm(settings, purpose="PVM_PAIR_JUDGE=llm / PVM_PAIR_REVISER=llm")
            closers.append(llm.close)
            if settings.pair_judge == "llm":
                judge = LLMJudge(llm)
            if settings.pair_reviser == "llm":
                reviser = LLMReviser(llm)
        if retriever is None:
            from pvm.engines import searcher_for

            retriever = SearchRetriever(searcher_for(settings))  # type: ignore[arg-type]
        if record is None:
            from pvm.emitter import Emitter

            emitter = Emitter(settings=settings)
            record = emitter.emit
            closers.append(emitter.close)

        def close() -> None:
            for closer in closers:
                closer()

        return cls(
            judge,
            reviser,
            retriever,
            record,
            target=settings.pair_target,
            rounds=settings.pair_rounds,
            k=settings.pair_k,
            close=close,
        )

    def close(self) -> None:
        """Release what `from_settings` opened (the emitter is flushed)."""
        if self._close is not None:
            self._close()
            self._close = None

    def __enter__(self) -> Pair:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(
        self,
        project_id: str,
        task: str,
        criteria: Sequence[str],
        output: str,
        *,
        task_id: str | None = None,
        agent_id: str | None = None,
        rounds: int | None = None,
        target: int | None = None,
    ) -> PairResult:
        """Judge, retrieve, revise, re-judge until the target or the round limit; every round recorded as minutes.

        Raises `PairError` (a ValueError) naming the argument when the task,
        criteria or output cannot be judged, and `InvalidMinute` for a project,
        task or agent id that is not one.
        """
        task = check_text(task, "task", MAX_TASK_CHARS).strip()
        criteria = check_criteria(criteria)
        output = check_text(output, "output", MAX_OUTPUT_CHARS)
        check_run_size(task, criteria, output)
        limit = self.rounds if rounds is None else rounds
        goal = self.target if target is None else target
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_ROUNDS:
            raise PairError("rounds", f"{limit!r} must be from 1 to {MAX_ROUNDS}")
        if isinstance(goal, bool) or not isinstance(goal, int) or not 1 <= goal <= 100:
            raise PairError("target", f"{goal!r} must be a score from 1 to 100")
        if task_id is not None and not is_valid_task_id(task_id):
            raise PairError("task_id", f"{str(task_id)[:40]!r} is not a task id: non-blank text of at most 128 chars")
        # Checked before the first judgment: a run that cannot be recorded is not run.
        Minute(project_id=project_id, event_type="pair_evaluation", agent_id=agent_id, data={"task_id": task_id})
        run_id = uuid.uuid4().hex
        done: list[PairRound] = []
        minute_ids: list[str] = []
        best, best_score = output, -1
        previous: str | None = None
        current = output
        stopped = STOP_ROUNDS
        for number in range(1, limit + 1):
            verdict = self.judge.judge(task, criteria, current)
            evaluation = PairEvaluation(
                run_id,
                number,
                verdict.score,
                goal,
                verdict.judge,
                task,
                criteria,
                current,
                verdict.gaps,
                verdict.fallback,
            )
            evaluation_id = self._write(project_id, evaluation, task_id, agent_id, [previous] if previous else [])
            minute_ids.append(evaluation_id)
            if verdict.score > best_score:
                best, best_score = current, verdict.score
            judged = PairRound(number, verdict.score, verdict.gaps, verdict.judge, verdict.fallback, evaluation_id)
            if verdict.score >= goal:
                stopped = STOP_TARGET
                done.append(judged)
                break
            if number == limit:
                done.append(judged)
                break
            found = tuple(self._retrieve(project_id, gap) for gap in verdict.gaps)
            revised = self.reviser.revise(task, criteria, current, found)
            revision = PairRevision(
                run_id,
                number,
                revised.reviser,
                revised.text,
                tuple(Retrieved(r.gap.criterion, r.query, tuple(m.id for m in r.memories)) for r in found),
                revised.fallback,
            )
            cited = [m.id for r in found for m in r.memories if m.kind == "minute"]
            revision_id = self._write(
                project_id, revision, task_id, agent_id, list(dict.fromkeys([evaluation_id, *cited]))
            )
            minute_ids.append(revision_id)
            done.append(
                PairRound(
                    number,
                    verdict.score,
                    verdict.gaps,
                    verdict.judge,
                    verdict.fallback,
                    evaluation_id,
                    found,
                    revised.text,
                    revised.reviser,
                    revised.fallback,
                    revision_id,
                )
            )
            if revised.text.strip() == current.strip():
                stopped = STOP_NO_PROGRESS
                break
            previous, current = revision_id, revised.text
        return PairResult(
            run_id, project_id, task_id, goal, limit, tuple(done), best, best_score, stopped, tuple(minute_ids)
        )

    def _retrieve(self, project_id: str, gap: Gap) -> GapMemories:
        query = gap_query(gap)
        if self.retriever is None or not gap.missing:
            return GapMemories(gap, query, ())
        return GapMemories(gap, query, tuple(self.retriever.retrieve(project_id, query, self.k)))

    def _write(
        self,
        project_id: str,
        change: PairEvaluation | PairRevision,
        task_id: str | None,
        agent_id: str | None,
        references: Sequence[str],
    ) -> str:
        minute = pair_minute(project_id, change, task_id=task_id, agent_id=agent_id, references=references[:256])
        if self.record is not None:
            self.record(minute)
        return minute.id


def run_pair(
    settings: Settings,
    project_id: str,
    task: str,
    criteria: Sequence[str],
    output: str,
    *,
    task_id: str | None = None,
    agent_id: str | None = None,
) -> dict[str, Any]:
    """One PAIR run as the settings configure it, as plain JSON values (`PairResult.to_dict`)."""
    with Pair.from_settings(settings) as pair:
        return pair.run(project_id, task, criteria, output, task_id=task_id, agent_id=agent_id).to_dict()
