"""The set-up, waiting and reporting every benchmark in bench/ shares.

A run of a benchmark, from the outside in:

- `measuring()` around the measured part: SIGTERM acts as Ctrl-C, fd 1 points
  at stderr (nothing a child prints lands in the JSON), and an interrupt or a
  `BenchError` becomes an exit code instead of a traceback;
- `workspace()` for each phase: a temporary PVM_HOME, a fresh embedded Valkey
  in it (AOF on, appendfsync everysec, as `pvm up` runs it), the `Settings`
  pointing at it and a client; all removed afterwards;
- `CliProcesses` / `running()` for the processes under test: `python -m workers.ops.cli ...`
  with the settings' environment, each in a session of its own;
- `polls()` for every wait with a deadline, `Progress` for what the wait is at;
- `report()` at the end: `elapsed_s`, the machine, then JSON (`--json`) or the table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from bench.machine import machine
from pvm import defaults
from pvm.config import Settings
from workers.runtime.embedded import EmbeddedRedis

VERDICT_WORDS: dict[bool | None, str] = {True: "ok", False: "MISSED", None: "n/a"}


class BenchError(RuntimeError):
    """A phase could not produce a valid measurement."""


class ProcessDied(BenchError):
    """A process under test exited during a run (a crash of the product, not of the benchmark)."""


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Progress:
    """Progress lines on stderr, at most about one a second unless forced: "<label><sep><text>"."""

    def __init__(self, label: str = "", sep: str = " ... ") -> None:
        self.label = label
        self.sep = sep
        self._last = 0.0

    def start(self, label: str, detail: str) -> None:
        """A new step: says "<label>: <detail>" at once, and later ticks carry the label."""
        self.label, self._last = label, 0.0
        say(f"{label}: {detail}")

    def tick(self, text: str, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last >= 1.0:
            self._last = now
            say(f"{self.label}{self.sep}{text}")


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an ascending sequence."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def polls(timeout: float, every: float, alive: Callable[[], None] | None = None) -> Iterator[float]:
    """Yields the seconds waited so far, every `every` s, until `timeout` has passed; then stops.

    The caller's loop body tests its condition and returns when it holds; code
    after the loop handles the timeout. `alive` runs between polls and raises
    when something the wait depends on has died.
    """
    started = time.monotonic()
    deadline = started + timeout
    while True:
        yield time.monotonic() - started
        if alive is not None:
            alive()
        if time.monotonic() > deadline:
            return
        time.sleep(every)


# -- homes and servers ------------------------------------------------------------------


@contextmanager
def temp_home(name: str, shards: int | None = None) -> Iterator[Settings]:
    """Settings on a fresh temporary PVM_HOME (removed afterwards), none of the caller's environment."""
    with tempfile.TemporaryDirectory(prefix=f"pvm-bench-{name}-") as tmp:
        env = {"PVM_HOME": tmp}
        if shards is not None:
            env["PVM_SHARDS"] = str(shards)
        yield Settings.from_env(env)


@contextmanager
def embedded_redis(settings: Settings) -> Iterator[EmbeddedRedis]:
    """A fresh embedded Valkey in the settings' home, configured as the stack runs it."""
    server = EmbeddedRedis(data_dir=Path(settings.home) / defaults.EMBEDDED_DATA_DIR)
    try:
        server.start()
        yield server
    finally:
        try:
            server.stop()
        except Exception as exc:
            say(f"bench: stopping Valkey: {type(exc).__name__}: {exc}")
        # EmbeddedRedis.stop() does nothing when the server does not answer PING; make sure the process is gone.
        server.server.terminate()


@dataclass(frozen=True)
class Workspace:
    """A temporary home with its own embedded Valkey: `settings` point at it, `connection` talks to it."""

    settings: Settings
    server: EmbeddedRedis
    connection: redis.Redis


@contextmanager
def workspace(name: str, shards: int | None = None) -> Iterator[Workspace]:
    """A fresh `Workspace`; the client, Valkey and the home are gone afterwards."""
    with temp_home(name, shards) as settings, embedded_redis(settings) as server:
        connection = redis.Redis.from_url(server.url)
        try:
            yield Workspace(settings.with_(redis_url=server.url), server, connection)
        finally:
            connection.close()


# -- CPU accounting from /proc ------------------------------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds used) of a live process, from /proc/<pid>/stat (None where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    # After the command: state ppid ... utime (14th field overall) stime (15th).
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / CLK_TCK


def process_table() -> dict[int, tuple[int, float]]:
    """Every live process's (parent pid, CPU seconds used), by pid."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = proc_stat(int(name))
            if stat is not None:
                table[int(name)] = stat
    return table


def tree_cpu(table: dict[int, tuple[int, float]], roots: Sequence[int]) -> float:
    """CPU seconds used by these processes and all their live descendants (`table`: `process_table()`)."""
    children: dict[int, list[int]] = defaultdict(list)
    for pid, (ppid, _) in table.items():
        children[ppid].append(pid)
    total, todo, seen = 0.0, list(roots), set()
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in table:
            continue
        seen.add(pid)
        total += table[pid][1]
        todo.extend(children[pid])
    return total


def machine_busy() -> tuple[float, float]:
    """CPU seconds the whole machine spent busy since boot (all cores; idle and iowait excluded),
    and how many of them went to interrupts (time /proc/<pid>/stat charges to no process)."""
    with open("/proc/stat", encoding="ascii") as f:
        parts = [int(v) for v in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (parts + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / CLK_TCK, (irq + softirq) / CLK_TCK


# -- processes under test ---------------------------------------------------------------


class CliProcesses:
    """`python -m workers.ops.cli <command>` processes, each in its own session; stopped by pid (SIGTERM, then SIGKILL).

    Their stderr goes to a file each, copied to our stderr when they stop, so a
    crash's last line can be quoted in the result.
    """

    def __init__(self, settings: Settings, commands: Sequence[Sequence[str]]) -> None:
        env = dict(os.environ)
        env.update(settings.to_env())
        self.children: list[subprocess.Popen[bytes]] = []
        self.commands = [" ".join(cmd) for cmd in commands]
        self.stderr: list[Any] = []
        for cmd in commands:
            err = tempfile.TemporaryFile()  # noqa: SIM115 -- closed in stop()
            self.stderr.append(err)
            self.children.append(
                subprocess.Popen(
                    [sys.executable, "-m", "workers.ops.cli", *cmd], env=env, stderr=err, start_new_session=True
                )
            )

    def _stderr_lines(self, i: int) -> list[str]:
        err = self.stderr[i]
        err.seek(0)
        return err.read().decode(errors="replace").splitlines()

    def check(self) -> None:
        """Raise ProcessDied, quoting its last line of stderr, when a process has exited."""
        for i, child in enumerate(self.children):
            code = child.poll()
            if code is not None:
                lines = [line for line in self._stderr_lines(i) if line.strip()]
                last = lines[-1].strip() if lines else "no output"
                raise ProcessDied(f"`pvm {self.commands[i]}` (pid {child.pid}) exited with {code}: {last}")

    def stop(self, timeout: float = 30.0) -> None:
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for child in self.children:
            try:
                child.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                say(f"bench: pid {child.pid} did not stop in {timeout:.0f} s; killing its process group")
                os.killpg(child.pid, signal.SIGKILL)  # its own session: only what it started
                child.wait()
        for i, child in enumerate(self.children):
            for line in self._stderr_lines(i):
                say(f"  [pid {child.pid}] {line}")
            self.stderr[i].close()


@contextmanager
def running(settings: Settings, commands: Sequence[Sequence[str]]) -> Iterator[CliProcesses]:
    procs = CliProcesses(settings, commands)
    try:
        yield procs
    finally:
        procs.stop()


# -- the run as a whole -----------------------------------------------------------------


@contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Point fd 1 at stderr while phases run, so nothing a child process prints lands in our JSON."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


@dataclass
class Outcome:
    """How the measured part of a run ended: `exit_code` stays None when it finished."""

    exit_code: int | None = None


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextmanager
def measuring(name: str, interrupted: str = "interrupted") -> Iterator[Outcome]:
    """Run the measured part: SIGTERM cleans up like Ctrl-C, fd 1 points at stderr.

    Ctrl-C sets exit code 130 and a BenchError or a Redis error 1, each said on
    stderr as "<name>: ..."; the exception goes no further.
    """
    signal.signal(signal.SIGTERM, _raise_interrupt)
    outcome = Outcome()
    try:
        with stdout_to_stderr():
            yield outcome
    except KeyboardInterrupt:
        say(f"{name}: {interrupted}")
        outcome.exit_code = 130
    except (BenchError, redis.exceptions.RedisError) as exc:
        say(f"{name}: failed: {exc}")
        outcome.exit_code = 1


def argument_parser(prog: str, doc: str, epilog: str | None = None) -> argparse.ArgumentParser:
    """A benchmark's parser; its --help shows the module docstring as written (it documents the method)."""
    return argparse.ArgumentParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter, epilog=epilog
    )


def add_minutes_scale(parser: argparse.ArgumentParser, help: str) -> None:
    """`--minutes-scale X` (default 1.0), a positive multiplier of the benchmark's counts."""

    def positive(text: str) -> float:
        value = float(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    parser.add_argument("--minutes-scale", type=positive, default=1.0, metavar="X", help=help)


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Add --json (last in --help, as every benchmark has it) and parse `argv`."""
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    return parser.parse_args(argv)


def verdicts(result: Mapping[str, Any], targets: Mapping[str, tuple[Any, ...]]) -> dict[str, bool | None]:
    """Per target `(op, bound, ...)`: whether the result meets it; None when it has no (or a NaN) value."""
    out: dict[str, bool | None] = {}
    for key, (op, bound, *_) in targets.items():
        value = result.get(key)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            out[key] = None
        else:
            out[key] = value <= bound if op == "<=" else value >= bound
    return out


def target_texts(targets: Mapping[str, tuple[Any, ...]]) -> dict[str, str]:
    """The targets as the JSON result states them: {"key": "<= 20"}."""
    return {k: f"{op} {bound:g}" for k, (op, bound, *_) in targets.items()}


def machine_line(box: Mapping[str, Any], server: bool = True) -> str:
    """The machine in a table's last line: '2 cores, <CPU>, Python 3.x[, Valkey 8.x]'."""
    line = f"{box['cores']} cores, {box['cpu_model']}, Python {box['python']}"
    if server:
        info = box.get("redis_server", {})
        version = (info.get("valkey_version") and f"Valkey {info['valkey_version']}") or info.get("redis_version")
        line += f", {version}"
    return line


def footer(result: Mapping[str, Any], detail: str, server: bool = True) -> str:
    """A table's last line: the machine, the run's `detail`, how long it took."""
    return f"{machine_line(result['machine'], server)}; {detail}; {result['elapsed_s']:.0f} s"


def report(
    result: dict[str, Any],
    started: float,
    as_json: bool,
    table: Callable[[dict[str, Any]], str],
    box: dict[str, Any] | None = None,
) -> int:
    """Add `machine` (`box`, else this machine unless the result has one) and `elapsed_s`, print; returns 0.

    One JSON object with `as_json`, else the benchmark's table.
    """
    if box is not None:
        result["machine"] = box
    else:
        result.setdefault("machine", machine())
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(result, indent=2) if as_json else table(result))
    return 0
