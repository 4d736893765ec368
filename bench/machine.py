"""The machine a benchmark ran on, as a JSON-ready dict (shared by the scripts in bench/)."""

from __future__ import annotations

import os
import platform
from typing import Any


def cpu_model() -> str | None:
    """The CPU's "model name" from /proc/cpuinfo (Linux), else whatever `platform` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def redis_server(connection: Any) -> dict[str, str | None]:
    """`redis_version` (and `valkey_version` when the server is Valkey) from `INFO server`."""
    try:
        info = connection.info("server")
    except Exception as exc:  # a benchmark should still print its numbers
        return {"redis_version": None, "error": f"{type(exc).__name__}: {exc}"}
    out: dict[str, str | None] = {"redis_version": _text(info.get("redis_version"))}
    if "valkey_version" in info:
        out["valkey_version"] = _text(info["valkey_version"])
    if "server_name" in info:
        out["server_name"] = _text(info["server_name"])
    return out


def _text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def machine(connection: Any | None = None) -> dict[str, Any]:
    """Cores, CPU model, Python and platform, plus the Redis server's version when given a client."""
    out: dict[str, Any] = {
        "cores": os.cpu_count(),
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
    }
    if connection is not None:
        out["redis_server"] = redis_server(connection)
    return out
