"""One log writer process for the kill -9 tests of the log (tests/pvm/test_log_store.py).

Run as ``python -m tests.log_crash_writer LOG_DIR MODE PROJECTS PER_PROJECT START``. It appends, in one
`LogWriter.append_many` batch, PER_PROJECT minutes (ids from START) to each of the projects ``p00`` ...
``p<PROJECTS-1>``, and stops at the point MODE names, printing ``paused`` so the test can kill it there:

- ``before-commit``: the batch's frames are in the segments, its journal frame is not written yet;
- ``after-commit``: the journal frame is fsynced (the batch is durable), nothing after it has run;
- ``loop``: no pause; it prints ``paused`` once and appends batch after batch until killed.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence

from contracts import Minute, encode_minute
from pvm.stores import log


def batch(projects: int, per_project: int, start: int) -> dict[str, list[tuple[str, str, bytes]]]:
    out: dict[str, list[tuple[str, str, bytes]]] = {}
    for p in range(projects):
        project = f"p{p:02d}"
        rows = out.setdefault(project, [])
        for i in range(start, start + per_project):
            m = Minute(project_id=project, event_type="message", id=f"{project}-{i:06d}", memory_note=f"note {i}")
            rows.append((m.id, f"{1000 + i}-0", encode_minute(m)))
    return out


def pause() -> None:
    print("paused", flush=True)
    time.sleep(3600)


def main(log_dir: str, mode: str, projects: int, per_project: int, start: int) -> None:
    commit = log._Journal.commit

    def pausing_commit(self: log._Journal, batch: Mapping[str, Sequence[bytes]]) -> None:
        if mode == "before-commit":
            pause()
        commit(self, batch)
        if mode == "after-commit":
            pause()

    log._Journal.commit = pausing_commit  # type: ignore[method-assign]
    writer = log.LogWriter(log_dir)
    if mode == "loop":
        print("paused", flush=True)
        while True:
            writer.append_many(batch(projects, per_project, start))
            start += per_project
    writer.append_many(batch(projects, per_project, start))
    print("returned without pausing", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
