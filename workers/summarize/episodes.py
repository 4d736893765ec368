"""Episodes from minute patterns: what in a thread is worth remembering as one story, read minute by minute.

`observe` reads one minute of a thread (in log order) against what the thread left open (`OpenPatterns`)
and returns the episodes it makes:

- ``decision_made``: a ``decision`` minute;
- ``pivot``: a decision that supersedes an earlier one of the thread: it references it
  (``context_references`` or ``data.supersedes``), or decides the same ``data.topic`` again;
- ``issue_identified``: a ``task_failed`` or ``conflict_detected`` minute;
- ``task_completed``: a ``task_completed`` minute;
- ``problem_solved``: a task's completion after its failures (linking them);
- ``breakthrough``: a minute that says so (``data.breakthrough`` true, or the word in its note), or a
  completion at ``success_criteria_met`` >= 80 after two failures or more.

`add` puts an episode among a thread's: one that shares a minute with an earlier one merges into it
(kinds together, most significant first; significance the higher; valence weighted by significance;
minutes, participants and the seq range joined), so a failure, its fix and the completion are one
story. Pure and deterministic: the same minutes in the same order give the same episodes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from contracts.summaries import (
    MAX_EPISODE_MINUTES,
    MAX_OUTCOME_CHARS,
    MAX_PARTICIPANTS,
    MAX_SUMMARY_CHARS,
    MAX_TITLE_CHARS,
    Episode,
    EpisodeKind,
    ThreadRef,
)
from pvm import defaults
from workers.summarize.summarizers import Logged, minute_texts

# significance and valence of each pattern
WEIGHTS: dict[EpisodeKind, tuple[float, float]] = {
    EpisodeKind.DECISION_MADE: (0.6, 0.2),
    EpisodeKind.PIVOT: (0.75, 0.0),
    EpisodeKind.ISSUE_IDENTIFIED: (0.5, -0.6),
    EpisodeKind.TASK_COMPLETED: (0.4, 0.5),
    EpisodeKind.PROBLEM_SOLVED: (0.8, 0.7),
    EpisodeKind.BREAKTHROUGH: (0.9, 0.9),
}
BREAKTHROUGH_SUCCESS = 80  # success_criteria_met of a completion after repeated failures that is a breakthrough
_BREAKTHROUGH_WORD = re.compile(r"\bbreakthrough\b", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Seen:
    """A minute an open pattern remembers: its id, seq, agent and first line of text."""

    id: str
    seq: int
    agent: str | None
    text: str

    def to_list(self) -> list[Any]:
        return [self.id, self.seq, self.agent, self.text]

    @classmethod
    def from_list(cls, raw: Sequence[Any]) -> Seen:
        return cls(str(raw[0]), int(raw[1]), None if raw[2] is None else str(raw[2]), str(raw[3]))


@dataclass
class OpenPatterns:
    """What a thread left open: each task's failures not yet followed by its completion, each decision by id and
    by topic. Bounded (`SUMMARY_OPEN_PATTERNS` each; the oldest goes)."""

    failures: dict[str, list[Seen]] = field(default_factory=dict)
    decisions: dict[str, Seen] = field(default_factory=dict)  # minute id -> the decision
    topics: dict[str, str] = field(default_factory=dict)  # data.topic -> id of its newest decision

    def to_dict(self) -> dict[str, Any]:
        return {
            "failures": {t: [s.to_list() for s in seen] for t, seen in self.failures.items()},
            "decisions": [s.to_list() for s in self.decisions.values()],
            "topics": dict(self.topics),
        }

    @classmethod
    def from_dict(cls, raw: Any) -> OpenPatterns:
        if not isinstance(raw, dict):
            return cls()
        decisions = [Seen.from_list(s) for s in raw.get("decisions", ())]
        return cls(
            failures={str(t): [Seen.from_list(s) for s in seen] for t, seen in raw.get("failures", {}).items()},
            decisions={s.id: s for s in decisions},
            topics={str(k): str(v) for k, v in raw.get("topics", {}).items()},
        )

    def _bound(self) -> None:
        for table in (self.failures, self.decisions, self.topics):
            while len(table) > defaults.SUMMARY_OPEN_PATTERNS:
                del table[next(iter(table))]  # oldest first: dicts keep insertion order


def _first_line(minute_text: list[str], fallback: str) -> str:
    text = minute_text[0] if minute_text else fallback
    return text if len(text) <= 120 else text[:119] + "…"


def _episode(
    project_id: str,
    thread: ThreadRef,
    kind: EpisodeKind,
    title: str,
    summary: str,
    minutes: Sequence[Seen],
    outcome: str | None = None,
    valence: float | None = None,
) -> Episode:
    significance, default_valence = WEIGHTS[kind]
    return Episode(
        project_id=project_id,
        thread=thread,
        kinds=(kind,),
        title=title[:MAX_TITLE_CHARS],
        summary=summary[:MAX_SUMMARY_CHARS],
        minute_ids=tuple(dict.fromkeys(s.id for s in minutes)),
        first_seq=min(s.seq for s in minutes),
        last_seq=max(s.seq for s in minutes),
        participants=tuple(dict.fromkeys(s.agent for s in minutes if s.agent))[:MAX_PARTICIPANTS],
        outcome=None if outcome is None else outcome[:MAX_OUTCOME_CHARS],
        significance=significance,
        valence=default_valence if valence is None else max(-1.0, min(1.0, valence)),
    )


def observe(project_id: str, thread: ThreadRef, logged: Logged, state: OpenPatterns) -> list[Episode]:
    """The episodes one minute of `thread` makes, given (and updating) what the thread left open."""
    m = logged.minute
    texts = minute_texts(m)
    seen = Seen(m.id, logged.seq, m.agent_id, _first_line(texts, m.event_type))
    task = m.data.get("task_id")
    task_name = task if isinstance(task, str) and task else None
    made: list[Episode] = []
    if m.event_type == "decision":
        made.append(
            _episode(project_id, thread, EpisodeKind.DECISION_MADE, f"Decision: {seen.text}", seen.text, [seen])
        )
        earlier = _superseded(m.context_references, m.data, state)
        if earlier is not None and earlier.id != m.id:
            made.append(
                _episode(
                    project_id,
                    thread,
                    EpisodeKind.PIVOT,
                    f"Pivot: {seen.text}",
                    f"{seen.text} (instead of: {earlier.text})",
                    [earlier, seen],
                )
            )
        state.decisions[m.id] = seen
        topic = m.data.get("topic")
        if isinstance(topic, str) and topic.strip():
            state.topics[topic.strip().lower()] = m.id
    elif m.event_type in ("task_failed", "conflict_detected"):
        what = f"{task_name} failed" if m.event_type == "task_failed" and task_name else m.event_type.replace("_", " ")
        made.append(
            _episode(project_id, thread, EpisodeKind.ISSUE_IDENTIFIED, f"Issue: {what}", seen.text, [seen], what)
        )
        if m.event_type == "task_failed" and task_name:
            state.failures.setdefault(task_name, []).append(seen)
    elif m.event_type == "task_completed":
        score = m.data.get("success_criteria_met")
        success = float(score) if isinstance(score, (int, float)) else None
        outcome = f"{task_name or 'task'} completed" + (f" ({success:g}%)" if success is not None else "")
        valence = 0.5 if success is None else success / 100.0
        made.append(
            _episode(
                project_id,
                thread,
                EpisodeKind.TASK_COMPLETED,
                f"Completed: {task_name or seen.text}",
                seen.text,
                [seen],
                outcome,
                valence,
            )
        )
        failures = state.failures.pop(task_name, []) if task_name else []
        if failures:
            tried = "; ".join(f.text for f in failures[-3:])
            made.append(
                _episode(
                    project_id,
                    thread,
                    EpisodeKind.PROBLEM_SOLVED,
                    f"Problem solved: {task_name}",
                    f"{task_name} failed {len(failures)} time(s) ({tried}), then: {seen.text}",
                    [*failures[-MAX_EPISODE_MINUTES + 1 :], seen],
                    outcome,
                )
            )
            if len(failures) >= 2 and success is not None and success >= BREAKTHROUGH_SUCCESS:
                made.append(
                    _episode(
                        project_id,
                        thread,
                        EpisodeKind.BREAKTHROUGH,
                        f"Breakthrough: {task_name}",
                        f"after {len(failures)} failures: {seen.text}",
                        [failures[-1], seen],
                        outcome,
                    )
                )
    said_so = m.data.get("breakthrough") is True or any(_BREAKTHROUGH_WORD.search(t) for t in texts)
    if said_so and not any(EpisodeKind.BREAKTHROUGH in e.kinds for e in made):
        made.append(
            _episode(project_id, thread, EpisodeKind.BREAKTHROUGH, f"Breakthrough: {seen.text}", seen.text, [seen])
        )
    state._bound()
    return made


def _superseded(references: Sequence[str], data: dict[str, Any], state: OpenPatterns) -> Seen | None:
    """The earlier decision a decision supersedes: one it names (data.supersedes, then its references), else the
    newest one of its topic."""
    supersedes = data.get("supersedes")
    named = [supersedes] if isinstance(supersedes, str) else []
    for ref in [*named, *references]:
        if ref in state.decisions:
            return state.decisions[ref]
    topic = data.get("topic")
    if isinstance(topic, str) and topic.strip():
        newest = state.topics.get(topic.strip().lower())
        if newest is not None:
            return state.decisions.get(newest)
    return None


def merge(a: Episode, b: Episode) -> Episode:
    """One episode of two that share a minute: `a` is the earlier, its id (first minute) stays."""
    lead, other = (a, b) if a.significance >= b.significance else (b, a)
    kinds = tuple(dict.fromkeys((*lead.kinds, *other.kinds)))
    ids = list(dict.fromkeys((*a.minute_ids, *b.minute_ids)))
    if len(ids) > MAX_EPISODE_MINUTES:
        ids = ids[:1] + ids[len(ids) - MAX_EPISODE_MINUTES + 1 :]
    weight = a.significance + b.significance
    valence = (a.valence * a.significance + b.valence * b.significance) / weight if weight else 0.0
    summary = lead.summary if other.summary in lead.summary else f"{lead.summary} — {other.summary}"
    return Episode(
        project_id=a.project_id,
        thread=a.thread,
        kinds=kinds,
        title=lead.title,
        summary=summary[:MAX_SUMMARY_CHARS],
        minute_ids=tuple(ids),
        first_seq=min(a.first_seq, b.first_seq),
        last_seq=max(a.last_seq, b.last_seq),
        participants=tuple(dict.fromkeys((*a.participants, *b.participants)))[:MAX_PARTICIPANTS],
        outcome=b.outcome or a.outcome,
        significance=max(a.significance, b.significance),
        valence=round(max(-1.0, min(1.0, valence)), 4),
    )


def add(episodes: list[Episode], new: Episode, most: int = defaults.SUMMARY_MAX_EPISODES) -> list[Episode]:
    """`episodes` with `new` among them: merged into every earlier one it shares a minute with; bounded by `most`
    (the least significant, then the oldest, goes)."""
    merged = new
    kept: list[Episode] = []
    for old in episodes:
        if set(old.minute_ids) & set(merged.minute_ids):
            merged = merge(old, merged) if old.first_seq <= merged.first_seq else merge(merged, old)
        else:
            kept.append(old)
    kept.append(merged)
    kept.sort(key=lambda e: (e.first_seq, e.id))
    while len(kept) > most:
        weakest = min(range(len(kept)), key=lambda i: (kept[i].significance, kept[i].last_seq))
        del kept[weakest]
    return kept
