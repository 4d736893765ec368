#!/usr/bin/env python
"""Knowledge from real dialogue: which LoCoMo turns PVM turns into knowledge, and how a session's summary reads.

The data is LoCoMo's development half, ``../shared/data/locomo/locomo-dev.json``
beside the checkout (its README gives the source and the licence: it is read
from there, never copied here). Each turn is one minute, as `bench/locomo.py`
makes them (``{speaker} said, "{text}"``, one thread per session). Where the
file is absent the benchmark says so and exits 0 with nothing measured.

1. knowledge   Every conversation's minutes go through the facts pool's batch
               (`workers.facts.pool.facts_batch`, the rule path, in time order,
               the change minutes it writes fed back: `bench.prose_facts.PoolFeed`)
               on a fresh embedded Valkey. A turn is knowledge when a fact PVM
               holds (promoted or superseded) names its minute as a source. A
               turn is cited when one of its conversation's `observation`s (what
               a speaker said that lasts) names it.
                 observation_turn_recall   cited turns that are knowledge / cited turns
                 knowledge_turn_precision  knowledge turns that are cited / knowledge turns
                 cited_share               cited turns / all turns: the precision of
                                           marking every turn
2. summaries   Each session's minutes as one chunk through the extractive
               summarizer (`ExtractiveSummarizer`, what the summarize pool runs on
               a chunk; the pool itself keeps a thread's newest minutes verbatim,
               so this measures the summarizer, not how much of a conversation the
               pool summarizes), against the session's `session_summary`.
                 summary_rouge_l_f   mean ROUGE-L F1 (longest common subsequence of
                                     lower-case word tokens) over the sessions
                 lead_rouge_l_f      the same for a lead baseline: the session's
                                     notes from its first turn on, cut to the
                                     summary's word count
                 summary_vs_lead     summary_rouge_l_f / lead_rouge_l_f
                 summary_fragment_joins
                                     pieces of the summaries (split where the
                                     summarizer splits sentences) that do not end
                                     as a sentence (., !, ? or …, closing quotes
                                     after it allowed) or leave a double quote open:
                                     each runs into the next piece or breaks off
                 summary_repeated_sentences
                                     pieces said again in the same summary
                                     (`contracts.facts.sentence_key`)
                 key_topics_in_reference
                                     mean share of a summary's key topics that the
                                     reference summary says (a speaker's name is no
                                     topic and counts as a miss): do they name topics

Targets (issue 25): observation_turn_recall >= 0.5 with knowledge_turn_precision
>= 0.65, summary_vs_lead >= 1.2, summary_fragment_joins 0,
summary_repeated_sentences 0. A missed target is reported as missed.

    .venv/bin/python bench/knowledge_locomo.py --json > bench/results/knowledge-locomo.json
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from statistics import mean
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench.harness import (
    BenchError,
    Progress,
    argument_parser,
    footer,
    measuring,
    parse,
    report,
    target_texts,
    verdicts,
    workspace,
)
from bench.locomo import DEFAULT_DATA, Conversation, EvidenceCounts, evidence_ids, load
from bench.prose_facts import HELD, PoolFeed, llm_extractor, tier_keys
from contracts.facts import ends_as_sentence, sentence_key
from contracts.summaries import ThreadRef
from pvm.config import Settings
from pvm.stores.facts import FactStore
from workers.facts.extraction import Extractor
from workers.summarize.summarizers import (
    SENTENCE_BREAK,
    ExtractiveSummarizer,
    Logged,
    Summarizer,
    summarizer_from_settings,
)

TARGETS: dict[str, tuple[str, float]] = {
    "observation_turn_recall": (">=", 0.5),
    "knowledge_turn_precision": (">=", 0.65),
    "summary_vs_lead": (">=", 1.2),
    "summary_fragment_joins": ("<=", 0),
    "summary_repeated_sentences": ("<=", 0),
}
_TOKEN = re.compile(r"[a-z0-9]+")
_TURN_START = re.compile(r"^\S[^\"\u201c]{0,60}? said, [\"\u201c]")  # a turn's note: 'Caroline said, "...'
EXAMPLES = 5


def rouge_l_f(candidate: str, reference: str) -> float:
    """ROUGE-L F1 of two texts: the longest common subsequence of their lower-case word tokens."""
    a, b = _TOKEN.findall(candidate.lower()), _TOKEN.findall(reference.lower())
    if not a or not b:
        return 0.0
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b, start=1):
            current.append(previous[j - 1] + 1 if x == y else max(previous[j], current[j - 1]))
        previous = current
    lcs = previous[-1]
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(a), lcs / len(b)
    return 2 * precision * recall / (precision + recall)


def lead(texts: Sequence[str], words: int) -> str:
    """The first `words` words of the texts, in order: the lead baseline of a summary that long."""
    out: list[str] = []
    for text in texts:
        out += text.split()
        if len(out) >= words:
            break
    return " ".join(out[:words])


def pieces(summary: str) -> list[str]:
    return [p.strip() for p in SENTENCE_BREAK.split(summary) if p.strip()]


def fragments(summary: str) -> list[str]:
    """The pieces of a summary that break off: one that does not end as a sentence (it runs into the next), and
    one that leaves a quote open when the next piece starts another turn (or the summary ends) - the quote was
    cut after its first sentence and never closed."""
    out: list[str] = []
    quoting = False
    previous = ""
    for piece in pieces(summary):
        if quoting and _TURN_START.match(piece):
            out.append(previous)
            quoting = False
        if not ends_as_sentence(piece):
            out.append(piece)
        quoting ^= (piece.count('"') + piece.count("\u201c") + piece.count("\u201d")) % 2 == 1
        previous = piece
    if quoting:
        out.append(previous)
    return out


def repeated(summary: str) -> int:
    keys = [sentence_key(p) for p in pieces(summary)]
    return len(keys) - len(set(keys))


def cited_turns(raw: dict[str, Any], known: set[str]) -> set[str]:
    """The turns (dia ids among `known`) an `observation` of the conversation names, its evidence ids read as
    `bench/locomo.py` reads a question's."""
    named = [
        item[1]
        for per_speaker in (raw.get("observation") or {}).values()
        for said in (per_speaker or {}).values()
        for item in said or ()
        if len(item) > 1
    ]
    return set(evidence_ids(named, known, EvidenceCounts())[0])


def knowledge(
    conversations: Sequence[Conversation],
    raw: Sequence[dict[str, Any]],
    progress: Progress,
    extractor: Extractor | None = None,
) -> dict[str, Any]:
    """The knowledge phase: cited and knowledge turns per conversation, and the ratios (the rules extract, unless
    `extractor` is given)."""
    cited_all = knowledge_all = both = turns = 0
    per: dict[str, Any] = {}
    examples: list[dict[str, str]] = []
    with workspace("knowledge-locomo") as ws:
        pool = PoolFeed(ws, extractor)
        store = FactStore(ws.connection)
        for conv, sample in zip(conversations, raw, strict=True):
            progress.tick(f"knowledge: {conv.sample_id}: {len(conv.turns):,} turns", force=True)
            minutes = [t.minute for t in conv.turns]
            pool.feed(minutes)
            dia_of = conv.dia_of
            held = [f for key in tier_keys(minutes) for f in store.in_tier(key) if f.status in HELD]
            known = {dia_of[m] for f in held for m in f.source_minute_ids if m in dia_of}
            cited = cited_turns(sample, set(dia_of.values()))
            per[conv.sample_id] = {
                "turns": len(conv.turns),
                "cited": len(cited),
                "knowledge": len(known),
                "knowledge_cited": len(known & cited),
                "facts": len(held),
            }
            turns += len(conv.turns)
            cited_all += len(cited)
            knowledge_all += len(known)
            both += len(known & cited)
            for f in held:
                if len(examples) < EXAMPLES:
                    examples.append({"type": f.type.value, "slot": f"{f.subject} / {f.attribute}", "value": f.value})
    return {
        "observation_turn_recall": round(both / cited_all, 4) if cited_all else 0.0,
        "knowledge_turn_precision": round(both / knowledge_all, 4) if knowledge_all else 0.0,
        "cited_share": round(cited_all / turns, 4) if turns else 0.0,
        "counts": {
            "turns": turns,
            "cited": cited_all,
            "knowledge": knowledge_all,
            "knowledge_cited": both,
            "facts_per_s": round(pool.minutes / pool.seconds) if pool.seconds else 0,
            "pool_changes": dict(sorted(pool.counts.items())),
            "per_conversation": per,
            "fact_examples": examples,
        },
    }


def summaries(
    conversations: Sequence[Conversation],
    raw: Sequence[dict[str, Any]],
    progress: Progress,
    summarizer: Summarizer | None = None,
) -> dict[str, Any]:
    """The summary phase: each session summarized as one chunk (the extractive summarizer unless `summarizer` is
    given), scored against its reference and a lead."""
    summarizer = summarizer or ExtractiveSummarizer()
    ours: list[float] = []
    leads: list[float] = []
    joins = repeats = sessions = 0
    topical: list[float] = []
    examples: list[dict[str, Any]] = []
    for conv, sample in zip(conversations, raw, strict=True):
        progress.tick(f"summaries: {conv.sample_id}", force=True)
        references = sample.get("session_summary") or {}
        by_session: dict[int, list[Logged]] = {}
        for seq, turn in enumerate(conv.turns, start=1):
            by_session.setdefault(turn.session, []).append(Logged(seq, turn.minute))
        for session, logged in sorted(by_session.items()):
            reference = references.get(f"session_{session}_summary")
            if not isinstance(reference, str) or not reference.strip():
                continue
            chunk = summarizer.summarize(conv.project, ThreadRef.parse(f"session-{session}"), logged)
            summary = chunk.summary
            said = set(_TOKEN.findall(reference.lower()))
            names = {t.minute.agent_id.lower() for t in conv.turns}
            topics = chunk.key_topics
            topical.append(sum(t in said and t not in names for t in topics) / len(topics) if topics else 0.0)
            baseline = lead([item.minute.memory_note or "" for item in logged], len(summary.split()))
            ours.append(rouge_l_f(summary, reference))
            leads.append(rouge_l_f(baseline, reference))
            broken = fragments(summary)
            joins += len(broken)
            repeats += repeated(summary)
            sessions += 1
            if broken and len(examples) < EXAMPLES:
                examples.append({"session": f"{conv.sample_id}/{session}", "fragment": broken[0][:160]})
    score, base = (mean(ours), mean(leads)) if ours else (0.0, 0.0)
    return {
        "summary_rouge_l_f": round(score, 4),
        "lead_rouge_l_f": round(base, 4),
        "summary_vs_lead": round(score / base, 4) if base else 0.0,
        "summary_fragment_joins": joins,
        "summary_repeated_sentences": repeats,
        "key_topics_in_reference": round(mean(topical), 4) if topical else 0.0,
        "counts": {"sessions": sessions, "fragment_examples": examples},
    }


def run(
    path: Path,
    limit: int | None,
    progress: Progress,
    extractor: Extractor | None = None,
    summarizer: Summarizer | None = None,
) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))[:limit]
    except (OSError, ValueError) as exc:
        raise BenchError(f"cannot read {path}: {exc}") from exc
    conversations, _, _ = load(path, limit, int(time.time() * 1000), "as-dated")
    progress.start("knowledge", f"{len(conversations)} conversations through the facts pool")
    known = knowledge(conversations, raw, progress, extractor)
    progress.start("summaries", "each session as one chunk through the extractive summarizer")
    summed = summaries(conversations, raw, progress, summarizer)
    values = {k: v for k, v in {**known, **summed}.items() if k != "counts"}
    met = verdicts(values, TARGETS)
    texts = target_texts(TARGETS)
    return {
        "benchmark": "knowledge_locomo",
        "data": str(path),
        "extractor": "rules" if extractor is None else type(extractor).__name__,
        "summarizer": "extractive" if summarizer is None else type(summarizer).__name__,
        "conversations": len(conversations),
        "metrics": {k: {"value": v, "target": texts.get(k), "met": met.get(k)} for k, v in values.items()},
        "knowledge": known["counts"],
        "summaries": summed["counts"],
        "met": {k: v for k, v in met.items() if v is not None},
        "targets": texts,
    }


def table(result: dict[str, Any]) -> str:
    lines = [f"{'METRIC':<30}{'TARGET':<10}{'VALUE':>10}"]
    for key, cell in result["metrics"].items():
        verdict = "" if cell["met"] is None else ("ok" if cell["met"] else "MISSED")
        lines.append(f"{key:<30}{cell['target'] or '':<10}{cell['value']:>10} {verdict}")
    lines += ["", footer(result, f"{result['conversations']} conversations", server=False)]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argument_parser(
        "bench/knowledge_locomo.py",
        __doc__,
        epilog="Progress goes to stderr; the result (a JSON object with --json) to stdout. Exit status 0 when it "
        "measured or the data is absent (said on stderr), 1 when it failed, 130 on Ctrl-C.",
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo's JSON (default: %(default)s)")
    parser.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N conversations")
    parser.add_argument(
        "--llm",
        action="store_true",
        help="extract through the LLM your PVM_LLM_* name (the rules its fallback) and summarize as PVM_SUMMARIZER "
        "says (llm: the model, the extractive summarizer its fallback); an error when PVM_LLM_MODEL is unset",
    )
    args = parse(parser, argv)
    if not args.data.is_file():
        print(
            f"knowledge_locomo: {args.data} is absent (LoCoMo's development half lives in ../shared/data/locomo "
            "beside the checkout; see its README): nothing measured",
            file=sys.stderr,
        )
        return 0
    progress = Progress()
    started = time.monotonic()
    with measuring("knowledge_locomo", "interrupted; Valkey stopped") as outcome:
        extractor, summarizer = (None, None)
        if args.llm:
            environ = {k: v for k, v in os.environ.items() if k.startswith("PVM_")}
            extractor, summarizer = llm_extractor(environ), summarizer_from_settings(Settings.from_env(environ))
        result = run(args.data, args.limit, progress, extractor, summarizer)
    if outcome.exit_code is not None:
        return outcome.exit_code
    return report(result, started, args.json, table)


if __name__ == "__main__":
    sys.exit(main())
