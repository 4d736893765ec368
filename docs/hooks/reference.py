"""MkDocs hook: the CLI, configuration, metrics and wire-format reference pages, generated at every build.

The pages exist only in the built site (`File.generated`), so they always describe the code they were built
with: the CLI from `workers.ops.cli.build_parser()`, the settings from `pvm.config.settings_reference()`, the
metrics from the exporter's own collector run once against an empty embedded Valkey, the wire format from
`contracts/schema` and `contracts/vectors`.
tests/test_docs.py builds the site with `--strict` and checks every command, setting and metric is on them.
"""

from __future__ import annotations

import argparse
import functools
import html
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

GENERATED_NOTE = (
    '!!! note "Generated"\n'
    "    This page is generated from {source} each time the site is built, so it cannot drift from the code.\n"
)
_CODE_SPAN = re.compile(r"(`[^`]*`)")


def _text(text: object) -> str:
    """Plain text as Markdown: `<`, `>` and `&` escaped outside code spans, so `<host>` shows as written."""
    parts = _CODE_SPAN.split(str(text).replace("\n", " "))
    return "".join(p if p.startswith("`") else html.escape(p, quote=False) for p in parts)


def _cell(text: object) -> str:
    """Text for a Markdown table cell: as `_text`, with `|` escaped outside code spans too."""
    parts = _CODE_SPAN.split(_text(text))
    return "".join(p if p.startswith("`") else p.replace("|", "\\|") for p in parts)


def _code(text: str) -> str:
    return f"`{text}`" if "`" not in text else f"`` {text} ``"


# -- CLI ---------------------------------------------------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def _options_table(parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
            continue
        invocation = formatter._format_action_invocation(action)
        if not action.option_strings and action.nargs in ("+", "*"):
            invocation += "…"
        default = action.default
        unshown = default in (None, False, [], argparse.SUPPRESS) or isinstance(action, argparse._VersionAction)
        shown = "" if unshown else _code(str(default))
        meaning = _cell(action.help or "") + (" **(required)**" if action.required and action.option_strings else "")
        rows.append(f"| {_code(invocation)} | {shown} | {meaning} |")
    if not rows:
        return []
    return ["| argument | default | meaning |", "|---|---|---|", *rows, ""]


def _command_section(name: str, parser: argparse.ArgumentParser, depth: int) -> list[str]:
    lines = [f"{'#' * depth} {name}", ""]
    if parser.description:
        lines += [_text(parser.description), ""]
    lines += ["```text", parser.format_usage().strip(), "```", ""]
    lines += _options_table(parser)
    for child_name, child in _subcommands(parser):
        lines += _command_section(f"{name} {child_name}", child, depth + 1)
    return lines


def cli_reference() -> str:
    from workers.ops.cli import build_parser

    parser = build_parser()
    fixed_width = functools.partial(argparse.HelpFormatter, width=100)

    def settle(p: argparse.ArgumentParser) -> None:  # usage lines independent of the terminal that builds the docs
        p.formatter_class = fixed_width
        for _, child in _subcommands(p):
            settle(child)

    settle(parser)
    lines = [
        "# CLI reference",
        "",
        GENERATED_NOTE.format(source="`workers.ops.cli.build_parser()`"),
        "Every command reads its configuration from environment variables ([configuration](configuration.md)) "
        "and takes `-h`/`--help`. [Running PVM](../operations/running.md) explains how the commands fit together.",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    for name, child in _subcommands(parser):
        summary = (child.description or "").split(". ")[0].rstrip(".")
        lines.append(f"| [`pvm {name}`](#pvm-{name}) | {_cell(summary)} |")
    lines += ["", "## pvm", "", "```text", parser.format_usage().strip(), "```", "", *_options_table(parser)]
    for name, child in _subcommands(parser):
        lines += _command_section(f"pvm {name}", child, 2)
    return "\n".join(lines) + "\n"


# -- configuration -----------------------------------------------------------------------------------------------


def configuration_reference() -> str:
    from pvm.config import settings_reference

    lines = [
        "# Configuration reference",
        "",
        GENERATED_NOTE.format(source="`pvm.config.settings_reference()`"),
        "`pvm.config.Settings.from_env()` reads these variables once. "
        "[Configuration](../operations/configuration.md) explains how they work together and where the "
        "other tunables live.",
        "",
        "| variable | default | type | range | meaning |",
        "|---|---|---|---|---|",
    ]
    for entry in settings_reference():
        default = entry.get("default")
        cells = [
            f"`{entry['env']}`",
            _cell("(unset)" if default in (None, "") else default),
            *(_cell(entry.get(key) or "") for key in ("type", "range", "help")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# -- metrics -----------------------------------------------------------------------------------------------------


@functools.cache
def metric_families() -> list[dict[str, Any]]:
    """Every family the exporter serves (name as exposed, type, labels, help): one scrape of an empty Valkey."""
    import redis

    from pvm.config import Settings
    from workers.ops.exporter import PvmCollector
    from workers.runtime.embedded import EmbeddedRedis

    with EmbeddedRedis(persist=False) as server:
        connection = redis.Redis.from_url(server.url)
        try:
            metrics = list(PvmCollector(connection, Settings(redis_url=server.url)).collect())
        finally:
            connection.close()
    suffix = {"counter": "_total"}
    return [
        {
            "name": m.name + suffix.get(m.type, ""),
            "type": m.type,
            "labels": list(getattr(m, "_labelnames", ())),
            "help": m.documentation,
        }
        for m in metrics
    ]


def metrics_reference() -> str:
    lines = [
        "# Metrics reference",
        "",
        GENERATED_NOTE.format(source="the exporter's collector (`workers.ops.exporter.PvmCollector`)"),
        "`pvm exporter` serves these on `/metrics`, read from Redis at every scrape. Histograms expose "
        "`_bucket`, `_sum` and `_count` series. [Monitoring](../operations/monitoring.md) explains what to "
        "watch and the alerts built on them.",
        "",
        "| metric | type | labels | meaning |",
        "|---|---|---|---|",
    ]
    for family in metric_families():
        labels = ", ".join(f"`{label}`" for label in family["labels"])
        lines.append(f"| `{family['name']}` | {family['type']} | {labels} | {_cell(family['help'])} |")
    return "\n".join(lines) + "\n"


# -- the wire format ---------------------------------------------------------------------------------------------


def wire_format_reference() -> str:
    """The JSON Schema and the golden vectors' README, as the contracts package ships them."""
    import contracts

    package = Path(contracts.__file__).parent
    vectors_readme = (package / "vectors" / "README.md").read_text()
    body = re.sub(r"^(#+) ", r"#\1 ", vectors_readme, flags=re.M)  # its title becomes a section here
    valid = sorted(p.name for p in (package / "vectors").glob("*.json"))
    invalid = sorted(p.name for p in (package / "vectors" / "invalid").glob("*.json"))
    lines = [
        "# Wire format: JSON Schema and golden vectors",
        "",
        GENERATED_NOTE.format(source="`contracts/schema/minute.schema.json` and `contracts/vectors/`"),
        "Producers in other languages follow these. [The Minute contract](../contract.md) explains the fields "
        "and rules in prose.",
        "",
        body.rstrip(),
        "",
        "## The vectors",
        "",
        f"Valid ({len(valid)}): " + ", ".join(f"`{name}`" for name in valid) + ".",
        "",
        f"Invalid ({len(invalid)}): " + ", ".join(f"`invalid/{name}`" for name in invalid) + ".",
        "",
        "## minute.schema.json",
        "",
        "```json",
        (package / "schema" / "minute.schema.json").read_text().rstrip(),
        "```",
    ]
    return "\n".join(lines) + "\n"


GENERATED_PAGES: dict[str, Callable[[], str]] = {
    "reference/cli.md": cli_reference,
    "reference/configuration.md": configuration_reference,
    "reference/metrics.md": metrics_reference,
    "reference/wire-format.md": wire_format_reference,
}


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for path, render in GENERATED_PAGES.items():
        files.append(File.generated(config, path, content=render()))
    return files
