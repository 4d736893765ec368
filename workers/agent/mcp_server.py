"""`pvm mcp`: PVM's memory as MCP tools, over stdio or streamable HTTP, for agent hosts that speak MCP.

Every tool calls the reader API (`workers/api/app.py`) through `pvm.AsyncClient`,
so a tool does exactly what the route does (validation, tenancy, the facts
pool's minutes) and is refused exactly where the route refuses. The token
decides the projects a caller reaches, as on the API (`workers/api/auth.py`):

- stdio: the token is `--token`, else PVM_API_TOKEN; one caller, one token.
- streamable HTTP: each request's `Authorization: Bearer <token>` header is
  passed on to the API, so each caller reaches only its token's projects.

A call for a project outside the token's projects is refused (the tool's
error says which project, and that the token may not read it).

The API is PVM_API_URL (`--api-url`). `pvm serve --mcp` serves the tools
beside the API instead (`beside_api`): at /mcp of the API's own address,
calling the API app in-process, a socket hop less.

ADDING_TOOLS
------------
A tool is one async function registered in `TOOLS` with `@TOOLS.tool`
(`@TOOLS.named("list")` for a name the module should not define): its first
parameter is the `AsyncClient` (already holding the caller's token), the
others are the tool's arguments, typed (`Annotated[..., Field(description=...)]`
for a description), and its docstring is the tool's description. Return
JSON-able values (a dict for structured output, or text); a `PvmError` it
raises becomes the tool's error message. Call the route's client method,
never the stores: the API is where tenancy is checked. A new route gets a
builder in `pvm/routes.py` and one line in each client (`Client`,
`AsyncClient`). Example:

    @TOOLS.tool
    async def stats(api: AsyncClient, project_id: ProjectId) -> dict[str, Any]:
        '''A project's memory in numbers: minutes, facts, scores.'''
        return await api.stats(project_id)
"""

from __future__ import annotations

import asyncio
import inspect
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from pydantic import Field

from contracts.errors import PvmError
from pvm import defaults
from pvm.client import AsyncClient
from pvm.config import Settings

ToolFunction = Callable[..., Awaitable[Any]]

ProjectId = Annotated[str, Field(description="the project to read or write; the token must reach it")]
AgentId = Annotated[str | None, Field(description="the agent making the call (its own track record, attribution)")]
TaskId = Annotated[str | None, Field(description="a task id: its task-tier facts and rules join the project's")]


class ToolRegistry:
    """PVM's MCP tools in the order they are listed: name -> the function that serves it."""

    def __init__(self) -> None:
        self.functions: dict[str, ToolFunction] = {}

    def tool(self, fn: ToolFunction) -> ToolFunction:
        """Register `fn` as the tool of its name (see ADDING_TOOLS in the module's docstring)."""
        return self.named(fn.__name__)(fn)

    def named(self, name: str) -> Callable[[ToolFunction], ToolFunction]:
        """Register a function as the tool `name`, for a name a module should not define (``list``, ``open``)."""

        def register(fn: ToolFunction) -> ToolFunction:
            if name in self.functions:
                raise ValueError(f"an MCP tool named {name!r} is registered already")
            self.functions[name] = fn
            return fn

        return register

    def names(self) -> list[str]:
        return list(self.functions)


TOOLS = ToolRegistry()


# -- the tools -------------------------------------------------------------------------------------------------


@TOOLS.tool
async def emit(
    api: AsyncClient,
    project_id: ProjectId,
    event_type: Annotated[str, Field(description="what happened: task_assigned, decision, task_failed, message...")],
    agent_id: AgentId = None,
    memory_note: Annotated[str | None, Field(description="one line worth remembering, in words")] = None,
    data: Annotated[dict[str, Any] | None, Field(description="the event's fields (task_id, success, ...)")] = None,
    thread_id: Annotated[str | None, Field(description="the conversation or task thread it belongs to")] = None,
    context_references: Annotated[list[str] | None, Field(description="ids of the minutes it answers")] = None,
) -> dict[str, Any]:
    """Record a coordination minute (an event of the agent's work) in the project's memory; its id."""
    minute: dict[str, Any] = {"project_id": project_id, "event_type": event_type}
    optional = {
        "agent_id": agent_id,
        "memory_note": memory_note,
        "data": data,
        "thread_id": thread_id,
        "context_references": context_references,
    }
    minute |= {k: v for k, v in optional.items() if v is not None}
    answer = await api.post_minutes([minute])
    return {"id": answer["ids"][0], "stream_id": answer["stream_ids"][0]}


@TOOLS.tool
async def search(
    api: AsyncClient,
    project_id: ProjectId,
    query: Annotated[str, Field(description="what to look for, in words")],
    k: Annotated[int, Field(ge=1, le=100, description="how many hits")] = defaults.MCP_SEARCH_K,
    agents: Annotated[list[str] | None, Field(description="only minutes of these agents")] = None,
    event_types: Annotated[list[str] | None, Field(description="only minutes of these event types")] = None,
    task_id: TaskId = None,
    prefer: Annotated[
        Literal["recent", "relevant"] | None, Field(description="recent: recency leads; relevant: it never does")
    ] = None,
) -> dict[str, Any]:
    """Hybrid search over the project's minutes, best hit first; `degraded` says when it is lexical-only."""
    return await api.search(
        project_id, query, k, agents=agents or (), event_types=event_types or (), task_id=task_id, prefer=prefer
    )


@TOOLS.tool
async def context(
    api: AsyncClient,
    project_id: ProjectId,
    agent_id: Annotated[str, Field(description="the agent the context is for")],
    task: Annotated[str | None, Field(description="the task at hand, in words: finds relevant experience")] = None,
    budget_tokens: Annotated[int | None, Field(ge=1, description="the most tokens the context may take")] = None,
    task_id: TaskId = None,
    thread: Annotated[str | None, Field(description="a thread id, task:<id> or project: that thread only")] = None,
) -> str:
    """The agent's context as prompt text: recent activity, its track record, facts, rules, relevant experience."""
    return await api.context_text(project_id, agent_id, task, budget_tokens, task_id=task_id, thread=thread)


@TOOLS.tool
async def learn(
    api: AsyncClient,
    project_id: ProjectId,
    key: Annotated[str, Field(description="what to remember, e.g. 'deploy window'")],
    value: Annotated[str | int | float | bool, Field(description="its value")],
    tier: Annotated[
        Literal["task", "project", "global"] | None, Field(description="where it holds (default: project)")
    ] = None,
    task_id: TaskId = None,
    agent_id: AgentId = None,
) -> dict[str, Any]:
    """Remember a value under a key (a certain fact; a newer value of the key supersedes the older one)."""
    return await api.learn(project_id, key, value, tier=tier, task_id=task_id, agent_id=agent_id)


@TOOLS.tool
async def recall(
    api: AsyncClient,
    project_id: ProjectId,
    key: Annotated[str, Field(description="the key `learn` remembered a value under")],
    task: Annotated[str | None, Field(description="look in this task's tier first")] = None,
) -> dict[str, Any]:
    """The current value learned under a key (`fact`, or null), looked up task, project, then global tier."""
    return await api.recall(project_id, key, task=task)


@TOOLS.tool
async def facts(
    api: AsyncClient,
    project_id: ProjectId,
    q: Annotated[str | None, Field(description="search the facts for this text, best first")] = None,
    task: Annotated[str | None, Field(description="also this task's facts")] = None,
    types: Annotated[list[str] | None, Field(description="only these fact types (fact, rule, preference...)")] = None,
    limit: Annotated[int, Field(ge=1, le=500, description="how many facts")] = defaults.MCP_FACTS_LIMIT,
) -> dict[str, Any]:
    """What the project knows: its current facts (and the task's), or those matching `q`."""
    return await api.facts(project_id, q=q, task=task, types=types or (), limit=limit)


@TOOLS.tool
async def pair(
    api: AsyncClient,
    project_id: ProjectId,
    task: Annotated[str, Field(description="the original task, as it was given")],
    criteria: Annotated[list[str], Field(min_length=1, description="the task's success criteria, one check each")],
    output: Annotated[str, Field(description="the output to check against the criteria")],
    task_id: TaskId = None,
    agent_id: AgentId = None,
    rounds: Annotated[int | None, Field(ge=1, description="judgments at most (default PVM_PAIR_ROUNDS)")] = None,
    target: Annotated[int | None, Field(ge=1, le=100, description="the score that stops the loop")] = None,
) -> dict[str, Any]:
    """PAIR: a fresh judge scores the output against the criteria (0-100) and names the gaps; memories retrieved
    for each gap revise it; the revision is judged again, until the target or the round limit. Every round is
    written as minutes. Answers the run: score, output (the best-scored), stopped, rounds."""
    return await api.pair(
        project_id, task, criteria, output, task_id=task_id, agent_id=agent_id, rounds=rounds, target=target
    )


# -- the memory tools: the project's Markdown memory as files (docs/memory-files.md) ---------------------------

MemoryPath = Annotated[
    str,
    Field(
        description="a memory file, relative to the project's memory root: facts/..., learned/..., episodes/..., "
        "summaries/... ending in .md (list shows them); no '..', no absolute paths"
    ),
]


@TOOLS.named("list")
async def list_files(
    api: AsyncClient,
    project_id: ProjectId,
    prefix: Annotated[str | None, Field(description="only files under this folder, e.g. facts/project")] = None,
) -> dict[str, Any]:
    """The files of the project's Markdown memory (facts, learned keys, episodes, summaries): path, size, and
    whether it is read-only."""
    return {"files": await api.memory_list(project_id, prefix)}


@TOOLS.tool
async def read(api: AsyncClient, project_id: ProjectId, path: MemoryPath) -> dict[str, Any]:
    """One memory file: its Markdown text (YAML front-matter, then the body) and whether it is read-only."""
    return await api.memory_read(project_id, path)


@TOOLS.tool
async def write(
    api: AsyncClient,
    project_id: ProjectId,
    path: MemoryPath,
    text: Annotated[str, Field(description="the whole file: front-matter (type, subject, attribute, value...), body")],
) -> dict[str, Any]:
    """Write a memory file: a new file (no id line) asserts a fact, an edited one edits it. Each change is a
    minute; `changed` is false when the text changes nothing."""
    return await api.memory_write(project_id, path, text)


@TOOLS.tool
async def patch(
    api: AsyncClient,
    project_id: ProjectId,
    path: MemoryPath,
    old: Annotated[str, Field(description="the exact text to replace; it must occur exactly once in the file")],
    new: Annotated[str, Field(description="the text to put in its place")],
) -> dict[str, Any]:
    """Replace the one occurrence of `old` in a memory file with `new` (refused when it occurs 0 or 2+ times)."""
    return await api.memory_patch(project_id, path, old, new)


@TOOLS.tool
async def append(
    api: AsyncClient,
    project_id: ProjectId,
    path: MemoryPath,
    text: Annotated[str, Field(description="the text to add at the end of the file's body")],
) -> dict[str, Any]:
    """Add text to the end of an existing memory file's body (a fact's text)."""
    return await api.memory_append(project_id, path, text)


# -- the server -----------------------------------------------------------------------------------------------


class Gateway:
    """The API clients the tools call through: one for a fixed token (stdio), or one per bearer token (HTTP)."""

    def __init__(
        self,
        api_url: str | None,
        token: str | None = None,
        *,
        per_request_token: bool = False,
        transport: Any = None,
        settings: Settings | None = None,
    ) -> None:
        self.api_url = api_url
        self.token = token
        self.per_request_token = per_request_token
        self.transport = transport
        self.settings = settings
        self._clients: OrderedDict[str, AsyncClient] = OrderedDict()

    def client_for(self, headers: Any) -> AsyncClient:
        """The client for a call: the fixed token's, or the one of the request's bearer token (none: no token)."""
        token = _bearer(headers) if self.per_request_token else (self.token or "")
        client = self._clients.get(token)
        if client is None:
            client = AsyncClient(self.api_url, token, settings=self.settings, transport=self.transport)
            self._clients[token] = client
            while len(self._clients) > defaults.MCP_CLIENTS:
                _, oldest = self._clients.popitem(last=False)
                # A call in flight on it finishes on its open connection; the pool closes once idle.
                _close_later(oldest)
        else:
            self._clients.move_to_end(token)
        return client

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), OrderedDict()
        for client in clients:
            await client.aclose()


def _bearer(headers: Any) -> str:
    authorization = (headers or {}).get("authorization") or ""
    scheme, _, token = str(authorization).partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


_closing: set[asyncio.Task[None]] = set()  # closes under way: a task the loop only weakly holds could vanish


def _close_later(client: AsyncClient) -> None:
    task = asyncio.get_running_loop().create_task(client.aclose())
    _closing.add(task)
    task.add_done_callback(_closing.discard)


def _served(name: str, fn: ToolFunction, gateway: Gateway) -> Any:
    """The SDK's tool for a registered function: its signature without the client, plus the request's context."""
    from mcp.server.mcpserver import Context
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.server.mcpserver.tools import Tool

    async def call(ctx: Context, **arguments: Any) -> Any:
        try:
            return await fn(gateway.client_for(ctx.headers), **arguments)
        except PvmError as exc:
            raise ToolError(f"pvm: {exc}") from None

    signature = inspect.signature(fn, eval_str=True)
    arguments = list(signature.parameters.values())[1:]  # the first is the AsyncClient
    context = inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context)
    call.__signature__ = signature.replace(parameters=[*arguments, context])  # type: ignore[attr-defined]
    call.__name__ = name
    call.__doc__ = fn.__doc__
    return Tool.from_function(call, name=name, description=inspect.getdoc(fn), context_kwarg="ctx")


def build_server(gateway: Gateway, registry: ToolRegistry = TOOLS) -> Any:
    """An `MCPServer` serving every registered tool through `gateway`."""
    from mcp.server.mcpserver import MCPServer

    return MCPServer(
        name="pvm",
        instructions="PVM is this project's shared memory: search it, read your context, record what you did, "
        "learn and recall values, and list, read and edit its memory files. Every tool names a project; your "
        "token reaches only its projects.",
        tools=[_served(name, fn, gateway) for name, fn in registry.functions.items()],
        log_level="WARNING",
    )


def http_app(gateway: Gateway, host: str = defaults.BIND_ADDR, path: str = defaults.MCP_PATH) -> Any:
    """The streamable HTTP app (stateless, JSON answers): every request carries its own bearer token."""
    return build_server(gateway).streamable_http_app(
        streamable_http_path=path, stateless_http=True, json_response=True, host=host
    )


def beside_api(api: Any, host: str = defaults.BIND_ADDR, path: str = defaults.MCP_PATH) -> Any:
    """The API app with the MCP tools at `path` (`pvm serve --mcp`), calling the API in this process.

    The tools reach the API app through `httpx.ASGITransport`, not over a
    socket: no second server, no loopback hop (bench/surface_mcp.py measures
    both). Each request's bearer token is passed on as `pvm mcp --transport
    http` passes it, so the API's own auth decides what it reaches.
    """
    import httpx

    gateway = Gateway("http://pvm-api", per_request_token=True, transport=httpx.ASGITransport(app=api))
    tools = http_app(gateway, host=host, path=path)  # on loopback the SDK also checks Host and Origin

    async def app(scope: Any, receive: Any, send: Any) -> None:
        # The MCP app's lifespan runs its session manager; the API app has none of its own.
        if scope["type"] == "lifespan" or scope.get("path", "").rstrip("/") == path:
            await tools(scope, receive, send)
        else:
            await api(scope, receive, send)

    return app


def run_stdio(api_url: str | None, token: str | None, settings: Settings) -> None:
    """`pvm mcp`: serve the tools on stdin/stdout with one token (`--token`, else PVM_API_TOKEN)."""
    server = build_server(Gateway(api_url, settings.api_token if token is None else token, settings=settings))
    server.run("stdio")


def run_http(api_url: str | None, addr: str, port: int, settings: Settings) -> None:
    """`pvm mcp --transport http`: serve the tools at http://addr:port/mcp; each caller's bearer token scopes it."""
    import uvicorn

    app = http_app(Gateway(api_url, per_request_token=True, settings=settings), host=addr)
    uvicorn.run(app, host=addr, port=port, log_level="warning", access_log=False)
