"""The PAIR roles and records that the loop (`pvm.pair`) and the LLM pair (`pvm.pair_llm`) share.

The judge, reviser and retriever protocols, what they pass (`Memory`,
`GapMemories`, `Revised`), and the offline `ExtractiveReviser` with its
sentence helpers.

`pvm.pair` runs the loop over these roles and `pvm.pair_llm` implements the
LLM judge and reviser against them (falling back to `ExtractiveReviser` for a
round their model fails); both import this module, and `pvm.pair_llm` never
imports `pvm.pair`, so the two do not import each other in a circle.
`pvm.pair` re-exports every name here that it offered before.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from contracts.pair import MAX_OUTPUT_CHARS, Gap
from pvm import defaults
from pvm.checklist import Verdict, content_stems, normalized, stem, words

_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")


# -- the roles -----------------------------------------------------------------------------------------------------


class Judge(Protocol):
    """Scores an output against success criteria. It is given nothing but the task, the criteria and the output."""

    name: str

    def judge(self, task: str, criteria: Sequence[str], output: str) -> Verdict: ...


@dataclass(frozen=True, slots=True)
class Memory:
    """A memory retrieved for a gap: a minute or a fact, its id, the text a reviser may quote, its search score."""

    id: str
    kind: str  # "minute", "fact" or "summary" (a thread's chunk or episode)
    text: str
    score: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "text": self.text, "score": round(self.score, 4)}


@dataclass(frozen=True, slots=True)
class GapMemories:
    """A gap, the query that searched for it, and the memories found, best first."""

    gap: Gap
    query: str
    memories: tuple[Memory, ...]


@dataclass(frozen=True, slots=True)
class Revised:
    """A reviser's answer: the revised output, who revised it, why the configured reviser did not (else None)."""

    text: str
    reviser: str
    fallback: str | None = None


class Reviser(Protocol):
    """Writes a revised output from the gaps and the memories retrieved for them."""

    name: str

    def revise(self, task: str, criteria: Sequence[str], output: str, gaps: Sequence[GapMemories]) -> Revised: ...


class Retriever(Protocol):
    """Finds a project's memories for a text."""

    def retrieve(self, project_id: str, query: str, k: int) -> list[Memory]: ...


# -- the offline reviser -------------------------------------------------------------------------------------------


def _label_stems(label: str) -> list[tuple[str, ...]]:
    """A missing label as alternatives of stem sets: ``Postgres or MySQL`` -> [(postgres,), (mysql,)]."""
    out = []
    for part in re.split(r"\s+or\s+", label.lower()):
        part = re.sub(r"\(has \d+\)", "", part)
        stems = tuple(stem(w) for w in words(part) if w not in _QUIET)
        if stems:
            out.append(stems)
    return out


_QUIET = frozenset(("the", "a", "an", "of", "to", "and", "is", "are", "in", "for", "on", "with", "not"))


def covers(sentence_stems: frozenset[str], label: str) -> bool:
    """Whether a sentence holds what a missing label names (any alternative; most of a long one's words)."""
    for stems in _label_stems(label):
        held = sum(s in sentence_stems for s in stems)
        if held == len(stems) or (len(stems) > 2 and held / len(stems) >= defaults.PAIR_LABEL_COVER):
            return True
    return False


def sentences(text: str) -> list[str]:
    """A text's sentences, split after end punctuation and at line breaks, for quoting and dropping one by one."""
    return [s.strip() for s in _SENTENCE.split(text) if s.strip()]


class ExtractiveReviser:
    """Revises without a model: quotes the retrieved sentences that fill each gap, cited by id; drops forbidden ones.

    For each gap, the sentence of the retrieved memories that holds the most
    missing terms not yet covered is appended (``<sentence> [<memory id>]``),
    then the next, until every term is covered or no sentence adds one; of
    equals, the one sharing more words with the rest of the criterion. Only
    sentences sharing two of those words (or all, when it has fewer) are
    candidates: for "Names who the billing service fix was handed to", a
    sentence about the billing service. A sentence of the output holding all of a forbidden term's words
    is removed.
    Nothing is invented: a term no memory holds stays missing.
    """

    name = "extractive"

    def revise(self, task: str, criteria: Sequence[str], output: str, gaps: Sequence[GapMemories]) -> Revised:
        kept = sentences(output) if any(g.gap.forbidden for g in gaps) else None
        if kept is not None:
            banned = [label for g in gaps for label in g.gap.forbidden]
            kept = [s for s in kept if not any(_holds_all(s, label) for label in banned)]
        have = frozenset(stem(w) for w in words(output if kept is None else " ".join(kept)))
        added: list[str] = []
        quoted: set[str] = set()
        for entry in gaps:
            wanted = [label for label in entry.gap.missing if not covers(have, label)]
            # What the criterion is about besides what is missing: a sentence holding little of it is about
            # something else ("the search index fix was handed to dba" names no owner of the billing service fix).
            about = content_stems(entry.gap.criterion) - content_stems(" ".join(entry.gap.missing))
            enough = min(defaults.PAIR_ABOUT_WORDS, len(about))
            candidates = [
                (s, m.id, held)
                for m in entry.memories
                for s in sentences(m.text)
                if normalized(s) not in quoted
                for held in (frozenset(stem(w) for w in words(s)),)
                if len(about & held) >= enough
            ]
            while wanted and candidates:
                best, best_id, best_stems, gain = None, "", frozenset[str](), (0, 0)
                for s, memory_id, stems in candidates:
                    count = (sum(covers(stems, label) for label in wanted), len(about & stems))
                    if count[0] and count > gain:
                        best, best_id, best_stems, gain = s, memory_id, stems, count
                if best is None:
                    break
                added.append(f"{best} [{best_id}]")
                quoted.add(normalized(best))
                have |= best_stems
                wanted = [label for label in wanted if not covers(best_stems, label)]
                candidates = [c for c in candidates if c[0] != best]
        body = output.strip() if kept is None else " ".join(kept)
        text = "\n\n".join(p for p in (body, "\n".join(added)) if p)
        return Revised(text[:MAX_OUTPUT_CHARS] or output, self.name)


def _holds_all(sentence: str, label: str) -> bool:
    stems = frozenset(stem(w) for w in words(sentence))
    return all(s in stems for s in (stem(w) for w in words(label)))
