"""The PAIR loop's minutes: ``pair_evaluation`` (a judge's score and gaps) and ``pair_revision`` (a revised output).

PAIR checks an agent's output against its task's success criteria: a fresh judge
scores the output (0-100) and names the gaps, PVM retrieves memories for each gap,
a reviser writes a revision, and the judge sees the revision in the next round
(`pvm.pair`). Every round is written as minutes so the loop is auditable and
replay never calls a model: one ``pair_evaluation`` per judgment and one
``pair_revision`` per revision. Both name the run (`run_id`) and the round (from 1);
the evaluate pool reads a task's newest ``pair_evaluation`` as its outcome
(`workers.evaluate.evaluation.task_outcome`).

``pair_evaluation`` data (``task_id`` is optional, as on any minute)::

    {"run_id": "...", "round": 1, "score": 62, "target": 95, "judge": "checklist",
     "fallback": null | "why the LLM judge was not used this round",
     "task": "...", "criteria": ["...", ...], "output": "the text judged",
     "gaps": [{"criterion": "...", "missing": ["term", ...], "forbidden": ["term", ...], "score": 50}]}

``pair_revision`` data::

    {"run_id": "...", "round": 1, "reviser": "extractive", "fallback": null | "...",
     "retrieved": [{"criterion": "...", "query": "...", "ids": ["minute or fact id", ...]}],
     "revision": "the revised output"}

Like the ``fact_*`` changes, only PVM writes them (`PAIR_EVENT_TYPES` is part of
`contracts.summaries.SYSTEM_EVENT_TYPES`: the API refuses them from producers, a
forged score would move a task's accuracy). No I/O here; errors name the field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contracts.codec import MinuteTooLarge, encode_minute
from contracts.errors import ContractError
from contracts.minute import MAX_ID_LENGTH, EventType, Minute

MAX_TASK_CHARS = 4_000
MAX_CRITERIA = 32
MAX_CRITERION_CHARS = 500
MAX_OUTPUT_CHARS = 16_000  # an output or a revision: both fit one minute (64 KiB encoded) with room to spare
MAX_TERMS = 32  # missing or forbidden terms named by one gap
MAX_TERM_CHARS = 200
MAX_RETRIEVED = 16  # ids retrieved for one gap
MAX_NOTE_CHARS = 500  # a fallback's reason, a judge's or reviser's name
MAX_ROUNDS = 20
# Task, criteria and output together: what one pair_evaluation repeats, with its gaps, within one minute's 64 KiB.
MAX_RUN_CHARS = 24_000
KEPT_TERMS = 3  # a gap's terms kept per list when its minute would not fit otherwise (`pair_minute`)

PAIR_EVENT_TYPES = frozenset({EventType.PAIR_EVALUATION.value, EventType.PAIR_REVISION.value})


class PairError(ContractError):
    """A PAIR request or minute field is missing, mistyped or out of range; `field` names it."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"invalid PAIR record: {field}: {problem}")


def check_text(value: Any, field: str, limit: int) -> str:
    """`value` if it is non-empty text of at most `limit` characters; `PairError` naming `field` otherwise."""
    if not isinstance(value, str) or not value.strip():
        raise PairError(field, "must be non-empty text")
    if len(value) > limit:
        raise PairError(field, f"is {len(value)} characters; the limit is {limit}")
    return value


def check_criteria(value: Any, field: str = "criteria") -> tuple[str, ...]:
    """The success criteria: 1 to `MAX_CRITERIA` non-empty texts, each at most `MAX_CRITERION_CHARS`."""
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise PairError(field, f"must be a list of criteria (texts), got {type(value).__name__}")
    if not value or len(value) > MAX_CRITERIA:
        raise PairError(field, f"has {len(value)} criteria; give 1 to {MAX_CRITERIA}")
    return tuple(check_text(c, f"{field}[{i}]", MAX_CRITERION_CHARS).strip() for i, c in enumerate(value))


def check_run_size(task: str, criteria: Sequence[str], output: str) -> None:
    """`PairError` naming ``output`` when the task, criteria and output together pass `MAX_RUN_CHARS`."""
    size = len(task) + sum(len(c) for c in criteria) + len(output)
    if size > MAX_RUN_CHARS:
        raise PairError(
            "output",
            f"the task, criteria and output hold {size} characters in all; the limit is {MAX_RUN_CHARS} "
            "(MAX_RUN_CHARS, so that every round fits one minute): shorten the output or split the criteria",
        )


def check_score(value: Any, field: str = "score") -> int:
    """A score: a whole number from 0 to 100."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PairError(field, f"must be a number from 0 to 100, got {value!r}")
    if not 0 <= value <= 100 or value != int(value):
        raise PairError(field, f"{value!r} must be a whole number from 0 to 100")
    return int(value)


def _round(value: Any, field: str = "round") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ROUNDS:
        raise PairError(field, f"must be a round number from 1 to {MAX_ROUNDS}, got {value!r}")
    return value


def _terms(value: Any, field: str) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or len(value) > MAX_TERMS:
        raise PairError(field, f"must be a list of at most {MAX_TERMS} terms")
    return tuple(check_text(t, f"{field}[{i}]", MAX_TERM_CHARS) for i, t in enumerate(value))


def _note(value: Any, field: str) -> str | None:
    return None if value is None else check_text(value, field, MAX_NOTE_CHARS)


def _run_id(value: Any) -> str:
    text = check_text(value, "run_id", MAX_ID_LENGTH)
    if not text.replace("-", "").replace("_", "").isalnum():
        raise PairError("run_id", f"{text[:40]!r} may only hold letters, digits, - and _")
    return text


@dataclass(frozen=True, slots=True)
class Gap:
    """Where an output falls short of one criterion: the terms it lacks, the terms it must not hold, its score."""

    criterion: str
    missing: tuple[str, ...] = ()
    forbidden: tuple[str, ...] = ()  # terms the criterion rules out that the output holds
    score: int = 0  # how far the output meets this criterion, 0-100

    def __post_init__(self) -> None:
        check_text(self.criterion, "gaps.criterion", MAX_CRITERION_CHARS)
        check_score(self.score, "gaps.score")

    def to_dict(self) -> dict[str, Any]:
        return {
            "criterion": self.criterion,
            "missing": list(self.missing),
            "forbidden": list(self.forbidden),
            "score": self.score,
        }

    @classmethod
    def from_dict(cls, raw: Any, field: str = "gaps") -> Gap:
        if not isinstance(raw, Mapping):
            raise PairError(field, f"must be an object, got {type(raw).__name__}")
        return cls(
            criterion=check_text(raw.get("criterion"), f"{field}.criterion", MAX_CRITERION_CHARS),
            missing=_terms(raw.get("missing", []), f"{field}.missing"),
            forbidden=_terms(raw.get("forbidden", []), f"{field}.forbidden"),
            score=check_score(raw.get("score", 0), f"{field}.score"),
        )


@dataclass(frozen=True, slots=True)
class Retrieved:
    """The memories retrieved for one gap: the query sent and the ids found (minute or fact ids), best first."""

    criterion: str
    query: str
    ids: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"criterion": self.criterion, "query": self.query, "ids": list(self.ids)}

    @classmethod
    def from_dict(cls, raw: Any, field: str = "retrieved") -> Retrieved:
        if not isinstance(raw, Mapping):
            raise PairError(field, f"must be an object, got {type(raw).__name__}")
        ids = raw.get("ids")
        if not isinstance(ids, (list, tuple)) or len(ids) > MAX_RETRIEVED:
            raise PairError(f"{field}.ids", f"must be a list of at most {MAX_RETRIEVED} ids")
        return cls(
            criterion=check_text(raw.get("criterion"), f"{field}.criterion", MAX_CRITERION_CHARS),
            query=check_text(raw.get("query"), f"{field}.query", MAX_TASK_CHARS),
            ids=tuple(check_text(i, f"{field}.ids", MAX_ID_LENGTH) for i in ids),
        )


@dataclass(frozen=True, slots=True)
class PairEvaluation:
    """One judgment of the loop (the ``pair_evaluation`` minute's data)."""

    run_id: str
    round: int
    score: int
    target: int
    judge: str
    task: str
    criteria: tuple[str, ...]
    output: str
    gaps: tuple[Gap, ...] = ()
    fallback: str | None = None

    def __post_init__(self) -> None:
        _run_id(self.run_id)
        _round(self.round)
        check_score(self.score)
        check_score(self.target, "target")
        check_text(self.judge, "judge", MAX_NOTE_CHARS)
        check_text(self.task, "task", MAX_TASK_CHARS)
        check_criteria(self.criteria)
        check_text(self.output, "output", MAX_OUTPUT_CHARS)
        _note(self.fallback, "fallback")

    def to_data(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "round": self.round,
            "score": self.score,
            "target": self.target,
            "judge": self.judge,
            "fallback": self.fallback,
            "task": self.task,
            "criteria": list(self.criteria),
            "output": self.output,
            "gaps": [g.to_dict() for g in self.gaps],
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> PairEvaluation:
        gaps = data.get("gaps")
        if not isinstance(gaps, list) or len(gaps) > MAX_CRITERIA:
            raise PairError("gaps", f"must be a list of at most {MAX_CRITERIA} gaps")
        return cls(
            run_id=_run_id(data.get("run_id")),
            round=_round(data.get("round")),
            score=check_score(data.get("score")),
            target=check_score(data.get("target"), "target"),
            judge=check_text(data.get("judge"), "judge", MAX_NOTE_CHARS),
            task=check_text(data.get("task"), "task", MAX_TASK_CHARS),
            criteria=check_criteria(data.get("criteria")),
            output=check_text(data.get("output"), "output", MAX_OUTPUT_CHARS),
            gaps=tuple(Gap.from_dict(g, f"gaps[{i}]") for i, g in enumerate(gaps)),
            fallback=_note(data.get("fallback"), "fallback"),
        )


@dataclass(frozen=True, slots=True)
class PairRevision:
    """One revision of the loop (the ``pair_revision`` minute's data)."""

    run_id: str
    round: int
    reviser: str
    revision: str
    retrieved: tuple[Retrieved, ...] = ()
    fallback: str | None = None

    def __post_init__(self) -> None:
        _run_id(self.run_id)
        _round(self.round)
        check_text(self.reviser, "reviser", MAX_NOTE_CHARS)
        check_text(self.revision, "revision", MAX_OUTPUT_CHARS)
        _note(self.fallback, "fallback")

    def to_data(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "round": self.round,
            "reviser": self.reviser,
            "fallback": self.fallback,
            "retrieved": [r.to_dict() for r in self.retrieved],
            "revision": self.revision,
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> PairRevision:
        retrieved = data.get("retrieved")
        if not isinstance(retrieved, list) or len(retrieved) > MAX_CRITERIA:
            raise PairError("retrieved", f"must be a list of at most {MAX_CRITERIA} retrievals")
        return cls(
            run_id=_run_id(data.get("run_id")),
            round=_round(data.get("round")),
            reviser=check_text(data.get("reviser"), "reviser", MAX_NOTE_CHARS),
            revision=check_text(data.get("revision"), "revision", MAX_OUTPUT_CHARS),
            retrieved=tuple(Retrieved.from_dict(r, f"retrieved[{i}]") for i, r in enumerate(retrieved)),
            fallback=_note(data.get("fallback"), "fallback"),
        )


def pair_change(minute: Minute) -> PairEvaluation | PairRevision:
    """The evaluation or revision a PAIR minute records; `PairError` naming the field when its data is not one."""
    data = {k: v for k, v in minute.data.items() if k != "task_id"}
    if minute.event_type == EventType.PAIR_EVALUATION.value:
        return PairEvaluation.from_data(data)
    if minute.event_type == EventType.PAIR_REVISION.value:
        return PairRevision.from_data(data)
    raise PairError("event_type", f"{minute.event_type!r} is not one of {', '.join(sorted(PAIR_EVENT_TYPES))}")


def pair_minute(
    project_id: str,
    change: PairEvaluation | PairRevision,
    *,
    task_id: str | None = None,
    agent_id: str | None = None,
    references: Sequence[str] = (),
) -> Minute:
    """The minute that records one evaluation or revision (its `task_id` lets the evaluate pool score the task).

    One that would pass 64 KiB keeps less: an evaluation the first `KEPT_TERMS` missing and forbidden terms of
    each gap (then none), a revision the first `KEPT_TERMS` ids of each retrieval and a shorter query (then one
    id); the score, the criteria, the output and the revision stay whole.
    """
    if isinstance(change, PairEvaluation):
        event_type = EventType.PAIR_EVALUATION.value
        note = f"PAIR round {change.round}: {change.score}/100 by {change.judge}" + (
            f"; gaps: {'; '.join(g.criterion for g in change.gaps)}" if change.gaps else ""
        )
    else:
        event_type = EventType.PAIR_REVISION.value
        note = f"PAIR round {change.round}: revised by {change.reviser}"
    for kept in (None, KEPT_TERMS, 0):  # a minute that would pass 64 KiB keeps less of each gap
        data = _trimmed(change.to_data(), kept)
        if task_id is not None:
            data["task_id"] = task_id
        minute = Minute(
            project_id=project_id,
            event_type=event_type,
            agent_id=agent_id,
            data=data,
            memory_note=note[:MAX_NOTE_CHARS],
            context_references=tuple(references),
        )
        try:
            encode_minute(minute)
        except MinuteTooLarge:
            if kept == 0:
                raise
            continue
        return minute
    raise AssertionError("unreachable")


def _trimmed(data: dict[str, Any], kept: int | None) -> dict[str, Any]:
    """`data` with each gap's terms (an evaluation), or each retrieval's query and ids (a revision), cut to `kept`."""
    if kept is None:
        return data
    if "gaps" in data:
        data["gaps"] = [{**g, "missing": g["missing"][:kept], "forbidden": g["forbidden"][:kept]} for g in data["gaps"]]
    if "retrieved" in data:
        data["retrieved"] = [
            {**r, "query": r["query"][: MAX_TERM_CHARS * max(1, kept)], "ids": r["ids"][: max(1, kept)]}
            for r in data["retrieved"]
        ]
    return data
