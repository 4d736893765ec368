"""The OpenAPI 3.1 description of the reader API (workers/api/app.py), generated from the contract.

The `Minute` component is the contract's own JSON Schema
(contracts/schema/minute.schema.json, the one the golden vectors are checked
against): OpenAPI 3.1 schemas are JSON Schema 2020-12, so it is embedded as it
is, its `$defs` moved among the components. The memory records the reads
answer with (`ContextPackage`, `SearchHit` and their parts) are derived from
their dataclasses in contracts/memory.py by `record_schema`. A route's
parameters and request body are rendered from the field specs its handler
parses (workers/api/fields.py, and the facts, memory and PAIR route modules),
so their limits are the contract's constants and are written once. Only the
small answer envelopes (`{"minutes": [...]}`, errors), the parameters every
route shares (project_id, X-Request-ID) and the batch envelope of
POST /v1/minutes are written here; tests/workers/api/test_openapi.py checks
real answers of the app against every one.

The API serves the document at `/openapi.json`; `python -m workers.api.openapi`
prints it (`--token` / `--scoped` for the variants with bearer auth).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import re
import types
import typing
from collections.abc import Iterable
from importlib import resources
from typing import Any

from contracts import memory
from contracts.fact_changes import FACT_EVENT_TYPES
from contracts.summaries import SYSTEM_EVENT_TYPES
from pvm import defaults
from workers.api import fact_routes as fr
from workers.api import fields
from workers.api import memory_routes as mr
from workers.api import pair_routes as pr
from workers.api.fields import COMPONENTS, JSON, Body, Field, ref

# The contract's `$defs` names -> component names.
CONTRACT_DEFS = {"minute_id": "MinuteId"}
# The records the reads answer with, in the order they are listed.
RECORDS: tuple[type, ...] = (
    memory.Insight,
    memory.Scores,
    memory.SearchHit,
    memory.AgentMemory,
    memory.BudgetReport,
    memory.ContextPackage,
)


def _array(items: dict[str, Any], **constraints: Any) -> dict[str, Any]:
    return {"type": "array", "items": items, **constraints}


# -- schemas from the contract ----------------------------------------------------------------------


def contract_minute_schema() -> dict[str, Any]:
    """contracts/schema/minute.schema.json as it ships."""
    text = resources.files("contracts").joinpath("schema", "minute.schema.json").read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def _moved_refs(node: Any, moves: dict[str, str]) -> Any:
    """`node` with every `$ref` in `moves` pointed at its new place."""
    if isinstance(node, dict):
        return {k: moves.get(v, v) if k == "$ref" else _moved_refs(v, moves) for k, v in node.items()}
    if isinstance(node, list):
        return [_moved_refs(v, moves) for v in node]
    return node


def minute_schemas() -> dict[str, Any]:
    """`Minute` (the wire form), its `$defs`, and the two forms the API derives from it.

    `NewMinute` is what POST /v1/minutes takes: `v`, `id` and `timestamp` may be
    left out (the server mints an id and stamps the time). `StoredMinute` is
    what reads answer with: the wire form without `v`.
    """
    contract = contract_minute_schema()
    defs = contract.pop("$defs")
    unknown = set(defs) - set(CONTRACT_DEFS)
    if unknown:
        raise ValueError(f"minute.schema.json has $defs {sorted(unknown)}: name their components in CONTRACT_DEFS")
    # `$id` would make every `$ref` inside resolve against the contract's URL instead of this document;
    # the dialect is the document's `jsonSchemaDialect`.
    del contract["$id"], contract["$schema"]
    moves = {f"#/$defs/{name}": COMPONENTS + CONTRACT_DEFS[name] for name in defs}
    minute: dict[str, Any] = _moved_refs(contract, moves)

    new = copy.deepcopy(minute)
    new["title"] = "A minute as POST /v1/minutes takes it"
    new["description"] = (
        "The wire form (the Minute schema) where v, id and timestamp may be left out: the server mints a "
        "sortable id and stamps the current UTC time. Set id yourself to make a resent batch idempotent: "
        "the log keeps each id once."
    )
    new["required"] = [name for name in minute["required"] if name not in ("v", "id", "timestamp")]
    # Knowledge changes are minutes PVM writes itself (the facts routes): POST /v1/minutes refuses them (422).
    event_type = new["properties"]["event_type"]
    new["properties"]["event_type"] = {
        **event_type,
        "description": event_type["description"]
        + " POST /v1/minutes refuses the knowledge changes and chunk summaries (422 naming event_type): change "
        "facts through the facts routes; only the summarize pool writes chunk_summarized.",
        "not": {"enum": sorted(SYSTEM_EVENT_TYPES)},
    }

    stored = copy.deepcopy(minute)
    stored["title"] = "A minute as the reads answer with it"
    stored["description"] = "The wire form (the Minute schema) without v. " + stored["description"]
    del stored["properties"]["v"]
    stored["required"] = [name for name in minute["required"] if name != "v"]

    project_id = {**minute["properties"]["project_id"], "description": "A project id (the contract's project_id)."}
    return {
        "Minute": minute,
        **{CONTRACT_DEFS[name]: definition for name, definition in defs.items()},
        "NewMinute": new,
        "StoredMinute": stored,
        "ProjectId": project_id,
    }


# The fact contract's `$defs` (those that are not knowledge-change payloads) -> component names.
FACT_DEFS = {
    "fact_id": "FactId",
    "minute_id": "MinuteId",
    "timestamp": "FactTime",
    "tier_key": "TierKey",
    "relationship": "Relationship",
    "reason": "Reason",
}


def contract_fact_schema() -> dict[str, Any]:
    """contracts/schema/fact.schema.json as it ships."""
    text = resources.files("contracts").joinpath("schema", "fact.schema.json").read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def fact_schemas(minute_id: dict[str, Any]) -> dict[str, Any]:
    """`Fact` (the contract's JSON Schema of `Fact.to_dict()`) and its `$defs`, as components.

    The `$defs` that describe knowledge-change payloads are left out: the API takes no change minutes, it
    writes them. `minute_id` is the minute contract's definition, which the fact contract must share.
    """
    contract = contract_fact_schema()
    defs = {name: d for name, d in contract.pop("$defs").items() if name not in FACT_EVENT_TYPES}
    unknown = set(defs) - set(FACT_DEFS)
    if unknown:
        raise ValueError(f"fact.schema.json has $defs {sorted(unknown)}: name their components in FACT_DEFS")
    if defs["minute_id"] != minute_id:
        raise ValueError("fact.schema.json and minute.schema.json define minute_id differently")
    del contract["$id"], contract["$schema"]
    moves = {f"#/$defs/{name}": COMPONENTS + FACT_DEFS[name] for name in defs}
    schemas = {"Fact": _moved_refs(contract, moves)}
    schemas.update({FACT_DEFS[name]: _moved_refs(d, moves) for name, d in defs.items() if name != "minute_id"})
    left = [r for r in re.findall(r'"\$ref": "([^"]*)"', json.dumps(schemas)) if not r.startswith(COMPONENTS)]
    if left:
        raise ValueError(f"fact.schema.json's Fact refers to {sorted(set(left))}: move them into FACT_DEFS")
    return schemas


# Fields whose Python type says less than the API gives: minute dicts are StoredMinutes.
RECORD_FIELDS: dict[tuple[type, str], dict[str, Any]] = {
    (memory.SearchHit, "minute"): ref("StoredMinute"),
    (memory.ContextPackage, "recent"): _array(ref("StoredMinute"), description="newest minutes, oldest first"),
    (memory.ContextPackage, "referenced"): _array(ref("StoredMinute"), description="minutes the recent ones cite"),
}


def _type_schema(hint: Any) -> dict[str, Any]:
    """The JSON Schema of a field's type as its record's `to_dict()` writes it."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return {}
    if origin in (typing.Union, types.UnionType):
        present = [a for a in args if a is not type(None)]
        if len(present) != 1:
            raise TypeError(f"no JSON Schema for the union {hint}")
        inner = _type_schema(present[0])
        if len(present) == len(args):
            return inner
        if set(inner) == {"type"}:
            return {"type": [inner["type"], "null"]}
        return {"anyOf": [inner, {"type": "null"}]}
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _array(_type_schema(args[0]))
    if origin is dict and args[0] is str:
        value = _type_schema(args[1])
        return {"type": "object", "additionalProperties": value} if value else {"type": "object"}
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return ref(hint.__name__)
    scalars = {str: "string", int: "integer", float: "number", bool: "boolean"}
    if hint in scalars:
        return {"type": scalars[hint]}
    raise TypeError(f"no JSON Schema for {hint!r}: add it to _type_schema or the field to RECORD_FIELDS")


def record_schema(cls: type) -> dict[str, Any]:
    """The JSON Schema of a contracts.memory record as its `to_dict()` writes it: every field, nothing else."""
    hints = typing.get_type_hints(cls)
    properties = {
        f.name: RECORD_FIELDS.get((cls, f.name)) or _type_schema(hints[f.name]) for f in dataclasses.fields(cls)
    }
    return {
        "description": (cls.__doc__ or cls.__name__).strip().splitlines()[0],
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


# -- the API's own envelopes ------------------------------------------------------------------------


def _object(properties: dict[str, Any], required: tuple[str, ...] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties if required is None else required),
        "additionalProperties": False,
        **extra,
    }


_STRING = {"type": "string"}
_MINUTE_ERROR = _object(
    {
        "index": {"type": "integer", "minimum": 0, "description": "the minute's place in the batch, from 0"},
        "field": {"type": "string", "description": "the field, as a path into the minute: data.limits.max"},
        "problem": {"type": "string", "description": "what is wrong and how to fix it"},
    }
)

ENVELOPES: dict[str, dict[str, Any]] = {
    "Health": _object({"status": {"const": "ok"}}),
    "MinuteList": _object({"minutes": _array(ref("StoredMinute"))}),
    "ProjectStats": _object(
        {
            "project_id": _STRING,
            "minutes": {"type": "integer", "minimum": 0, "description": "durable minutes in the log"},
            "indexed": {"type": "integer", "minimum": 0, "description": "minutes searchable (the index head)"},
            "facts": _object(
                {
                    "total": {"type": "integer", "minimum": 0},
                    "by_type": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
                    "by_tier": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
                },
                description="current (promoted) facts of the project's task and project tiers, not pruned",
            ),
            "chunks": {"type": "integer", "minimum": 0, "description": "chunk summaries (the summarize pool)"},
            "episodes": {"type": "integer", "minimum": 0, "description": "episodes (the summarize pool)"},
            "pruned": {"type": "integer", "minimum": 0, "description": "memories pruned for a low score"},
            "merged": {"type": "integer", "minimum": 0, "description": "near-duplicates merged into another"},
            "conflicts": {"type": "integer", "minimum": 0, "description": "contradictions flagged"},
            "tokens_reclaimed": {"type": "integer", "minimum": 0, "description": "context tokens pruned memories cost"},
            "average_scores": {
                "type": "object",
                "additionalProperties": {"type": ["number", "null"]},
                "description": "means over what the last evaluation kept: recency, relevance, accuracy, impact, "
                "composite, fact_composite (null: never evaluated)",
            },
            "last_evaluated": {"type": ["number", "null"], "description": "Unix time of the last completed run"},
        }
    ),
    "Thread": _object(
        {
            "project_id": {"type": "string"},
            "thread": {"type": "string", "description": "thread:<id>, task:<id> or project"},
            "minutes": {"type": "integer", "minimum": 0, "description": "minutes of the thread summarized so far"},
            "chunked_seq": {"type": "integer", "minimum": 0, "description": "the last log seq in a chunk"},
            "recent": _array(ref("StoredMinute"), description="its newest minutes, oldest first"),
            "chunks": _array({"type": "object"}, description="Chunk records, oldest first (contracts/summaries.py)"),
            "episodes": _array({"type": "object"}, description="Episode records, in log order"),
        }
    ),
    "SearchAnswer": _object(
        {
            "hits": _array(ref("SearchHit"), description="best first"),
            "degraded": {
                "type": ["string", "null"],
                "description": "null, or why the answer is lexical-only (the query could not be embedded)",
            },
            "ranked": _array(
                {"type": "object", "required": ["kind", "score"]},
                description="with kinds: every kind asked for, best first; each has its kind (minute, fact, "
                "summary), and a fact or summary its source minute ids (sources)",
            ),
        },
        required=("hits", "degraded"),
    ),
    "Accepted": _object(
        {
            "accepted": {"type": "integer", "minimum": 1},
            "ids": _array(ref("MinuteId"), description="each minute's id, in the batch's order; resend with them"),
            "stream_ids": _array(
                {"type": "string", "pattern": r"^[0-9]+-[0-9]+$"}, description="the Redis stream entry ids"
            ),
        },
        description="The batch is on the streams; the pipeline makes it durable in the log next.",
    ),
    "Error": _object(
        {
            "error": {"type": "string", "description": "what went wrong, naming the parameter or field and the fix"},
            "request_id": {"type": "string", "description": "ties the answer to the server log (500 and 503)"},
        },
        required=("error",),
    ),
    "BatchRefused": _object(
        {"error": _STRING, "errors": _array(_MINUTE_ERROR, minItems=1)},
        description="Nothing of the batch was accepted; each error names its minute and field.",
    ),
    "FactList": _object(
        {
            "facts": _array(
                ref("Fact"),
                description="a page: by tier (task, project, global), newest valid_from first; with q, best first",
            ),
            "next_offset": {"type": ["integer", "null"], "description": "the offset of the next page, or null"},
            "degraded": {
                "type": ["string", "null"],
                "description": "with q: null, or why the search is lexical-only",
            },
        }
    ),
    "FactHistory": _object(
        {"facts": _array(ref("Fact"), description="every value the fact's slot has held, oldest valid_from first")}
    ),
    "FactChangeAccepted": _object(
        {
            "fact_id": ref("FactId"),
            "minute_id": ref("MinuteId"),
            "stream_id": {
                "type": ["string", "null"],
                "pattern": r"^[0-9]+-[0-9]+$",
                "description": "the stream entry of the change minute; null when a retry found it applied already",
            },
            "also": _array(
                _object({"event_type": _STRING, "minute_id": ref("MinuteId")}),
                description="the changes written with it that fit it into its slot (fact_superseded, "
                "fact_contradicted), in order",
            ),
        },
        required=("fact_id", "minute_id", "stream_id"),
        description="The knowledge-change minute is on the streams; the facts pool applies it once the log "
        "has made it durable, so reads show it a moment later.",
    ),
    "Recalled": _object(
        {
            "key": _STRING,
            "fact": {"anyOf": [ref("Fact"), {"type": "null"}], "description": "the learned value, or null"},
            "searched": _array(ref("TierKey"), description="the tier keys looked in, in order"),
        }
    ),
    "MemoryRefused": _object(
        {
            "error": {"type": "string", "description": "every refused file, each naming the field and the fix"},
            "field": {"type": "string", "description": "the body field, when the body itself is wrong"},
            "problems": _array(_STRING, description="one line per refused file, when there are several"),
        },
        required=("error",),
    ),
    "PairGap": _object(
        {
            "criterion": _STRING,
            "missing": _array(_STRING, description="what the output lacks for the criterion"),
            "forbidden": _array(_STRING, description="what the output holds that the criterion rules out"),
            "score": {"type": "integer", "minimum": 0, "maximum": pr.MAX_SCORE, "description": "how far it meets it"},
        }
    ),
    "PairRound": _object(
        {
            "round": {"type": "integer", "minimum": 1},
            "score": {"type": "integer", "minimum": 0, "maximum": pr.MAX_SCORE},
            "gaps": _array(ref("PairGap"), description="one per criterion not fully met"),
            "judge": {"type": "string", "description": "checklist, or llm:<model>"},
            "judge_fallback": {
                "type": ["string", "null"],
                "description": "why the LLM judge did not judge this round (the checklist did); null when it did",
            },
            "evaluation_id": ref("MinuteId"),
            "retrieved": _array(
                _object(
                    {
                        "criterion": _STRING,
                        "query": _STRING,
                        "memories": _array(
                            _object(
                                {
                                    "id": _STRING,
                                    "kind": {"enum": ["minute", "fact", "summary"]},
                                    "text": _STRING,
                                    "score": {"type": "number"},
                                }
                            )
                        ),
                    }
                ),
                description="the memories retrieved for each gap (empty on the last round)",
            ),
            "revision": {"type": ["string", "null"], "description": "the revised output; null on the last round"},
            "reviser": {"type": ["string", "null"]},
            "reviser_fallback": {"type": ["string", "null"]},
            "revision_id": {"anyOf": [ref("MinuteId"), {"type": "null"}]},
        }
    ),
    "PairRun": _object(
        {
            "run_id": _STRING,
            "project_id": ref("ProjectId"),
            "task_id": {"type": ["string", "null"]},
            "target": {"type": "integer", "minimum": 1, "maximum": pr.MAX_SCORE},
            "max_rounds": {"type": "integer", "minimum": 1},
            "score": {"type": "integer", "minimum": 0, "maximum": pr.MAX_SCORE, "description": "the best score seen"},
            "reached_target": {"type": "boolean"},
            "stopped": {
                "enum": ["target", "rounds", "no_progress"],
                "description": "why the loop ended: the target reached, the round limit, a revision that changed "
                "nothing",
            },
            "output": {"type": "string", "description": "the best-scored output (the original unless one beat it)"},
            "rounds": _array(ref("PairRound")),
            "minute_ids": _array(
                ref("MinuteId"), description="the pair_evaluation and pair_revision minutes written, in order"
            ),
        },
        description="A finished PAIR run; its rounds are on the streams as minutes.",
    ),
    "FieldError": _object(
        {
            "error": {"type": "string", "description": "what is wrong with the field and how to fix it"},
            "field": {"type": "string", "description": "the body field"},
        }
    ),
    "BatchUnwritten": _object(
        {
            "error": _STRING,
            "ids": _array(ref("MinuteId"), description="the batch's ids (minted ones included): resend with them"),
            "request_id": _STRING,
        },
        description="Nothing of the batch was written; resending it unchanged is safe (the log keeps each id once).",
    ),
}


def components_schemas() -> dict[str, Any]:
    """Every schema the document names: the contract's minute forms, the memory records, the envelopes."""
    minutes = minute_schemas()
    return {
        **minutes,
        **fact_schemas(minutes["MinuteId"]),
        **{cls.__name__: record_schema(cls) for cls in RECORDS},
        **ENVELOPES,
    }


# -- parameters and answers ---------------------------------------------------------------------------


def _parameters(specs: Iterable[Field]) -> list[dict[str, Any]]:
    """The parameter objects of a route's fields (workers/api/fields.py): the ones it parses."""
    return [spec.parameter() for spec in specs]


PROJECT = {
    "name": "project_id",
    "in": "path",
    "required": True,
    "schema": ref("ProjectId"),
    "description": "the project read; nothing crosses projects",
    "example": "apollo",
}
REQUEST_ID = {
    "name": "X-Request-ID",
    "in": "header",
    "required": False,
    "schema": {"type": "string"},
    "description": "your id for the request (1-64 of letters, digits and . _ : -): an error answer (500, 503) "
    "and the server log carry it; any other value is replaced by a new id",
}


def _error(description: str, schema: str = "Error", headers: tuple[str, ...] = ()) -> dict[str, Any]:
    answer: dict[str, Any] = {"description": description, "content": {JSON: {"schema": ref(schema)}}}
    if headers:
        answer["headers"] = {name: {"$ref": f"#/components/headers/{name}"} for name in headers}
    return answer


RESPONSES = {
    "BadRequest": _error("bad request: the message names the parameter and the fix"),
    "Unauthorized": _error("missing or wrong bearer token", headers=("WWW-Authenticate",)),
    "Forbidden": _error("the token may not read the project named in the path"),
    "Unavailable": _error(
        "a store the request needs is down or not configured (Redis, the vector store, the log): retry later",
        headers=("X-Request-ID",),
    ),
    "InternalError": _error("a bug: the server log has the details under the request id", headers=("X-Request-ID",)),
}
HEADERS = {
    "WWW-Authenticate": {
        "schema": _STRING,
        "description": 'Bearer realm="pvm" (error="invalid_token" for a wrong one)',
    },
    "X-Request-ID": {"schema": _STRING, "description": "the request's id, as in the body and the server log"},
}


def _answer(description: str, schema: str | None = None, **content: dict[str, Any]) -> dict[str, Any]:
    answer: dict[str, Any] = {"description": description}
    if schema is not None:
        content = {JSON: {"schema": ref(schema)}, **content}
    if content:
        answer["content"] = content
    return answer


FORBIDDEN = {"$ref": "#/components/responses/Forbidden"}


@dataclasses.dataclass(frozen=True)
class Operation:
    """One route's description, and the access answers (401, 403) that apply to it when tokens are on."""

    method: str
    body: dict[str, Any]
    guarded: bool = True  # needs the bearer token when the server has one
    # The 403 answer of a route that names a project (in its path or in posted minutes), with scoped tokens.
    forbidden: dict[str, Any] | None = dataclasses.field(default_factory=lambda: FORBIDDEN)

    def described(self, token_required: bool, scoped: bool) -> dict[str, Any]:
        operation = copy.deepcopy(self.body)
        responses = operation["responses"]
        if token_required and not self.guarded:
            operation["security"] = []
        if token_required and self.guarded:
            responses["401"] = {"$ref": "#/components/responses/Unauthorized"}
        if scoped and self.forbidden is not None:
            responses["403"] = copy.deepcopy(self.forbidden)
        operation["responses"] = dict(sorted(responses.items()))
        return operation


_ERRORS = {
    "400": {"$ref": "#/components/responses/BadRequest"},
    "500": {"$ref": "#/components/responses/InternalError"},
    "503": {"$ref": "#/components/responses/Unavailable"},
}


def _read(summary: str, parameters: list[dict[str, Any]], ok: dict[str, Any]) -> Operation:
    return Operation(
        "get",
        {
            "summary": summary,
            "parameters": [PROJECT, *parameters, REQUEST_ID],
            "responses": {"200": ok, **_ERRORS},
        },
    )


def operations() -> dict[str, dict[str, Operation]]:
    """Every route of workers/api/app.py: path -> method -> its operation."""
    routes: dict[str, dict[str, Operation]] = {path: {op.method: op} for path, op in _minute_operations().items()}
    for path, op in [*fact_operations(), *memory_operations(), pair_operation()]:
        routes.setdefault(path, {})[op.method] = op
    return routes


def _minute_operations() -> dict[str, Operation]:
    """The routes of minutes, context and search: path -> its one operation."""
    minutes = {"minutes": _array(ref("NewMinute"), minItems=1, maxItems=defaults.API_MAX_BATCH)}
    return {
        "/healthz": Operation(
            "get",
            {
                "summary": "Liveness: the server answers and reaches Redis (never needs a token)",
                "parameters": [REQUEST_ID],
                "responses": {
                    "200": _answer("ok", "Health"),
                    "500": _ERRORS["500"],
                    "503": {"$ref": "#/components/responses/Unavailable"},
                },
            },
            guarded=False,
            forbidden=None,
        ),
        "/openapi.json": Operation(
            "get",
            {
                "summary": "This document (generated from the contract: see workers/api/openapi.py)",
                "responses": {
                    "200": _answer("the OpenAPI 3.1 document", None, **{JSON: {"schema": {"type": "object"}}})
                },
            },
            forbidden=None,
        ),
        "/v1/minutes": Operation(
            "post",
            {
                "summary": "Validate a batch of minutes and append it to the streams, whole or not at all",
                "parameters": [REQUEST_ID],
                "requestBody": {
                    "required": True,
                    "description": f"At most {defaults.API_MAX_BATCH} minutes and {defaults.API_MAX_BODY_BYTES} "
                    "bytes; a bare JSON array of minutes is taken too.",
                    "content": {
                        JSON: {
                            "schema": {
                                "oneOf": [
                                    {"type": "object", "properties": minutes, "required": ["minutes"]},
                                    minutes["minutes"],
                                ]
                            }
                        }
                    },
                },
                "responses": {
                    "202": _answer("accepted: every minute's id and stream entry id", "Accepted"),
                    "400": {"$ref": "#/components/responses/BadRequest"},
                    "413": _error(f"the body is over {defaults.API_MAX_BODY_BYTES} bytes (refused unread): split it"),
                    "422": _error("invalid minutes: nothing was accepted", "BatchRefused"),
                    "500": _ERRORS["500"],
                    "503": _error(
                        "Redis unavailable or a stream key unusable: nothing of the batch was written",
                        "BatchUnwritten",
                        headers=("X-Request-ID",),
                    ),
                },
            },
            forbidden=_error(
                "the token may not write a project some minutes name: nothing was accepted", "BatchRefused"
            ),
        ),
        "/v1/projects/{project_id}/context": _read(
            "An agent's context: recent, referenced, track record, what we know (facts; global ones with the grant), "
            "rules that apply and relevant experience, under a token budget",
            _parameters(fields.CONTEXT_PARAMS),
            _answer(
                "the context package (format=text: the prompt-ready text)",
                "ContextPackage",
                **{"text/plain": {"schema": _STRING}},
            ),
        ),
        "/v1/projects/{project_id}/search": _read(
            "Hybrid search (lexical, and dense when configured) re-ranked by recency and importance",
            _parameters(fields.SEARCH_PARAMS),
            _answer("the hits, best first", "SearchAnswer"),
        ),
        "/v1/projects/{project_id}/recent": _read(
            "The project's newest minutes, oldest first",
            _parameters(fields.RECENT_PARAMS),
            _answer("the minutes", "MinuteList"),
        ),
        "/v1/projects/{project_id}/stats": _read(
            "The project's memory in numbers: minutes, facts by type and tier, chunks, episodes, pruned, merged, "
            "tokens reclaimed, average scores",
            [],
            _answer("the numbers", "ProjectStats"),
        ),
        "/v1/global/stats": Operation(
            "get",
            {
                "summary": "The global tier's memory in numbers (project_id _global): its current facts by type, and "
                "what its evaluation runs pruned and merged; no minutes, chunks or episodes of its own. Needs a "
                "token with the global grant (403 without)",
                "parameters": [REQUEST_ID],
                "responses": {
                    "200": _answer("the numbers", "ProjectStats"),
                    **{status: answer for status, answer in _ERRORS.items() if status != "400"},
                },
            },
        ),
        "/v1/projects/{project_id}/threads/{thread}": Operation(
            "get",
            {
                "summary": "One thread: its newest minutes (verbatim), its chunk summaries and its episodes",
                "parameters": [PROJECT, *_parameters(fields.THREAD_PARAMS), REQUEST_ID],
                "responses": {
                    "200": _answer("the thread (empty lists for a thread with no minutes yet)", "Thread"),
                    **_ERRORS,
                },
            },
        ),
        "/v1/projects/{project_id}/minutes": _read(
            "Minutes by id (the Redis cache, then the durable log), in the order asked",
            _parameters(fields.BY_IDS_PARAMS),
            _answer("the minutes found (an id of another project, or of none, is left out)", "MinuteList"),
        ),
    }


# -- the facts routes (workers/api/fact_routes.py) -------------------------------------------------------------------


FACT_GLOBAL_FORBIDDEN = _error(
    "the token may not reach the project named in the path, or the global tier (which needs a token that "
    "grants it: pvm token new --global)"
)
_FIELD_ERROR = _error("a body field is wrong: the answer names it (field) and the fix", "FieldError")
_NOT_FOUND = _error("no such fact in the project (or, with a token that grants it, the global tier)")


def _change(summary: str, parameters: list[dict[str, Any]], body: Body, **answers: Any) -> Operation:
    responses = {
        "202": _answer("accepted: the change minute is on the streams", "FactChangeAccepted"),
        "422": _FIELD_ERROR,
        **_ERRORS,
        **answers,
    }
    return Operation(
        "post",
        {
            "summary": summary,
            "parameters": [PROJECT, *parameters, REQUEST_ID],
            "requestBody": body.request_body(),
            "responses": responses,
        },
        forbidden=FACT_GLOBAL_FORBIDDEN,
    )


def fact_operations() -> list[tuple[str, Operation]]:
    """The facts routes: reads of the facts store (or of the fact points, with q), and changes as minutes.

    Their parameters and bodies are the fields the handlers parse (workers/api/fact_routes.py).
    """
    base = "/v1/projects/{project_id}"
    fact_id = fr.FACT_ID.parameter()
    not_found = {"404": _NOT_FOUND}
    conflict = _error("the fact is not in a state this change applies to (already promoted, retracted)")
    recall = Operation(
        "get",
        {
            "summary": "recall(key): a learned key's value, task tier first, then project, then global (granted)",
            "parameters": [PROJECT, *_parameters(fr.RECALL_PARAMS), REQUEST_ID],
            "responses": {"200": _answer("the value (fact null when no tier holds the key)", "Recalled"), **_ERRORS},
        },
        forbidden=FACT_GLOBAL_FORBIDDEN,
    )
    recall_by_path = copy.deepcopy(recall.body)
    recall_by_path["summary"] = "recall(key), the key in the path (a key with / needs recall?key=)"
    recall_by_path["parameters"] = [PROJECT, *_parameters(fr.RECALL_PATH_PARAMS), REQUEST_ID]
    return [
        (
            f"{base}/facts",
            Operation(
                "get",
                {
                    "summary": "The project's facts: current, filtered; as_of: what held then; q: search",
                    "parameters": [PROJECT, *_parameters(fr.LIST_PARAMS), REQUEST_ID],
                    "responses": {"200": _answer("a page of facts", "FactList"), **_ERRORS},
                },
                forbidden=FACT_GLOBAL_FORBIDDEN,
            ),
        ),
        (
            f"{base}/facts",
            _change(
                "Assert a fact by hand (a fact_asserted minute, fitted into its slot: an older value is superseded)",
                [],
                fr.ASSERT_BODY,
                **{"409": _error("the slot holds this value already: promote, retract or edit that fact")},
            ),
        ),
        (
            f"{base}/facts/{{fact_id}}",
            Operation(
                "get",
                {
                    "summary": "One fact, any status",
                    "parameters": [PROJECT, fact_id, REQUEST_ID],
                    "responses": {"200": _answer("the fact", "Fact"), **not_found, **_ERRORS},
                },
                forbidden=FACT_GLOBAL_FORBIDDEN,
            ),
        ),
        (
            f"{base}/facts/{{fact_id}}/history",
            Operation(
                "get",
                {
                    "summary": "The history of the fact's slot: every value, superseded and retracted ones included",
                    "parameters": [PROJECT, fact_id, REQUEST_ID],
                    "responses": {"200": _answer("the slot's facts", "FactHistory"), **not_found, **_ERRORS},
                },
                forbidden=FACT_GLOBAL_FORBIDDEN,
            ),
        ),
        (
            f"{base}/facts/{{fact_id}}/promote",
            _change(
                "Promote a pending fact (fact_promoted), or copy it one tier up (fact_tier_promoted)",
                [fact_id],
                fr.PROMOTE_BODY,
                **not_found,
                **{"409": conflict},
            ),
        ),
        (
            f"{base}/facts/{{fact_id}}/retract",
            _change(
                "Retract a fact (fact_retracted): it leaves the current view and stays in history",
                [fact_id],
                fr.RETRACT_BODY,
                **not_found,
                **{"409": conflict},
            ),
        ),
        (
            f"{base}/learn",
            _change(
                "learn(key, value): a promoted, certain fact in the slot learned / key (fact_learned)",
                [],
                fr.LEARN_BODY,
            ),
        ),
        (f"{base}/recall", recall),
        (f"{base}/recall/{{key}}", dataclasses.replace(recall, body=recall_by_path)),
    ]


_MEMORY_REFUSED = _error(
    "the file is refused: the message names the file, the field and the fix (problems: every refused file)",
    "MemoryRefused",
)
_MEMORY_CONFLICT = _error(
    "a stale version (the fact changed since the export: export again and redo the edit) or an edited "
    "read-only file (episodes, summaries)",
    "MemoryRefused",
)
_MEMORY_WRITTEN_BEFORE = {
    "allOf": [ref("MinuteId")],
    "description": "a retry of a write the log holds already (its minute_id): nothing was written this time",
}
_MEMORY_FORBIDDEN = _error(
    "the token may not reach the project named in the path, or a file of the global tier was sent without the "
    "token's global grant"
)
_MEMORY_CHANGES = _object(
    {
        "path": _STRING,
        "changed": {"type": "boolean"},
        "minutes": _array(_object({}, required=(), additionalProperties=True)),
        "stream_ids": _array(_STRING),
        "written_before": _MEMORY_WRITTEN_BEFORE,
    },
    required=("path", "changed", "minutes", "stream_ids"),
)
_MEMORY_PLAN = _object(
    {
        "project_id": _STRING,
        "minutes": {"type": "integer", "minimum": 0},
        "unchanged": {"type": "integer", "minimum": 0},
        "changes": _array(_object({}, required=(), additionalProperties=True)),
        "dry_run": {"type": "boolean"},
        "stream_ids": _array(_STRING),
        "written_before": _MEMORY_WRITTEN_BEFORE,
    },
    required=("project_id", "minutes", "unchanged", "changes", "dry_run", "stream_ids"),
)
# The export answers what the import takes back: the same files and version.
_MEMORY_EXPORT = _object(
    {"project_id": _STRING, "files": mr.FILES.schema(), "version": mr.VERSION.schema()},
    required=("project_id", "files", "version"),
)


def _memory_write(method: str, summary: str, body: Body, edits: bool = True) -> Operation:
    """A memory tool's write; `edits`: it changes a file that must exist (404 when none)."""
    missing = {"404": _error("no such memory file", "MemoryRefused")} if edits else {}
    return Operation(
        method,
        {
            "summary": summary,
            "parameters": [PROJECT, REQUEST_ID],
            "requestBody": body.request_body(),
            "responses": {
                "200": _answer(
                    "nothing changed: no minute written", schema=None, **{JSON: {"schema": _MEMORY_CHANGES}}
                ),
                "202": _answer(
                    "the change minutes are on the streams", schema=None, **{JSON: {"schema": _MEMORY_CHANGES}}
                ),
                **missing,
                "409": _MEMORY_CONFLICT,
                "422": _MEMORY_REFUSED,
                **_ERRORS,
            },
        },
        forbidden=_MEMORY_FORBIDDEN,
    )


def memory_operations() -> list[tuple[str, Operation]]:
    """The Markdown memory routes (workers/api/memory_routes.py): export, import, and the memory tools.

    Their parameters and bodies are the fields the handlers parse (workers/api/memory_routes.py).
    """
    base = "/v1/projects/{project_id}/memory"
    read_file = _read(
        "Read one memory file",
        _parameters([mr.FILE]),
        _answer(
            "the file",
            schema=None,
            **{
                JSON: {
                    "schema": _object(
                        {"path": _STRING, "text": _STRING, "read_only": {"type": "boolean"}},
                        required=("path", "text", "read_only"),
                    )
                }
            },
        ),
    )
    read_file.body["responses"]["404"] = _error("no such memory file", "MemoryRefused")
    return [
        (
            f"{base}/export",
            _read(
                "The project's Markdown memory: every file, path -> text (docs/memory-files.md)",
                [],
                _answer("the files", schema=None, **{JSON: {"schema": _MEMORY_EXPORT}}),
            ),
        ),
        (
            f"{base}/export",
            Operation(
                "put",
                {
                    "summary": "Import a whole folder's files: each human change one minute; a fact whose file is "
                    "gone is retracted; an unedited export writes nothing",
                    "parameters": [PROJECT, *_parameters([mr.DRY_RUN]), REQUEST_ID],
                    "requestBody": mr.IMPORT_BODY.request_body(),
                    "responses": {
                        "200": _answer(
                            "planned (dry run) or nothing to change", schema=None, **{JSON: {"schema": _MEMORY_PLAN}}
                        ),
                        "202": _answer(
                            "the change minutes are on the streams", schema=None, **{JSON: {"schema": _MEMORY_PLAN}}
                        ),
                        "409": _MEMORY_CONFLICT,
                        "422": _MEMORY_REFUSED,
                        **_ERRORS,
                    },
                },
                forbidden=_MEMORY_FORBIDDEN,
            ),
        ),
        (
            f"{base}/files",
            _read(
                "List the memory files (under prefix)",
                _parameters([mr.PREFIX]),
                _answer(
                    "the files",
                    schema=None,
                    **{
                        JSON: {
                            "schema": _object({"files": _array(_object({}, required=(), additionalProperties=True))})
                        }
                    },
                ),
            ),
        ),
        (f"{base}/file", read_file),
        (
            f"{base}/file",
            _memory_write("put", "Write one memory file (assert or edit a fact)", mr.WRITE_BODY, edits=False),
        ),
        (
            f"{base}/patch",
            _memory_write(
                "post",
                "Replace the one occurrence of old in a memory file (refused when it occurs 0 or 2+ times)",
                mr.PATCH_BODY,
            ),
        ),
        (
            f"{base}/append",
            _memory_write("post", "Append text to a memory file's body", mr.APPEND_BODY),
        ),
    ]


def pair_operation() -> tuple[str, Operation]:
    """The PAIR route: judge an output against its criteria, revise it from memory, re-judge.

    Its body is the one the handler parses (workers/api/pair_routes.py).
    """
    return (
        "/v1/projects/{project_id}/pair",
        Operation(
            "post",
            {
                "summary": "PAIR: a fresh judge scores the output against the criteria, memories retrieved for each "
                "gap revise it, the revision is judged again, until the target or the round limit",
                "parameters": [PROJECT, REQUEST_ID],
                "requestBody": pr.PAIR_BODY.request_body(),
                "responses": {"200": _answer("the run and its rounds", "PairRun"), "422": _FIELD_ERROR, **_ERRORS},
            },
        ),
    )


def openapi_document(token_required: bool = False, scoped: bool = False) -> dict[str, Any]:
    """The OpenAPI description; with a token, the bearer scheme on every operation but the health check.

    `scoped`: tokens may be limited to projects, so the routes that name a
    project (in the path or in posted minutes) also answer 403.
    """
    components: dict[str, Any] = {"schemas": components_schemas(), "responses": RESPONSES, "headers": HEADERS}
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "info": {
            "title": "PVM reader API",
            "version": "1",
            "description": "Context, search and reads of one project's memory, its facts (long-term memory: "
            "read them, and change them by knowledge-change minutes the API writes), and minute ingestion. "
            "Every read names a project in its path; nothing crosses projects. An optional query parameter "
            "sent empty (`?n=`) is the same as leaving it out. Generated from the contract "
            "(contracts/schema/minute.schema.json and contracts/memory.py).",
        },
        "paths": {
            path: {method: operation.described(token_required, scoped) for method, operation in methods.items()}
            for path, methods in operations().items()
        },
        "components": components,
    }
    if token_required:
        described = "the server's PVM_API_TOKEN"
        if scoped:
            described += ", or a token in PVM_API_TOKENS_FILE (which reaches only its projects)"
        components["securitySchemes"] = {"bearerAuth": {"type": "http", "scheme": "bearer", "description": described}}
        document["security"] = [{"bearerAuth": []}]
    return copy.deepcopy(document)


def main(argv: list[str] | None = None) -> None:
    """Print the document (for a docs build, or a client generator)."""
    parser = argparse.ArgumentParser(prog="python -m workers.api.openapi", description=main.__doc__)
    parser.add_argument("--token", action="store_true", help="as served with PVM_API_TOKEN set")
    parser.add_argument("--scoped", action="store_true", help="as served with PVM_API_TOKENS_FILE set")
    args = parser.parse_args(argv)
    document = openapi_document(token_required=args.token or args.scoped, scoped=args.scoped)
    print(json.dumps(document, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
