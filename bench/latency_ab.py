#!/usr/bin/env python
"""Search latency of several code trees, paired: the same queries on the same index, tree after tree, query by query.

On a shared 2-core machine one pass of `bench/retrieval.py`'s latency part moves by a millisecond from run to
run: a neighbour's burst lands on some queries of one run and not the other. A change worth 0.1 ms cannot be
read from two such runs. This benchmark compares trees where the noise falls on all of them alike:

1. index   `bench/retrieval.py`'s latency stream (`--points` minutes of one project, the index pool's pure core,
           random 384-dimension vectors, merged and optimized as the scheduler does), built once by this tree's
           code (or `--index DIR`, one built before: it is copied, never changed).
2. trees   Each REV is checked out (`git worktree add --detach`) in a temporary directory; `.` is this working
           tree. Each runs in a process of its own on a copy of the index (`EdgeEngine` holds its directory), the
           lexical `HybridSearch` with that tree's default weights, `k` 10, one untimed pass first.
3. pairs   For `--passes` passes, each of `--queries` queries (`task_texts`) goes to every tree in a shuffled
           order, one after the other; a tree's time for a query is the wall time of its search.
             best_median_ms, best_p99_ms   the median and p99 over the queries of each query's fastest pass:
                                           what a query costs when nothing else runs (the figure)
             p50_ms, p99_ms                over every search of the tree, every pass
             pass_p99_median_ms            the median over passes of each pass's p99

A tree that cannot run the worker (its API differs too much) fails the run with the worker's error. The
worktrees and the index copies are removed afterwards, whatever happens.

    .venv/bin/python bench/latency_ab.py --json 4322974 a1e0378 .     # the code an issue was filed on, before, now
    .venv/bin/python bench/latency_ab.py --index /dev/shm/idx100k --passes 30 4322974 .   # reuse an index
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

if __package__ in (None, ""):
    sys.path.insert(0, str(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench.harness import BenchError, argument_parser, footer, measuring, parse, percentile, report, say

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "bench-p99"
END_MS = 1_800_000_000_000
DIMENSIONS = 384

# The worker each tree runs, in its own root: build its searcher on its copy of the index, one untimed pass, then
# answer query numbers on stdin with the wall ms of each search. Only APIs every tree since issue 12 has.
WORKER = """
import os, random, sys, time
from pathlib import Path
sys.path.insert(0, os.getcwd())
from bench.retrieval import task_texts
from contracts.memory import RankWeights
from pvm import defaults
from pvm.search import HybridSearch
from pvm.vectors.edge import EdgeEngine
engine = EdgeEngine(Path(sys.argv[1]), dense_dimensions=int(sys.argv[3]))
texts = task_texts(random.Random(1), int(sys.argv[2]))
search = HybridSearch(engine, None, RankWeights(*defaults.SEARCH_WEIGHTS))
for text in texts:
    search.search(sys.argv[4], text, k=10, now_ms=int(sys.argv[5]))
print("ready", flush=True)
for line in sys.stdin:
    text = texts[int(line)]
    started = time.perf_counter()
    search.search(sys.argv[4], text, k=10, now_ms=int(sys.argv[5]))
    print("%.4f" % ((time.perf_counter() - started) * 1000), flush=True)
engine.close()
"""


def build_index(path: Path, points: int) -> None:
    """`bench/retrieval.py`'s latency stream of `points` minutes, indexed into an embedded engine at `path`."""
    from bench.retrieval import INDEX_BATCH, _random_unit, encode_minute, index_pool, stream
    from pvm.vectors.edge import EdgeEngine

    rng = random.Random(1)
    minutes = list(stream({PROJECT: 1.0}, points, seed=3, end_ms=END_MS))
    engine = EdgeEngine(path, dense_dimensions=DIMENSIONS)
    try:
        records = [[m.id, seq, encode_minute(m)] for seq, m in enumerate(minutes, start=1)]
        for start in range(0, len(records), INDEX_BATCH):
            logged, _ = index_pool.decode(records[start : start + INDEX_BATCH])
            built = index_pool.build_points(logged, now=END_MS / 1000)
            engine.upsert([replace(p, dense=_random_unit(rng, DIMENSIONS)) for p in built])
            say(f"latency_ab: indexed {min(start + INDEX_BATCH, len(records)):,} of {len(records):,}")
        engine.optimize(PROJECT)
    finally:
        engine.close()


@contextlib.contextmanager
def trees(revs: Sequence[str], workdir: Path) -> Iterator[list[tuple[str, Path]]]:
    """Each rev's tree: `.` is this working tree, anything else a detached worktree of it, removed afterwards."""
    made: list[Path] = []
    out: list[tuple[str, Path]] = []
    try:
        for i, rev in enumerate(revs):
            if rev == ".":
                out.append((rev, ROOT))
                continue
            where = workdir / f"tree-{i}"
            done = subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), rev],
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                raise BenchError(f"cannot check out {rev!r}: {done.stderr.strip() or done.stdout.strip()}")
            made.append(where)
            out.append((rev, where))
        yield out
    finally:
        for where in made:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)], capture_output=True)


class Worker:
    """One tree's search process on its own copy of the index."""

    def __init__(self, root: Path, index: Path, queries: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(index), str(queries), str(DIMENSIONS), PROJECT, str(END_MS)],
            cwd=root,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.root = root

    def _stdin(self) -> IO[str]:
        assert self.process.stdin is not None
        return self.process.stdin

    def _line(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            assert self.process.stderr is not None
            error = self.process.stderr.read().strip().splitlines()
            raise BenchError(f"the worker of {self.root} stopped: {error[-1] if error else 'no output'}")
        return line.strip()

    def ready(self) -> None:
        if self._line() != "ready":
            raise BenchError(f"the worker of {self.root} did not get ready")

    def time(self, query: int) -> float:
        self._stdin().write(f"{query}\n")
        self._stdin().flush()
        return float(self._line())

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._stdin().close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def paired(workers: Sequence[Worker], queries: int, passes: int) -> list[list[list[float]]]:
    """Per worker, per pass, each query's ms: every query goes to every worker in a shuffled order."""
    rng = random.Random(5)
    times: list[list[list[float]]] = [[[0.0] * queries for _ in range(passes)] for _ in workers]
    for p in range(passes):
        for q in range(queries):
            order = list(range(len(workers)))
            rng.shuffle(order)
            for w in order:
                times[w][p][q] = workers[w].time(q)
        say(f"latency_ab: pass {p + 1} of {passes}")
    return times


def figures(runs: list[list[float]]) -> dict[str, float]:
    """A tree's figures from its passes (each a list of per-query ms), as the module docstring defines them."""
    queries = len(runs[0])
    best = sorted(min(run[q] for run in runs) for q in range(queries))
    every = sorted(ms for run in runs for ms in run)
    return {
        "best_median_ms": round(percentile(best, 50), 3),
        "best_p99_ms": round(percentile(best, 99), 3),
        "p50_ms": round(percentile(every, 50), 3),
        "p99_ms": round(percentile(every, 99), 3),
        "pass_p99_median_ms": round(statistics.median(percentile(sorted(run), 99) for run in runs), 3),
    }


def run(revs: Sequence[str], points: int, queries: int, passes: int, index: Path | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="pvm-latency-ab-", dir=_scratch()) as tmp:
        work = Path(tmp)
        source = index
        if source is None:
            source = work / "index"
            say(f"latency_ab: indexing {points:,} minutes")
            build_index(source, points)
        elif not source.is_dir():
            raise BenchError(f"--index {source} is not a directory")
        with trees(revs, work) as checked_out:
            workers: list[Worker] = []
            try:
                for i, (_, root) in enumerate(checked_out):
                    copy = work / f"index-{i}"
                    shutil.copytree(source, copy)
                    workers.append(Worker(root, copy, queries))
                for worker in workers:
                    worker.ready()
                times = paired(workers, queries, passes)
            finally:
                for worker in workers:
                    worker.close()
            commits = [_commit(root) for _, root in checked_out]
    return {
        "benchmark": "latency_ab",
        "points": points if index is None else None,
        "index": str(index) if index is not None else "built by this tree",
        "queries": queries,
        "passes": passes,
        "trees": [
            {"rev": rev, "commit": commit, **figures(tree_times)}
            for (rev, _), commit, tree_times in zip(checked_out, commits, times, strict=True)
        ],
    }


def _scratch() -> str | None:
    """Index copies go to memory where there is a /dev/shm (a disk's page cache would differ between copies)."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def _commit(root: Path) -> str:
    done = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain"], capture_output=True, text=True)
    return done.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def table(result: dict[str, Any]) -> str:
    lines = [
        f"search latency, paired: {result['queries']} queries x {result['passes']} passes, index "
        f"{result['points'] or result['index']}",
        f"{'tree':<24} {'best median':>12} {'best p99':>10} {'p50':>8} {'p99':>8} {'pass p99':>9}",
    ]
    for t in result["trees"]:
        name = f"{t['rev']} ({t['commit']})"
        lines.append(
            f"{name:<24} {t['best_median_ms']:>12.3f} {t['best_p99_ms']:>10.3f} {t['p50_ms']:>8.3f} "
            f"{t['p99_ms']:>8.3f} {t['pass_p99_median_ms']:>9.3f}"
        )
    lines.append(footer(result, "ms; best = each query's fastest pass", server=False))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argument_parser(
        "bench/latency_ab.py",
        __doc__,
        epilog="Progress goes to stderr; the result (a JSON object with --json) to stdout. Exit status 0 when it "
        "measured, 1 when it failed (a rev that does not check out, a worker that stops), 130 on Ctrl-C.",
    )
    parser.add_argument("revs", nargs="+", metavar="REV", help="git revisions to compare; '.' is this working tree")
    parser.add_argument("--points", type=int, default=100_000, help="minutes in the index built (default %(default)s)")
    parser.add_argument("--queries", type=int, default=200, help="queries a pass (default %(default)s)")
    parser.add_argument("--passes", type=int, default=20, help="timed passes (default %(default)s)")
    parser.add_argument("--index", type=Path, default=None, help="an index built before (copied, never changed)")
    args = parse(parser, argv)
    for name in ("points", "queries", "passes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    started = time.monotonic()
    with measuring("latency_ab", "interrupted; worktrees and index copies removed") as outcome:
        result = run(args.revs, args.points, args.queries, args.passes, args.index)
    if outcome.exit_code is not None:
        return outcome.exit_code
    return report(result, started, args.json, table)


if __name__ == "__main__":
    sys.exit(main())
