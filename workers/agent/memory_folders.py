"""A memory folder on disk: reading one for an import, writing an export into one; the memory's only file I/O.

Sandboxed by `check_memory_path`: only ``*.md`` files under `ROOTS` are memory, a symlink that leads out of
the folder is refused, and the import's limits (`MEMORY_FILE_MAX_BYTES`, `MEMORY_IMPORT_MAX_FILES`,
`MEMORY_IMPORT_MAX_BYTES`) hold while reading. Beside the folders, `EXPORT_MARK` keeps the version of the
snapshot an export wrote (`read_export_version`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping

from pvm import defaults
from workers.agent.memory_errors import MemoryFileError, MemoryPathError
from workers.agent.memory_paths import ROOTS, SUFFIX, check_memory_path
from workers.agent.memory_snapshot import check_export_version

# Beside the folders: the version of the snapshot an export wrote, so an import knows what its files saw.
EXPORT_MARK = ".pvm-export.json"


def read_folder(root: str | os.PathLike[str]) -> dict[str, str]:
    """The memory files under `root` (only ``*.md`` under `ROOTS`; anything else is not memory and is skipped).

    Refused (`MemoryPathError` naming the file): a symlink that leads outside `root`, a name no memory path
    can have, a file over `MEMORY_FILE_MAX_BYTES`, more than `MEMORY_IMPORT_MAX_FILES` files or
    `MEMORY_IMPORT_MAX_BYTES` in all, text that is not UTF-8.
    """
    base = os.fspath(root)
    if not os.path.isdir(base):
        raise MemoryPathError(f"{base}: not a folder; pass the folder `pvm export` wrote")
    limit = defaults.MEMORY_FILE_MAX_BYTES
    files: dict[str, str] = {}
    total = 0
    for rel, full in _walk(base):
        if not rel.endswith(SUFFIX):
            continue
        check_memory_path(rel)
        with open(full, "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise MemoryFileError(
                f"{rel}: over {limit} bytes; a memory file holds at most that (MEMORY_FILE_MAX_BYTES)"
            )
        total += len(data)
        if total > defaults.MEMORY_IMPORT_MAX_BYTES or len(files) >= defaults.MEMORY_IMPORT_MAX_FILES:
            raise MemoryFileError(
                f"{base}: more than {defaults.MEMORY_IMPORT_MAX_FILES} files or "
                f"{defaults.MEMORY_IMPORT_MAX_BYTES} bytes (MEMORY_IMPORT_MAX_FILES, MEMORY_IMPORT_MAX_BYTES)"
            )
        try:
            files[rel] = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MemoryFileError(f"{rel}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return files


def _inside(target: str, real_base: str) -> bool:
    return target == real_base or target.startswith(real_base.rstrip(os.sep) + os.sep)


def _walk(base: str) -> Iterable[tuple[str, str]]:
    """(path relative to `base`, full path) of the files under `base`'s `ROOTS`, depth first.

    A symlink is followed only when its target stays inside `base` (else `MemoryPathError`), each folder once.
    """
    real_base = os.path.realpath(base)
    stack: list[tuple[str, str]] = []
    for top in ROOTS:
        full = os.path.join(base, top)
        if os.path.islink(full) and not _inside(os.path.realpath(full), real_base):
            raise MemoryPathError(
                f"{full}: a symlink to {os.path.realpath(full)}, outside the memory folder {real_base}; "
                "memory files live inside it"
            )
        if os.path.isdir(full):
            stack.append((top, full))
    seen: set[str] = set()
    while stack:
        rel_dir, dir_path = stack.pop()
        real_dir = os.path.realpath(dir_path)
        if real_dir in seen:
            continue
        seen.add(real_dir)
        with os.scandir(dir_path) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                rel = f"{rel_dir}/{entry.name}"
                if entry.is_symlink():
                    target = os.path.realpath(entry.path)
                    if not _inside(target, real_base):
                        raise MemoryPathError(
                            f"{entry.path}: a symlink to {target}, outside the memory folder {real_base}; "
                            "memory files live inside it"
                        )
                    if os.path.isdir(target):
                        stack.append((rel, entry.path))
                    elif os.path.isfile(target):
                        yield rel, entry.path
                elif entry.is_dir(follow_symlinks=False):
                    stack.append((rel, entry.path))
                elif entry.is_file(follow_symlinks=False):
                    yield rel, entry.path


def write_folder(root: str | os.PathLike[str], files: Mapping[str, str], version: int | None = None) -> int:
    """Write `files` under `root` (created as needed); old ``*.md`` files under `ROOTS` not in `files` go, so the
    folder is the export. A symlink out of `root` is refused before anything is written. `version` (the snapshot's
    `last_ms`) goes in `EXPORT_MARK`, where `read_export_version` finds it for the import. Returns the files
    written.
    """
    base = os.fspath(root)
    os.makedirs(base, exist_ok=True)
    for top in ROOTS:
        if os.path.islink(os.path.join(base, top)):
            raise MemoryPathError(f"{os.path.join(base, top)}: a symlink; the export writes real folders in {base}")
    for path in files:
        check_memory_path(path)
    for rel, full in list(_walk(base)):  # refuses a symlink out of `root` before anything changes
        if rel.endswith(SUFFIX) and rel not in files:
            os.unlink(full)
    for folder in sorted({path.rpartition("/")[0] for path in files}):
        os.makedirs(os.path.join(base, folder), exist_ok=True)
    for path, text in files.items():
        _write_file(os.path.join(base, path), text.encode("utf-8"))
    mark = os.path.join(base, EXPORT_MARK)
    if version is not None:
        _write_file(mark, (json.dumps({"version": version}) + "\n").encode())
    elif os.path.lexists(mark):
        os.unlink(mark)
    return len(files)


def read_export_version(root: str | os.PathLike[str]) -> int | None:
    """The version `write_folder` kept in `root`'s `EXPORT_MARK`, or None when there is none (a folder written by
    hand or by an older PVM: the import then goes by the files' own versions)."""
    mark = os.path.join(os.fspath(root), EXPORT_MARK)
    if not os.path.lexists(mark):
        return None
    if os.path.islink(mark) or not os.path.isfile(mark):
        raise MemoryPathError(f"{mark}: not a plain file; the export writes it (remove it to import without it)")
    with open(mark, "rb") as f:
        data = f.read(4096)
    try:
        version = json.loads(data)["version"]
    except (ValueError, KeyError, TypeError):
        raise MemoryFileError(
            f'{mark}: not what the export wrote ({{"version": <Unix ms>}}); remove it or export again'
        ) from None
    return check_export_version(version, f"{mark}: version")


def _write_file(path: str, data: bytes) -> None:
    # os.open / os.write: a text-mode open() per file costs more than the write itself, over thousands of files.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
