"""The Markdown memory's refusals: the errors a caller can fix, each with the HTTP status the API answers with.

Raised by every module of the Markdown memory (`memory_paths`, `memory_front_matter`, `memory_plan`,
`memory_folders`, `memory_tools`); no I/O here.
"""

from __future__ import annotations

from collections.abc import Sequence


class MemoryFileError(ValueError):
    """A Markdown memory request a caller can fix; the message names the file (and field) and the fix.

    `status` is the HTTP status the API answers with; `problems` lists every refused file when there are several.
    """

    status = 422

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems = list(problems) or [message]


class MemoryPathError(MemoryFileError):
    """A path outside the project's memory root, or one no memory file can have."""

    status = 400


class MemoryNotFound(MemoryFileError):
    """No memory file at that path."""

    status = 404


class MemoryForbidden(MemoryFileError):
    """A file of the global tier in a request without the global grant (a token's ``"global": true``, ``--global``)."""

    status = 403


class MemoryConflict(MemoryFileError):
    """An edit of a fact that changed since the file was exported (its `version` is not the store's), or a derived
    (read-only) file edited."""

    status = 409
