"""Per-rule precision of the rule extractor on one wording of the labeled sessions, and what each rule got wrong.

The labeled sessions (`bench/fact_sessions.py`) can be worded four ways:
default (the rules were written against it), heldout (the benchmark's honest
test), dev (the rules are changed against it) and calibration (never used to
change a rule). For each rule this counts its readings over the sessions of
the given seeds and how many are a planted fact (type, slot and value, stated
in the minute read), with the Wilson lower bound (95%) of that precision;
`--wrong N` prints N readings each rule got wrong, with what the minute stated.

What it showed (docs/extraction.md, "How precise the rules are"): precise on
the wording they were written or fixed against, brittle on new wording, and
per rule the precision on a new wording swings from 0 to 1 with the one or
two templates that rule happens to meet — too few to set a rule's confidence
from. `workers.facts.extraction.RULE_CONFIDENCE` is therefore unchanged by it;
`DROPPED_RULES` names the rule dropped on dev evidence.

    .venv/bin/python bench/rule_precision.py --wording dev --wrong 3
    .venv/bin/python bench/rule_precision.py --wording calibration --json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench.fact_sessions import DEV, WORDINGS, GoldFact, fact_session
from workers.facts.extraction import DROPPED_RULES, RuleExtractor, value_key
from workers.rules.statements import STATEMENT

SEEDS = (11, 12, 13)
Z_95 = 1.96


@dataclass
class RuleTally:
    readings: int = 0
    right: int = 0
    wrong: list[dict[str, Any]] = field(default_factory=list)

    @property
    def precision(self) -> float:
        return self.right / self.readings if self.readings else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "readings": self.readings,
            "right": self.right,
            "precision": round(self.precision, 4),
            "lower_bound_95": round(wilson_lower(self.right, self.readings), 4),
        }


def wilson_lower(right: int, n: int, z: float = Z_95) -> float:
    """The Wilson score interval's lower bound for `right` successes of `n` (0 for n = 0)."""
    if n == 0:
        return 0.0
    p = right / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - spread) / (1 + z * z / n))


def tally(wording: str, seeds: Iterable[int], keep_wrong: int = 0) -> dict[str, RuleTally]:
    """rule -> its readings over the sessions of this wording and seeds (dropped rules run too, to be seen)."""
    extractor = RuleExtractor(run_dropped=True)
    out: dict[str, RuleTally] = {}
    for seed in seeds:
        session = fact_session(wording, seed)
        notes = {m.id: m.memory_note for m in session.minutes}
        stated_in: dict[str, list[GoldFact]] = {}
        for fact in session.facts:
            for minute_id in fact.minute_ids:
                stated_in.setdefault(minute_id, []).append(fact)
        for candidate in extractor.extract(session.minutes):
            if candidate.attribute == STATEMENT:
                continue  # kept as said (workers.rules.statements), not a typed reading of the wording
            stated = [f for i in candidate.source_minute_ids for f in stated_in.get(i, ())]
            key = (candidate.type, candidate.slot, value_key(candidate.value))
            right = any((f.type, f.slot, value_key(f.value)) == key for f in stated)
            rule = out.setdefault(candidate.rule, RuleTally())
            rule.readings += 1
            rule.right += right
            if not right and len(rule.wrong) < keep_wrong:
                rule.wrong.append(
                    {
                        "note": notes[candidate.source_minute_ids[0]],
                        "read": [candidate.type, candidate.subject, candidate.attribute, candidate.value],
                        "stated": [[f.type, *f.slot, f.value] for f in stated],
                    }
                )
    return dict(sorted(out.items()))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--wording", choices=WORDINGS, default=DEV, help=f"which wording (default: {DEV})")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS), help=f"session seeds (default: {SEEDS})")
    parser.add_argument("--wrong", type=int, default=0, metavar="N", help="print N wrong readings of each rule")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args(argv)
    rules = tally(args.wording, args.seeds, args.wrong)
    readings = sum(r.readings for r in rules.values())
    right = sum(r.right for r in rules.values())
    if args.json:
        out = {
            "wording": args.wording,
            "seeds": args.seeds,
            "dropped_rules": sorted(DROPPED_RULES),
            "precision": round(right / readings, 4) if readings else 0.0,
            "rules": {name: {**r.as_dict(), **({"wrong": r.wrong} if args.wrong else {})} for name, r in rules.items()},
        }
        print(json.dumps(out, indent=2))
        return 0
    print(f"{'RULE':<24}{'READ':>6}{'RIGHT':>7}{'PREC':>7}{'LOW95':>7}")
    for name, r in rules.items():
        dropped = "  (dropped)" if name in DROPPED_RULES else ""
        low = max(0.0, wilson_lower(r.right, r.readings))
        print(f"{name:<24}{r.readings:>6}{r.right:>7}{r.precision:>7.2f}{low:>7.2f}{dropped}")
        for wrong in r.wrong:
            print(f"    {wrong['note']!r}\n      read {wrong['read']}\n      stated {wrong['stated']}")
    print(f"{'all':<24}{readings:>6}{right:>7}{(right / readings if readings else 0):>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
