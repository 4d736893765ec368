"""Bearer tokens scoped to projects: the tokens file (PVM_API_TOKENS_FILE), its validation and its reloading.

The file holds only the SHA-256 of each token, never a token:

    {"tokens": [{"name": "team-a", "sha256": "<hex>", "projects": ["apollo", "borealis"]},
                {"name": "ops", "sha256": "<hex>", "projects": ["*"], "global": true}]}

A presented token is hashed and looked up by its hash, so neither the lookup
nor its timing says anything about a token the server knows. `"*"` grants
every project. `"global": true` grants the global tier of facts, which every
project of the deployment shares (ARCHITECTURE invariant 5: read only where
asked for, written only by explicit promotion or learning): reading it, and
promoting or learning into it, through any project the token reaches. It is a
grant of its own, never implied by `"*"`, so a file written before the global
tier existed grants it to nobody. The single PVM_API_TOKEN (and an API with no
token at all) reaches every project and the global tier. The server re-reads the file when it changes, so a token is
revoked by deleting its entry; a file that stops being valid keeps the last
good set in force (and says so in the log).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts.minute import MAX_NAME_LENGTH, PROJECT_ID_RULE, is_valid_project_id
from pvm import defaults
from pvm.config import ConfigError

log = logging.getLogger(__name__)

ALL_PROJECTS = "*"
RELOAD_CHECK_S = defaults.API_TOKENS_RELOAD_CHECK_S
_HEX_DIGITS = frozenset("0123456789abcdef")


class TokenFileError(ConfigError):
    """A tokens file PVM cannot use: the message names the file, the entry and the fix."""


@dataclass(frozen=True)
class TokenScope:
    """What one token may read and write: its name (for people and logs), its projects, and the global tier or not."""

    name: str
    projects: frozenset[str]
    sha256: str = ""
    global_tier: bool = False

    @property
    def all_projects(self) -> bool:
        return ALL_PROJECTS in self.projects

    def allows(self, project_id: str) -> bool:
        """Whether this token may read and write `project_id`."""
        return self.all_projects or project_id in self.projects

    @property
    def allows_global(self) -> bool:
        """Whether this token may read the global tier of facts and write to it (promote, learn, retract)."""
        return self.global_tier


# The single PVM_API_TOKEN, and an API that asks for no token at all, reach every project and the global tier.
EVERY_PROJECT = TokenScope("PVM_API_TOKEN", frozenset({ALL_PROJECTS}), global_tier=True)


def token_sha256(token: str | bytes) -> str:
    """The hex SHA-256 of a token: what the tokens file stores in place of the token."""
    return hashlib.sha256(token.encode() if isinstance(token, str) else token).hexdigest()


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ValueError("needs a non-empty string name")
    if len(name) > MAX_NAME_LENGTH or not name.isprintable() or name != name.strip():
        raise ValueError(
            f"name {name[:40]!r} must be printable, without surrounding spaces, at most {MAX_NAME_LENGTH} chars"
        )
    return name


def _check_projects(projects: object) -> frozenset[str]:
    if not isinstance(projects, list) or not projects:
        raise ValueError('projects must be a non-empty list of project ids (or ["*"] for every project)')
    for project in projects:
        if project != ALL_PROJECTS and not is_valid_project_id(project):
            shown = project[:40] if isinstance(project, str) else project
            raise ValueError(
                f'project {shown!r} is not a valid project id: {PROJECT_ID_RULE}, or "*" for every project'
            )
    return frozenset(projects)


def _check_global(grant: object) -> bool:
    if not isinstance(grant, bool):
        raise ValueError(
            f"global must be true or false (JSON booleans), got {json.dumps(grant)}: true grants the global tier"
        )
    return grant


def _check_sha256(digest: object) -> str:
    if not isinstance(digest, str) or len(digest) != 64 or not set(digest.lower()) <= _HEX_DIGITS:
        raise ValueError("sha256 must be 64 hex digits: the SHA-256 of the token (`pvm token new` prints it)")
    return digest.lower()


def parse_tokens(document: Any) -> dict[str, TokenScope]:
    """The scopes of a tokens file's JSON, by token hash; ValueError naming the entry when any entry is bad."""
    if not isinstance(document, dict) or not isinstance(document.get("tokens"), list):
        raise ValueError('must be a JSON object {"tokens": [{"name": ..., "sha256": ..., "projects": [...]}, ...]}')
    scopes: dict[str, TokenScope] = {}
    names: set[str] = set()
    for i, entry in enumerate(document["tokens"]):
        label = f"tokens[{i}]"
        try:
            if not isinstance(entry, dict):
                raise ValueError(f"must be an object, got {type(entry).__name__}")
            name = _check_name(entry.get("name"))
            label = f"tokens[{i}] ({name!r})"
            if "token" in entry:
                raise ValueError('holds a plaintext "token": store only its sha256, and delete the token from the file')
            digest = _check_sha256(entry.get("sha256"))
            projects = _check_projects(entry.get("projects"))
            global_tier = _check_global(entry.get("global", False))
            if name in names:
                raise ValueError("has the same name as an earlier entry: names must be unique")
            if digest in scopes:
                raise ValueError(f"has the same sha256 as {scopes[digest].name!r}: one token, one entry")
        except ValueError as exc:
            raise ValueError(f"{label} {exc}") from None
        names.add(name)
        scopes[digest] = TokenScope(name, projects, digest, global_tier)
    return scopes


def _read_document(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TokenFileError(
            f"PVM_API_TOKENS_FILE {path} does not exist (create it with `pvm token new --file`)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenFileError(f"PVM_API_TOKENS_FILE {path} cannot be read: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TokenFileError(f"PVM_API_TOKENS_FILE {path} is not JSON: {exc}") from None


def load_tokens(path: Path) -> dict[str, TokenScope]:
    """The scopes in a tokens file, by token hash; TokenFileError for a missing, unreadable or invalid file."""
    document = _read_document(path)
    try:
        return parse_tokens(document)
    except ValueError as exc:
        raise TokenFileError(f"PVM_API_TOKENS_FILE {path}: {exc}") from None


def _signature(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    # An editor's in-place write and an atomic rename both change one of these.
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class TokenFile:
    """The tokens file as a serving process sees it: loaded at start, re-read when it changes.

    The first load must succeed (TokenFileError otherwise: the server never
    starts open). Later, at most once per `check_every_s`, a changed file is
    read again; a read that fails keeps the previous scopes and logs an error
    once per broken version of the file.
    """

    def __init__(
        self, path: Path, check_every_s: float = RELOAD_CHECK_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = Path(path)
        self.check_every_s = check_every_s
        self._clock = clock
        self._signature = _signature(self.path)
        self._scopes = load_tokens(self.path)
        self._checked_at = clock()
        self._failed_signature: tuple[int, int, int] | None = None

    def lookup(self, token: str | bytes) -> TokenScope | None:
        """The scope of a presented token, or None when the file does not know it."""
        return self.scopes().get(token_sha256(token))

    def scopes(self) -> Mapping[str, TokenScope]:
        """The current scopes by token hash, after a reload if the file changed."""
        now = self._clock()
        if now - self._checked_at >= self.check_every_s:
            self._checked_at = now
            self._reload_if_changed()
        return self._scopes

    def _reload_if_changed(self) -> None:
        signature = _signature(self.path)
        if signature == self._signature:
            return
        try:
            scopes = load_tokens(self.path)
        except TokenFileError as exc:
            # Retried at the next check (an editor may be mid-write), but logged once per version.
            if signature != self._failed_signature:
                self._failed_signature = signature
                log.error("%s; keeping the %d tokens loaded before", exc, len(self._scopes))
            return
        self._signature = signature
        self._failed_signature = None
        self._scopes = scopes
        log.info("PVM_API_TOKENS_FILE %s reloaded: %d tokens", self.path, len(scopes))


def token_entry(name: str, token: str, projects: Iterable[str], *, global_tier: bool = False) -> dict[str, Any]:
    """The tokens-file entry of a token (its hash, never the token); ValueError for a bad name or project.

    `global_tier` adds ``"global": true``; the key is left out otherwise, as in files written before it existed.
    """
    try:
        entry: dict[str, Any] = {"name": _check_name(name), "sha256": token_sha256(token)}
        entry["projects"] = sorted(set(projects))
        _check_projects(entry["projects"])
    except ValueError as exc:
        raise ValueError(f"token {name!r}: {exc}") from None
    if global_tier:
        entry["global"] = True
    return entry


def add_to_file(path: Path, entry: Mapping[str, Any]) -> None:
    """Append an entry to a tokens file (created when missing), atomically and readable by its owner only.

    The file is validated first, so a broken file is never made worse, and a
    name already in it is refused.
    """
    document: Any = _read_document(path) if path.exists() else {"tokens": []}
    try:
        existing = parse_tokens(document)
    except ValueError as exc:
        raise TokenFileError(f"PVM_API_TOKENS_FILE {path}: {exc}; fix it before adding tokens") from None
    if any(scope.name == entry["name"] for scope in existing.values()):
        raise TokenFileError(
            f"PVM_API_TOKENS_FILE {path} already has a token named {entry['name']!r}: "
            "pick another name, or delete that entry to revoke it first"
        )
    document["tokens"].append(dict(entry))
    parse_tokens(document)
    try:
        _write_atomically(path, json.dumps(document, indent=2) + "\n")
    except OSError as exc:
        raise TokenFileError(f"PVM_API_TOKENS_FILE {path} cannot be written: {exc}") from None


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # mkstemp creates the file 0600; the rename makes the server see the old file or the new one, never half.
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temp, 0o600)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
