"""PAIR's LLM judge and reviser, over the OpenAI-compatible chat client the facts pool uses (`pvm.llm`).

The judge is a fresh evaluator: its prompt holds the fixed instruction, the
task, the numbered criteria and the output, and nothing else (no memories, no
earlier rounds, no author's context). Its answer must be JSON valid against
`judge_schema` (`pvm.json_schema`, one repair by the client); a gap naming a
criterion twice is refused too. A round whose call fails (the endpoint down,
the breaker open, an answer rejected after its repair) is judged by the
checklist instead, and the verdict says so (`Verdict.fallback`), as the
reviser's falls back to the extractive reviser: the loop always ends within
its round limit.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from contracts.pair import MAX_CRITERION_CHARS, MAX_OUTPUT_CHARS, MAX_TERM_CHARS, MAX_TERMS, Gap
from pvm.checklist import ChecklistJudge, Verdict
from pvm.llm import LLMError
from pvm.pair_roles import ExtractiveReviser, GapMemories, Revised
from pvm.protocols import ChatModel

JUDGE_INSTRUCTION = (
    "You are a strict, independent evaluator. You are given a task, its numbered success criteria and an output. "
    "Judge only whether the output meets each criterion; you know nothing else about how it was made. "
    "Give a score from 0 (meets none) to 100 (meets every criterion fully), and one gap for each criterion the "
    "output does not fully meet: the criterion's number, its own score (0-100), the terms or facts the output "
    "lacks (missing) and anything it holds that the criterion rules out (forbidden). No gap for a criterion met."
)
REVISER_INSTRUCTION = (
    "You revise an output so that it meets its task's success criteria. You are given the task, the criteria, the "
    "output, and for each gap the memories of the project retrieved for it, each with its id. Fill each gap from "
    "those memories only, citing each memory you use as [id]; never invent facts. Remove what a criterion rules "
    "out. Keep everything else of the output. Answer with the whole revised output."
)
_FAILED = "the LLM {who} failed ({why}); the {instead} {did} this round"


def judge_schema(criteria_count: int) -> dict[str, Any]:
    """The JSON Schema of the judge's answer, for `criteria_count` criteria."""
    terms = {
        "type": "array",
        "maxItems": MAX_TERMS,
        "items": {"type": "string", "minLength": 1, "maxLength": MAX_TERM_CHARS},
    }
    return {
        "type": "object",
        "properties": {
            "score": {"type": "integer", "minimum": 0, "maximum": 100},
            "gaps": {
                "type": "array",
                "maxItems": criteria_count,
                "items": {
                    "type": "object",
                    "properties": {
                        "criterion": {"type": "integer", "minimum": 1, "maximum": criteria_count},
                        "score": {"type": "integer", "minimum": 0, "maximum": 100},
                        "missing": terms,
                        "forbidden": terms,
                    },
                    "required": ["criterion", "score", "missing", "forbidden"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["score", "gaps"],
        "additionalProperties": False,
    }


REVISER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"revision": {"type": "string", "minLength": 1, "maxLength": MAX_OUTPUT_CHARS}},
    "required": ["revision"],
    "additionalProperties": False,
}


def judge_messages(task: str, criteria: Sequence[str], output: str) -> list[dict[str, str]]:
    """The judge's whole prompt: the instruction, then the task, the numbered criteria and the output."""
    numbered = "\n".join(f"{i}. {c}" for i, c in enumerate(criteria, 1))
    return [
        {"role": "system", "content": JUDGE_INSTRUCTION},
        {"role": "user", "content": f"Task:\n{task}\n\nSuccess criteria:\n{numbered}\n\nOutput:\n{output}"},
    ]


class LLMJudge:
    """Judges with a chat model; the checklist judges a round the model fails (and the verdict says why)."""

    def __init__(self, llm: ChatModel, fallback: ChecklistJudge | None = None) -> None:
        self.llm = llm
        self.fallback = fallback or ChecklistJudge()
        self.name = f"llm:{getattr(llm, 'model', 'chat')}"[:MAX_CRITERION_CHARS]

    def judge(self, task: str, criteria: Sequence[str], output: str) -> Verdict:
        try:
            answer = self.llm.complete_json(
                judge_messages(task, criteria, output), judge_schema(len(criteria)), name="pair_judge"
            ).data
            gaps = _gaps(answer["gaps"], criteria)
        except (LLMError, ValueError) as error:
            verdict = self.fallback.judge(task, criteria, output)
            why = _FAILED.format(who="judge", why=_short(error), instead="checklist", did="judged")
            return Verdict(verdict.score, verdict.gaps, verdict.judge, why, verdict.unchecked)
        return Verdict(int(answer["score"]), gaps, self.name)


def _gaps(raw: Sequence[dict[str, Any]], criteria: Sequence[str]) -> tuple[Gap, ...]:
    seen: set[int] = set()
    gaps = []
    for item in raw:
        number = int(item["criterion"])
        if number in seen:
            raise ValueError(f"the answer names criterion {number} in two gaps")
        seen.add(number)
        gaps.append(Gap(criteria[number - 1], tuple(item["missing"]), tuple(item["forbidden"]), int(item["score"])))
    return tuple(sorted(gaps, key=lambda g: criteria.index(g.criterion)))


def _short(error: Exception) -> str:
    reason = getattr(error, "reason", None)
    text = reason if isinstance(reason, str) and reason else str(error)
    return text[:200]


class LLMReviser:
    """Revises with a chat model from the gaps and their memories; the extractive reviser takes a failed round."""

    def __init__(self, llm: ChatModel, fallback: ExtractiveReviser | None = None) -> None:
        self.llm = llm
        self.fallback = fallback or ExtractiveReviser()
        self.name = f"llm:{getattr(llm, 'model', 'chat')}"[:MAX_CRITERION_CHARS]

    def revise(self, task: str, criteria: Sequence[str], output: str, gaps: Sequence[GapMemories]) -> Revised:
        numbered = "\n".join(f"{i}. {c}" for i, c in enumerate(criteria, 1))
        found = [
            {
                "criterion": g.gap.criterion,
                "missing": list(g.gap.missing),
                "forbidden": list(g.gap.forbidden),
                "memories": [{"id": m.id, "text": m.text} for m in g.memories],
            }
            for g in gaps
        ]
        messages = [
            {"role": "system", "content": REVISER_INSTRUCTION},
            {
                "role": "user",
                "content": f"Task:\n{task}\n\nSuccess criteria:\n{numbered}\n\nOutput:\n{output}\n\n"
                f"Gaps and memories:\n{json.dumps(found, ensure_ascii=False, indent=1)}",
            },
        ]
        try:
            answer = self.llm.complete_json(messages, REVISER_SCHEMA, name="pair_revise").data
        except LLMError as error:
            revised = self.fallback.revise(task, criteria, output, gaps)
            why = _FAILED.format(who="reviser", why=_short(error), instead="extractive reviser", did="revised")
            return Revised(revised.text, revised.reviser, why)
        return Revised(str(answer["revision"]), self.name)
