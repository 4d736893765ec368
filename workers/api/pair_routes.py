"""``POST /v1/projects/{project_id}/pair``: a PAIR run over the project's memory, its rounds written as minutes.

The handler reads the body (task, criteria, output; optionally task_id, agent_id,
rounds, target), runs `pvm.pair.Pair` with the server's judge and reviser
(PVM_PAIR_JUDGE, PVM_PAIR_REVISER), the reader's search over the project, and
the API's own append for the minutes, and answers the run (`PairResult.to_dict`).
A field it cannot use is refused with 422 naming it, before anything is judged
or written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from starlette.requests import Request

from contracts.errors import InvalidMinute
from contracts.minute import Minute
from contracts.pair import (
    MAX_CRITERIA,
    MAX_CRITERION_CHARS,
    MAX_OUTPUT_CHARS,
    MAX_ROUNDS,
    MAX_RUN_CHARS,
    MAX_TASK_CHARS,
    PairError,
)
from pvm.pair import Pair, SearchRetriever
from workers.api.fields import AGENT_ID, NON_BLANK, TASK_ID, Body, Value, body_field, integer
from workers.api.request import InvalidField

# A score is a whole number from 0 to 100 (contracts.pair.check_score); `Pair.run` takes a target from 1.
MAX_SCORE = 100
_TEXT = Value("string", min_length=1, pattern=NON_BLANK)
# The body (workers/api/openapi.py describes the route from it); the limits are the contract's (contracts/pair.py).
PAIR_BODY = Body(
    (
        body_field("task", replace(_TEXT, max_length=MAX_TASK_CHARS), "the original task", required=True),
        body_field(
            "criteria",
            Value("array", items=replace(_TEXT, max_length=MAX_CRITERION_CHARS), min_items=1, max_items=MAX_CRITERIA),
            "the task's success criteria, one check each",
            required=True,
        ),
        body_field("output", replace(_TEXT, max_length=MAX_OUTPUT_CHARS), "the output to judge", required=True),
        body_field("task_id", TASK_ID),
        body_field("agent_id", AGENT_ID, "whose output it is (the minutes' agent_id)"),
        body_field("rounds", integer(1, MAX_ROUNDS), "judgments at most (default PVM_PAIR_ROUNDS)"),
        body_field("target", integer(1, MAX_SCORE), "the score that stops the loop (default PVM_PAIR_TARGET)"),
    ),
    f"the task, criteria and output: at most {MAX_RUN_CHARS} characters together (422 naming output beyond), so "
    "that every round fits one minute",
)


class PairRoute:
    """The pair route over a loop template: its judge, reviser and limits; the retriever and writer are the API's."""

    def __init__(self, template: Pair, searcher: object | None, write: Callable[[Sequence[Minute]], object]) -> None:
        retriever = SearchRetriever(searcher) if searcher is not None else None  # type: ignore[arg-type]
        self.pair = Pair(
            template.judge,
            template.reviser,
            retriever,
            lambda minute: write([minute]),
            target=template.target,
            rounds=template.rounds,
            k=template.k,
        )

    def run(self, request: Request, body: bytes) -> Any:
        given = PAIR_BODY.parse(body)
        for name in (f.name for f in PAIR_BODY.fields if f.value.type == "integer"):
            if name in given and (isinstance(given[name], bool) or not isinstance(given[name], int)):
                raise InvalidField(name, f"must be a whole number, got {given[name]!r}")
        try:
            result = self.pair.run(
                request.path_params["project_id"],
                given["task"],
                given["criteria"],
                given["output"],
                task_id=given.get("task_id"),
                agent_id=given.get("agent_id"),
                rounds=given.get("rounds"),
                target=given.get("target"),
            )
        except PairError as exc:
            raise InvalidField(exc.field.split(".")[0].split("[")[0], exc.problem) from None
        except InvalidMinute as exc:
            raise InvalidField(exc.field, exc.problem) from None
        return result.to_dict()
