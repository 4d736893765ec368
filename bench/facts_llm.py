#!/usr/bin/env python
"""LLM extraction benchmark: how many chat calls the LLM extractor makes per 100 minutes (issue 10: <= 10).

The minutes are a labeled fact session (`bench/fact_sessions.py`, the
default split, seed 11: six projects, about 970 minutes, time-ordered and
interleaved across projects). They go to `workers.facts.extraction_llm.LLMExtractor`
the way the facts pool gets them: in batches of `--batch` minutes
(`FANOUT_BATCH_SIZE`, 500: one log-pool fan-out job), in time order. The
extractor calls PVM's real `LLMClient` over HTTP, through the `openai`
package, against the tests' OpenAI-compatible server on loopback
(`tests/openai_server.py`), which answers every call with one fixed valid
answer (one fact, stated by M1): the count does not depend on a model, only
on what the extractor sends and how it chunks it.

Reported:

- `llm_calls_per_100_minutes`: chat requests per 100 minutes of the session
  (the target); `_one_batch`: the same with the whole session as one batch,
  the floor that chunking by project allows;
- `minutes_sent`, `minutes_by_rules` (data-convention minutes the rules read
  as stated), `chunks`, `fallbacks` (must be 0 here), `minutes_per_call`;
- `prompt_chars_per_call`: the size of what is sent (instructions included),
  and the scripted server's token counts (it counts words, not a model's
  tokens).

    .venv/bin/python bench/facts_llm.py --json
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.fact_sessions import FactSession, fact_session
from bench.harness import BenchError, argument_parser, footer, measuring, parse, report, target_texts, verdicts
from pvm import defaults
from pvm.llm import LLMClient
from workers.facts.extraction_llm import LLMExtractor

if TYPE_CHECKING:
    from tests.openai_server import OpenAIServer

TARGETS = {"llm_calls_per_100_minutes": ("<=", 10)}
# The scripted server's answer to every call: valid, one fact, stated by the chunk's first minute.
FIXED_ANSWER = {
    "facts": [
        {
            "type": "fact",
            "subject": "billing service",
            "attribute": "database",
            "value": "Postgres",
            "text": "The billing service's database is Postgres.",
            "confidence": 0.8,
            "minute_refs": [1],
        }
    ]
}


def calls_per_100_minutes(session: FactSession, server: OpenAIServer, batch: int) -> dict[str, Any]:
    """Run the session's minutes through an LLM extractor talking to `server`, in batches of `batch`; count calls."""
    minutes = session.minutes
    before = len(server.chat_requests())
    server.queue_chat_reply(*[FIXED_ANSWER] * len(minutes))  # at most one call per minute
    llm = LLMClient(server.base_url, "sk-bench", "bench-chat", backoff_base=0.01, backoff_max=0.05)
    extractor = LLMExtractor(llm)
    candidates = 0
    for start in range(0, len(minutes), batch):
        candidates += len(extractor.extract(minutes[start : start + batch]))
    requests = server.chat_requests()[before:]
    server.reset()  # the answers left over
    stats = extractor.stats
    calls = len(requests)
    prompt_chars = sum(len(str(m.get("content", ""))) for r in requests for m in r.messages)
    return {
        "minutes": len(minutes),
        "batch": batch,
        "calls": calls,
        "llm_calls_per_100_minutes": round(100 * calls / len(minutes), 2),
        "minutes_sent": stats.sent,
        "minutes_by_rules": stats.by_rules,
        "chunks": stats.chunks,
        "fallbacks": stats.fallbacks,
        "minutes_per_call": round(stats.sent / calls, 2) if calls else None,
        "candidates": candidates,
        "prompt_chars_per_call": round(prompt_chars / calls) if calls else None,
        "server_prompt_tokens_per_call": round(llm.stats.prompt_tokens / calls) if calls else None,
        "server_completion_tokens_per_call": round(llm.stats.completion_tokens / calls) if calls else None,
    }


def run(seed: int, batch: int) -> dict[str, Any]:
    from tests.openai_server import OpenAIServer  # the tests' server: scripted answers over real HTTP

    session = fact_session("default", seed)
    server = OpenAIServer().start()
    try:
        batched = calls_per_100_minutes(session, server, batch)
        whole = calls_per_100_minutes(session, server, len(session.minutes))
    finally:
        server.stop()
    result: dict[str, Any] = {
        "split": "default",
        "seed": seed,
        "projects": len({m.project_id for m in session.minutes}),
        **batched,
        "llm_calls_per_100_minutes_one_batch": whole["llm_calls_per_100_minutes"],
        "chunk_minutes": defaults.LLM_EXTRACT_CHUNK_MINUTES,
        "server": "tests/openai_server.py (one fixed valid answer)",
        "targets": target_texts(TARGETS),
    }
    result["verdicts"] = verdicts(result, TARGETS)
    if batched["fallbacks"] or batched["calls"] != batched["chunks"]:
        raise BenchError(f"a call failed against the scripted server: {batched}")
    return result


def table(result: dict[str, Any]) -> str:
    verdict = "ok" if result["verdicts"]["llm_calls_per_100_minutes"] else "MISSED"
    return "\n".join(
        [
            f"LLM extraction, fact session (default split, seed {result['seed']}, {result['projects']} projects)",
            f"  minutes                      {result['minutes']} ({result['minutes_sent']} sent, "
            f"{result['minutes_by_rules']} read by the rules as stated)",
            f"  calls (batches of {result['batch']})       {result['calls']}",
            f"  llm_calls_per_100_minutes    {result['llm_calls_per_100_minutes']}  (<= 10: {verdict})",
            f"  ... as one batch             {result['llm_calls_per_100_minutes_one_batch']}",
            f"  minutes per call             {result['minutes_per_call']}",
            f"  prompt characters per call   {result['prompt_chars_per_call']}",
            footer(result, "tests/openai_server.py answering one fixed valid answer", server=False),
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argument_parser("bench/facts_llm.py", __doc__)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument(
        "--batch", type=int, default=defaults.FANOUT_BATCH_SIZE, help="minutes per extract() call (a fan-out job)"
    )
    args = parse(parser, argv)
    if args.batch < 1:
        parser.error("--batch must be 1 or more")
    started = time.monotonic()
    with measuring("facts_llm bench") as outcome:
        result = run(args.seed, args.batch)
    if outcome.exit_code is not None:
        return outcome.exit_code
    return report(result, started, args.json, table)


if __name__ == "__main__":
    sys.exit(main())
