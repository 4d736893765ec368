"""Where each file of the Markdown memory lives, and which paths and files the memory accepts; no I/O.

The layout (docs/memory-files.md): ``facts/<tier>/<type>/<slug>-<id8>.md`` for a fact,
``learned/<tier>/<slug>-<id8>.md`` for a learned key, ``episodes/<thread>/...md`` and
``summaries/<thread>/...md`` for what the summarize pool derived (read-only). `check_memory_path` is the
sandbox rule every path passes (API, CLI, memory tools, folders); `check_global_grant` and
`check_global_visible` keep the global tier's files to callers with the global grant; `check_size` bounds a
file; `tree_lines` draws paths as a tree.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote

from contracts.fact_changes import LEARNED_SUBJECT
from contracts.facts import Fact, Tier, normalize_text
from contracts.summaries import Chunk, Episode
from pvm import defaults
from workers.agent.memory_errors import MemoryFileError, MemoryForbidden, MemoryPathError

FACTS_ROOT = "facts"
LEARNED_ROOT = "learned"
EPISODES_ROOT = "episodes"
SUMMARIES_ROOT = "summaries"
EDITABLE_ROOTS = (FACTS_ROOT, LEARNED_ROOT)
DERIVED_ROOTS = (EPISODES_ROOT, SUMMARIES_ROOT)
ROOTS = (*EDITABLE_ROOTS, *DERIVED_ROOTS)
SUFFIX = ".md"
GLOBAL_TIER = Tier.GLOBAL.value


SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")  # one folder or file name of a memory path
# Every path `check_memory_path` accepts, and nothing else: checked first, the detailed checks only say why not.
_MEMORY_PATH = re.compile(rf"(?:{'|'.join(ROOTS)})(?:/{SEGMENT.pattern})+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # Unicode category Cc


def check_memory_path(path: Any, field: str = "path") -> str:
    """`path` if it names a file inside a project's memory root, else `MemoryPathError` naming `field`.

    Relative, ``/``-separated, segments of letters, digits and ``._-`` (none starting with a dot, so no
    ``..``), under one of `ROOTS`, ending in ``.md``, at most `MEMORY_PATH_MAX_CHARS`. A percent-encoded
    path is refused outright: the API decodes a URL once, so a ``%`` left over is an attempt at a second.
    """
    if not isinstance(path, str):
        raise MemoryPathError(f"{field} must be text such as 'facts/project/decision/x-1234abcd.md'")
    if len(path) <= defaults.MEMORY_PATH_MAX_CHARS and path.endswith(SUFFIX) and _MEMORY_PATH.fullmatch(path):
        return path
    shown = repr(path[:80])
    if len(path) > defaults.MEMORY_PATH_MAX_CHARS:
        raise MemoryPathError(
            f"{field} is {len(path)} characters; the limit is {defaults.MEMORY_PATH_MAX_CHARS} (MEMORY_PATH_MAX_CHARS)"
        )
    if _CONTROL.search(path):
        raise MemoryPathError(f"{field} {shown} holds a control character (NUL, newline, ...); name a memory file")
    if "%" in path or unquote(path) != path:
        raise MemoryPathError(f"{field} {shown} is percent-encoded; send the path itself, such as 'facts/...'")
    if path.startswith(("/", "\\")) or "\\" in path or re.match(r"[A-Za-z]:", path):
        raise MemoryPathError(f"{field} {shown} must be relative to the project's memory root, '/'-separated")
    segments = path.split("/")
    for segment in segments:
        if segment in ("", ".", ".."):
            raise MemoryPathError(
                f"{field} {shown} has an empty, '.' or '..' segment; paths stay inside the project's memory root"
            )
        if SEGMENT.fullmatch(segment) is None:
            raise MemoryPathError(
                f"{field} {shown}: segment {segment[:40]!r} may hold only letters, digits and ._- (not starting with .)"
            )
    if segments[0] not in ROOTS or len(segments) < 2:
        raise MemoryPathError(f"{field} {shown} must be under one of {', '.join(r + '/' for r in ROOTS)}")
    raise MemoryPathError(f"{field} {shown} must name a Markdown file ({SUFFIX})")


def in_global_tier(path: str) -> bool:
    """Whether a memory path (a file or folder) lies in the global tier: ``<root>/global/...``."""
    return path.split("/")[1:2] == [GLOBAL_TIER]


def check_global_grant(path: str, include_global: bool, *, by_path: bool = True) -> None:
    """`MemoryForbidden` naming `path` when it is a file of the global tier (``<root>/global/...``; with not
    `by_path`, a file the caller said is global) and the caller has no global grant (`include_global`)."""
    if include_global or (by_path and not in_global_tier(path)):
        return
    raise MemoryForbidden(
        f"{path}: the global tier is read-only without the global grant; leave its files out, or use the grant "
        '(API: a token with "global": true; CLI: --global)'
    )


def check_global_visible(path: str, include_global: bool) -> None:
    """`MemoryForbidden` naming `path` (a file or folder) when it lies in the global tier (``<root>/global/...``)
    and the caller has no global grant: those files are shown only with it, so a read or listing of one is refused
    as such rather than answered "no such file" or an empty list."""
    if include_global or not in_global_tier(path):
        return
    raise MemoryForbidden(
        f"{path}: the global tier's files are shown only with the global grant "
        '(API: a token with "global": true; CLI: --global)'
    )


def _slug(text: str) -> str:
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii").lower()
    slug = re.sub(r"[^a-z0-9]+", "-", ascii_text).strip("-")[: defaults.MEMORY_SLUG_CHARS].strip("-")
    return slug or "x"


def fact_path(fact: Fact | Mapping[str, Any]) -> str:
    """Where a fact's file lives: ``facts/<tier>/<type>/<slug>-<id8>.md`` (``learned/<tier>/...`` for a key).

    `fact` is a `Fact` or its `Fact.to_dict` form.
    """
    d = fact.to_dict() if isinstance(fact, Fact) else fact
    tier = str(d["tier_key"]).partition(":")[0]
    if normalize_text(d["subject"]) == LEARNED_SUBJECT:
        return f"{LEARNED_ROOT}/{tier}/{_slug(d['attribute'])}-{d['id'][:8]}{SUFFIX}"
    name = _slug(f"{d['subject']} {d['attribute']}")
    return f"{FACTS_ROOT}/{tier}/{d['type']}/{name}-{d['id'][:8]}{SUFFIX}"


def _thread_dir(thread: str) -> str:
    from hashlib import sha1

    return f"{_slug(thread)}-{sha1(thread.encode('utf-8')).hexdigest()[:8]}"


def chunk_path(chunk: Chunk) -> str:
    return f"{SUMMARIES_ROOT}/{_thread_dir(str(chunk.thread))}/chunk-{chunk.first_seq:06d}-{str(chunk.id)[:8]}{SUFFIX}"


def episode_path(episode: Episode) -> str:
    name = _slug(episode.title)[:40].strip("-") or "episode"
    folder = f"{EPISODES_ROOT}/{_thread_dir(str(episode.thread))}"
    return f"{folder}/{episode.first_seq:06d}-{name}-{str(episode.id)[:8]}{SUFFIX}"


def check_size(path: str, text: str) -> None:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > defaults.MEMORY_FILE_MAX_BYTES:
        raise MemoryFileError(
            f"{path}: {size} bytes; a memory file holds at most {defaults.MEMORY_FILE_MAX_BYTES} "
            "(MEMORY_FILE_MAX_BYTES)"
        )


def tree_lines(paths: Iterable[str], per_folder: int | None = None) -> list[str]:
    """`paths` as an indented tree, each folder once; with `per_folder`, at most that many files shown per folder."""
    lines: list[str] = []
    shown: set[str] = set()
    files_in: dict[str, int] = {}
    for path in sorted(paths):
        parts = path.split("/")
        for depth in range(len(parts) - 1):
            folder = "/".join(parts[: depth + 1])
            if folder not in shown:
                shown.add(folder)
                lines.append("  " * depth + parts[depth] + "/")
        folder = "/".join(parts[:-1])
        files_in[folder] = files_in.get(folder, 0) + 1
        if per_folder is None or files_in[folder] <= per_folder:
            lines.append("  " * (len(parts) - 1) + parts[-1])
        elif files_in[folder] == per_folder + 1:
            lines.append("  " * (len(parts) - 1) + "...")
    return lines
