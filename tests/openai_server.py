"""A small OpenAI-compatible HTTP server on loopback for tests, with scripted faults.

Real HTTP: a starlette app under uvicorn (the stack the reader API uses), run in a
background thread on a socket bound to a free port before the thread starts, so
there is no race for the port and the fixture returns as soon as uvicorn reports
it is serving (~tens of ms). `http.server` would start as fast but speaks a
thinner HTTP/1.1 (keep-alive, chunking) than the production servers the client
meets; uvicorn behaves like them.

    from tests.openai_server import openai_server_fixture, status  # noqa: F401  (the fixture is `openai_server`)

    def test_x(openai_server):
        openai_server.fail_next(status(429, retry_after=0.2), status(500))
        client = openai.OpenAI(base_url=openai_server.base_url, api_key="k")
        ...
        assert openai_server.embedding_batches() == [2048, 2048, 904]

Chat completions answer from a queue the test scripts (`queue_chat_reply`: a dict
is sent as its JSON, a str as it is, `fenced(...)` / `answer(...)` for fenced
JSON, cut-off answers or set token counts), else echo the last user message;
`options.refuse_response_format` makes the server refuse those
`response_format` types with a 400, as servers and models without structured
output do. `chat_requests()` gives what was sent (messages, response_format).

Embeddings are deterministic: signed feature hashing of word tokens and their
character trigrams into `dimensions` (default 64) floats, L2-normalised, so texts
that share words get similar vectors. `embed_text` is the same function, for
expected values.
"""

from __future__ import annotations

import array
import asyncio
import base64
import contextlib
import hashlib
import json
import math
import re
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

DEFAULT_DIMENSIONS = 64
MAX_BATCH = 2048  # OpenAI's limit on inputs per embeddings request

_TOKEN = re.compile(r"[a-z0-9]+")


# Faults -------------------------------------------------------------------------


@dataclass(frozen=True)
class Status:
    """Answer with this HTTP status and an OpenAI-style error body."""

    code: int
    retry_after: float | None = None  # seconds, sent as `Retry-After`
    retry_after_ms: int | None = None  # sent as `retry-after-ms` (OpenAI's finer header)
    message: str | None = None


@dataclass(frozen=True)
class Delay:
    """Wait this long before answering normally (longer than the client's timeout: a timeout)."""

    seconds: float


@dataclass(frozen=True)
class MalformedJson:
    """200 with a JSON content type and a truncated body."""


@dataclass(frozen=True)
class WrongShape:
    """200 with valid JSON of the wrong shape.

    kinds: `missing_data`, `wrong_count` (one item short), `non_float` (strings in
    the vector), `bad_index` (index 0 twice), `ragged` (one vector a float short).
    Chat completions: the `choices` list is missing, whatever the kind.
    """

    kind: str = "missing_data"


Fault = Status | Delay | MalformedJson | WrongShape


# Scripted chat answers ------------------------------------------------------------


@dataclass(frozen=True)
class ChatAnswer:
    """One scripted chat completion: its message content and how the server reports it."""

    content: str | None
    finish_reason: str = "stop"  # "length": cut off at max_tokens
    refusal: str | None = None  # the message's `refusal` (content is then None, as OpenAI sends it)
    prompt_tokens: int | None = None  # usage to report; None: counted from the request's words
    completion_tokens: int | None = None  # None: counted from the content's words


def answer(value: Any, **how: Any) -> ChatAnswer:
    """A scripted answer: a str (or None: no content) as it is, anything else as its JSON; `how` sets the rest."""
    return ChatAnswer(value if value is None or isinstance(value, str) else json.dumps(value), **how)


def fenced(value: Any, prose: str = "Here is the JSON you asked for:") -> ChatAnswer:
    """JSON in a Markdown ```json fence, after a line of prose, as chat models like to answer."""
    return ChatAnswer(f"{prose}\n```json\n{json.dumps(value, indent=2)}\n```\nLet me know if you need more.")


ChatReply = str | dict[str, Any] | list[Any] | ChatAnswer

WRONG_SHAPES = ("missing_data", "wrong_count", "non_float", "bad_index", "ragged")


def status(code: int, retry_after: float | None = None, retry_after_ms: int | None = None) -> Status:
    return Status(code, retry_after=retry_after, retry_after_ms=retry_after_ms)


def delay(seconds: float) -> Delay:
    return Delay(seconds)


def malformed_json() -> MalformedJson:
    return MalformedJson()


def wrong_shape(kind: str = "missing_data") -> WrongShape:
    if kind not in WRONG_SHAPES:
        raise ValueError(f"wrong_shape kind {kind!r} is not one of {', '.join(WRONG_SHAPES)}")
    return WrongShape(kind)


# The deterministic model ----------------------------------------------------------


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def embed_text(text: str, dimensions: int = DEFAULT_DIMENSIONS) -> list[float]:
    """The vector the server returns for `text`: hashed words + trigrams, L2-normalised."""
    vector = [0.0] * dimensions
    for token in tokens(text):
        features = [(token, 1.0)]
        padded = f"#{token}#"
        features += [(padded[i : i + 3], 0.3) for i in range(len(padded) - 2)]
        for feature, weight in features:
            digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
            slot = int.from_bytes(digest[:4], "little") % dimensions
            vector[slot] += weight if digest[4] & 1 else -weight
    norm = math.sqrt(sum(x * x for x in vector))
    if norm == 0.0:  # no tokens: a fixed unit vector rather than zeros (cosine of zero is undefined)
        vector[0] = 1.0
        return vector
    return [x / norm for x in vector]


def _b64_floats(vector: list[float]) -> str:
    packed = array.array("f", vector)
    if sys.byteorder == "big":  # the wire format is little-endian float32
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode()


# The server -----------------------------------------------------------------------


@dataclass
class RecordedRequest:
    """One request the server received, before any fault was applied."""

    method: str
    path: str
    body: Any  # parsed JSON, or None when the body was not JSON
    authorization: str | None
    fault: Fault | None = None

    @property
    def messages(self) -> list[dict[str, Any]]:
        raw = self.body.get("messages") if isinstance(self.body, dict) else None
        return list(raw) if isinstance(raw, list) else []

    @property
    def response_format(self) -> dict[str, Any] | None:
        raw = self.body.get("response_format") if isinstance(self.body, dict) else None
        return raw if isinstance(raw, dict) else None

    @property
    def inputs(self) -> list[str]:
        raw = self.body.get("input") if isinstance(self.body, dict) else None
        if isinstance(raw, str):
            return [raw]
        return list(raw) if isinstance(raw, list) else []


@dataclass
class _Options:
    api_key: str | None = None  # when set, other bearer tokens get 401
    shuffle: bool = False  # return embedding items in reverse order (clients must use `index`)
    ignore_dimensions: bool = False  # behave like a model that does not support `dimensions`
    ignore_encoding_format: bool = False  # always answer floats, as some compatible servers do
    chat_replies: deque[ChatAnswer] = field(default_factory=deque)
    # response_format types answered with a 400 naming `response_format`, like a server without structured output
    refuse_response_format: frozenset[str] = frozenset()
    refuse_max_tokens: bool = False  # 400 on `max_tokens`, as OpenAI's reasoning models answer it


class _Uvicorn(uvicorn.Server):
    """uvicorn that stops as soon as it is asked: its own main loop polls for exit every 0.1 s."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.stop_requested = asyncio.Event()

    async def main_loop(self) -> None:
        await self.stop_requested.wait()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn's own shutdown then sleeps 0.1 s for connections to drain; a test
        # server has nothing worth draining, and a fixture per test pays it each time.
        for server in self.servers:
            server.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()  # closes idle keep-alive connections now
        for task in list(self.server_state.tasks):
            task.cancel()  # requests still running (a delay fault) end here
        await asyncio.sleep(0)
        for connection in list(self.server_state.connections):
            transport = getattr(connection, "transport", None)
            if transport is not None:
                transport.close()
        for server in self.servers:
            await server.wait_closed()


class OpenAIServer:
    """An OpenAI-compatible server on 127.0.0.1 with a queue of scripted faults and a request log."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: deque[Fault] = deque()
        self._requests: list[RecordedRequest] = []
        self.options = _Options()
        self._socket: socket.socket | None = None
        self._server: _Uvicorn | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self.port = 0
        self.app = Starlette(
            routes=[
                Route("/v1/embeddings", self._embeddings, methods=["POST"]),
                Route("/v1/chat/completions", self._chat_completions, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )

    # -- control, from the test's thread --

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def api_key(self) -> str | None:
        return self.options.api_key

    @api_key.setter
    def api_key(self, value: str | None) -> None:
        self.options.api_key = value

    def fail_next(self, *faults: Fault, times: int = 1) -> None:
        """Apply these faults, in order, to the next requests (`times` repeats the sequence)."""
        with self._lock:
            self._faults.extend(list(faults) * times)

    def queue_chat_reply(self, *replies: ChatReply) -> None:
        """The next chat completions answer these, in order (then echo again): a str as it is, a dict as JSON."""
        with self._lock:
            self.options.chat_replies.extend(r if isinstance(r, ChatAnswer) else answer(r) for r in replies)

    @property
    def pending_chat_replies(self) -> int:
        with self._lock:
            return len(self.options.chat_replies)

    def chat_requests(self) -> list[RecordedRequest]:
        """The chat completions requests, in arrival order."""
        return [r for r in self.requests if r.path == "/v1/chat/completions"]

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def pending_faults(self) -> int:
        with self._lock:
            return len(self._faults)

    def embedding_batches(self) -> list[int]:
        """The number of inputs of each embeddings request, in arrival order."""
        return [len(r.inputs) for r in self.requests if r.path == "/v1/embeddings"]

    def reset(self) -> None:
        """Forget faults, options and the request log."""
        with self._lock:
            self._faults.clear()
            self._requests.clear()
            self.options = _Options()

    def start(self, timeout: float = 5.0) -> OpenAIServer:
        # proto must say TCP: asyncio sets TCP_NODELAY on accepted sockets only when
        # `sock.proto == IPPROTO_TCP`, and a socket made with proto 0 makes every
        # keep-alive request wait ~40 ms for a delayed ACK (Nagle).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(("127.0.0.1", 0))
        self._socket = sock
        self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            loop="asyncio",
            timeout_graceful_shutdown=1,
        )
        self._server = _Uvicorn(config)
        self._thread = threading.Thread(target=self._run, name=f"openai-server-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the test OpenAI server failed to start (see the log above)")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the test OpenAI server did not start within {timeout}s")
            time.sleep(0.002)
        return self

    def stop(self) -> None:
        if self._server is None or self._thread is None:
            return
        # Requests still sleeping in a delay fault must not hold the shutdown.
        self._server.force_exit = True
        loop, server, stopping = self._loop, self._server, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():

            def request_stop() -> None:
                stopping.set()
                server.stop_requested.set()

            with contextlib.suppress(RuntimeError):  # the loop closed between the check and the call
                loop.call_soon_threadsafe(request_stop)
        self._thread.join(timeout=5.0)
        if self._thread.is_alive():
            raise RuntimeError("the test OpenAI server did not stop within 5s")
        if self._socket is not None:
            self._socket.close()
        self._server = self._thread = self._socket = None

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stopping = asyncio.Event()
            assert self._server is not None and self._socket is not None
            await self._server.serve(sockets=[self._socket])

        asyncio.run(main())

    # -- request handling, on the server's loop --

    async def _admit(self, request: Request) -> tuple[Any, Fault | None]:
        """Parse and log the request; take the next fault; apply a delay fault here."""
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        with self._lock:
            fault = self._faults.popleft() if self._faults else None
            self._requests.append(
                RecordedRequest(
                    method=request.method,
                    path=request.url.path,
                    body=body,
                    authorization=request.headers.get("authorization"),
                    fault=fault,
                )
            )
        if isinstance(fault, Delay):
            assert self._stopping is not None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=fault.seconds)
        return body, fault

    def _refusal(self, body: Any, fault: Fault | None, request: Request, *, json_body: bool = True) -> Response | None:
        """The error response this request gets (a scripted status, bad auth, bad JSON), if any."""
        if isinstance(fault, Status):
            headers = {}
            if fault.retry_after is not None:
                headers["retry-after"] = f"{fault.retry_after:g}"
            if fault.retry_after_ms is not None:
                headers["retry-after-ms"] = str(fault.retry_after_ms)
            message = fault.message or f"scripted failure with status {fault.code}"
            return _error(fault.code, message, headers=headers)
        expected = self.options.api_key
        if expected is not None and request.headers.get("authorization") != f"Bearer {expected}":
            return _error(401, "Incorrect API key provided.", error_code="invalid_api_key")
        if json_body and not isinstance(body, dict):
            return _error(400, "We could not parse the JSON body of your request.")
        return None

    async def _embeddings(self, request: Request) -> Response:
        body, fault = await self._admit(request)
        refusal = self._refusal(body, fault, request)
        if refusal is not None:
            return refusal
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return _error(400, "you must provide a model parameter", param="model")
        texts = body.get("input")
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            return _error(400, "'input' must be a string or a non-empty array of strings", param="input")
        if len(texts) > MAX_BATCH:
            return _error(400, f"'input' must have at most {MAX_BATCH} items, got {len(texts)}", param="input")
        if any(t == "" for t in texts):
            return _error(400, "'input' cannot contain an empty string", param="input")
        dimensions = body.get("dimensions", DEFAULT_DIMENSIONS)
        if self.options.ignore_dimensions:
            dimensions = DEFAULT_DIMENSIONS
        if isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1:
            return _error(400, "'dimensions' must be a positive integer", param="dimensions")
        encoding = body.get("encoding_format", "float")
        if encoding not in ("float", "base64"):
            return _error(400, "'encoding_format' must be 'float' or 'base64'", param="encoding_format")
        if self.options.ignore_encoding_format:
            encoding = "float"

        vectors = [embed_text(t, dimensions) for t in texts]
        items: list[dict[str, Any]] = [
            {"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)
        ]
        if self.options.shuffle:
            items.reverse()
        prompt_tokens = sum(max(1, len(tokens(t))) for t in texts)
        payload: dict[str, Any] = {
            "object": "list",
            "data": items,
            "model": model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        }
        if isinstance(fault, WrongShape):
            _break_embeddings(payload, fault.kind)
        if encoding == "base64":
            for item in items:
                if all(isinstance(x, float) for x in item["embedding"]):
                    item["embedding"] = _b64_floats(item["embedding"])
        if isinstance(fault, MalformedJson):
            return _truncated(payload)
        return JSONResponse(payload)

    async def _chat_completions(self, request: Request) -> Response:
        body, fault = await self._admit(request)
        refusal = self._refusal(body, fault, request)
        if refusal is not None:
            return refusal
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _error(400, "'messages' must be a non-empty array", param="messages")
        if body.get("stream"):
            return _error(400, "the test server does not stream", param="stream")
        response_format = body.get("response_format") or {}
        if not isinstance(response_format, dict):
            return _error(400, "'response_format' must be an object", param="response_format")
        if response_format.get("type") in self.options.refuse_response_format:
            return _error(
                400,
                f"Invalid parameter: 'response_format' of type '{response_format['type']}' is not supported with "
                "this model.",
                param="response_format",
                error_code="invalid_parameter",
            )
        if self.options.refuse_max_tokens and "max_tokens" in body:
            return _error(
                400,
                "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' "
                "instead.",
                param="max_tokens",
                error_code="unsupported_parameter",
            )
        last_user = next(
            (m.get("content") for m in reversed(messages) if isinstance(m, dict) and m.get("role") == "user"), ""
        )
        if isinstance(last_user, list):  # content parts: join their text
            last_user = " ".join(str(p.get("text", "")) for p in last_user if isinstance(p, dict))
        elif not isinstance(last_user, str):
            last_user = ""
        # A fault that replaces the answer (bad JSON, a wrong shape) leaves the scripted one for the next request.
        replaced = isinstance(fault, MalformedJson | WrongShape)
        with self._lock:
            scripted = self.options.chat_replies.popleft() if self.options.chat_replies and not replaced else None
        if scripted is None:
            echo = response_format.get("type") in ("json_object", "json_schema")
            scripted = ChatAnswer(json.dumps({"echo": last_user}) if echo else f"echo: {last_user}")
        content = scripted.content
        prompt_tokens = scripted.prompt_tokens
        if prompt_tokens is None:
            prompt_tokens = sum(len(tokens(str(m.get("content", "")))) for m in messages if isinstance(m, dict))
        completion_tokens = scripted.completion_tokens
        if completion_tokens is None:
            completion_tokens = len(tokens(content or scripted.refusal or ""))
        digest = hashlib.sha1(json.dumps(messages, sort_keys=True).encode()).hexdigest()[:24]
        payload: dict[str, Any] = {
            "id": f"chatcmpl-{digest}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model") or "test-chat",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content, "refusal": scripted.refusal},
                    "finish_reason": scripted.finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
        if isinstance(fault, MalformedJson):
            return _truncated(payload)
        if isinstance(fault, WrongShape):
            del payload["choices"]
        return JSONResponse(payload)

    async def _models(self, request: Request) -> Response:
        body, fault = await self._admit(request)
        refusal = self._refusal(body, fault, request, json_body=False)
        if refusal is not None:
            return refusal
        data = [
            {"id": m, "object": "model", "created": 0, "owned_by": "pvm-tests"} for m in ("test-embed", "test-chat")
        ]
        return JSONResponse({"object": "list", "data": data})


def _error(
    status_code: int,
    message: str,
    *,
    headers: dict[str, str] | None = None,
    param: str | None = None,
    kind: str | None = None,
    error_code: str | None = None,
) -> JSONResponse:
    """An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`."""
    kind = kind or ("server_error" if status_code >= 500 else "invalid_request_error")
    error = {"message": message, "type": kind, "param": param, "code": error_code}
    return JSONResponse({"error": error}, status_code=status_code, headers=headers)


def _truncated(payload: dict[str, Any]) -> Response:
    text = json.dumps(payload)
    return Response(text[: max(1, len(text) // 2)], media_type="application/json")


def _break_embeddings(payload: dict[str, Any], kind: str) -> None:
    items = payload["data"]
    if kind == "missing_data":
        del payload["data"]
    elif kind == "wrong_count":
        items.pop()
    elif kind == "non_float":
        items[0]["embedding"] = [str(x) for x in items[0]["embedding"]]
    elif kind == "bad_index":
        items[-1]["index"] = items[0]["index"] if len(items) > 1 else len(items)
    elif kind == "ragged":
        items[0]["embedding"] = items[0]["embedding"][:-1]


@pytest.fixture(name="openai_server")
def openai_server_fixture() -> Iterator[OpenAIServer]:
    """A fresh OpenAI-compatible server on a free loopback port, stopped after the test."""
    server = OpenAIServer().start()
    try:
        yield server
    finally:
        server.stop()
