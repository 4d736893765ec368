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
from typing import Any

from starlette.requests import Request

from contracts.errors import InvalidMinute
from contracts.minute import Minute
from contracts.pair import PairError
from pvm.pair import Pair, SearchRetriever
from workers.api.request import InvalidField, json_object

PAIR_FIELDS = ("task", "criteria", "output")
PAIR_OPTIONAL = ("task_id", "agent_id", "rounds", "target")


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
        given = json_object(body, PAIR_FIELDS, PAIR_OPTIONAL)
        for name in ("rounds", "target"):
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
