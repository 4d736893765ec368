"""Where a value goes in its slot's timeline: which values it supersedes, which supersedes it, which contradict it.

One rule for the facts pool (`workers.facts.pool.decide`) and the API's assertions and promotions
(`workers.api.fact_routes`), both deciding under the slot's lease:

- Between single-valued values of one slot (retracted ones aside), a value supersedes each value that
  started before it and still holds when it starts; the earliest value starting after it supersedes it;
  a value starting at the same instant contradicts it.
- **Only trusted knowledge retires trusted knowledge.** A pending value (below `PVM_FACT_PROMOTE_AT`)
  supersedes pending values only: a promoted fact stays current until a promoted value replaces it. A
  pending newer value waits beside it (in the slot's history, ``status=pending``) and supersedes it the
  moment it is promoted, by restatement or by hand, from its own ``valid_from`` (`on_promotion`). On the
  held-out labeled set, 4 of 6 low-confidence value changes the rules read were wrong; each used to retire
  a right, promoted value and leave its slot with no current value at all.

A superseded value counts as trusted (it held once, and a pending value is seldom superseded before it
is promoted).

**A value that comes back is its next period** (`place`). A fact has one validity window, so a value
that held, was replaced and holds again (Postgres, then MySQL, then Postgres) cannot reopen its old
record: stated again from a start when none of its periods holds and each ended by then, it is a new
fact, ``period`` one past the last, fitted by the rule above (it supersedes the value holding then).
Stated within one of its periods, it restates that one; stated before its first period (a late minute),
it restates the earliest period after it. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from contracts.facts import Fact, FactStatus, check_time, normalize_value

TRUSTED = frozenset({FactStatus.PROMOTED, FactStatus.SUPERSEDED})


@dataclass(frozen=True, slots=True)
class Fitting:
    """What a value does to its slot: the values it supersedes, those it contradicts, the one superseding it."""

    older: list[Fact] = field(default_factory=list)
    same: list[Fact] = field(default_factory=list)
    later: Fact | None = None


def start(fact: Fact) -> datetime:
    return check_time(fact.valid_from, "valid_from")


def fit(view: Iterable[Fact], fresh: Fact) -> Fitting:
    """Where `fresh` goes among `view` (its slot's other values, any status) by the rule above."""
    if not fresh.single_valued:
        return Fitting()
    starts = start(fresh)
    trusted = fresh.status in TRUSTED
    timeline = sorted(
        (f for f in view if f.id != fresh.id and f.status is not FactStatus.RETRACTED and f.single_valued),
        key=lambda f: (start(f), f.id),
    )
    return Fitting(
        older=[
            f for f in timeline if start(f) < starts and f.holds_at(starts) and (trusted or f.status not in TRUSTED)
        ],
        same=[f for f in timeline if start(f) == starts],
        later=next((f for f in timeline if start(f) > starts and (f.status in TRUSTED or not trusted)), None),
    )


@dataclass(frozen=True, slots=True)
class Placing:
    """Which period of its value a statement belongs to: `restates` a fact of it, or else is its `period`-th."""

    restates: Fact | None
    period: int = 0


def place(view: Iterable[Fact], fresh: Fact) -> Placing:
    """Where `fresh` (a statement of a value, from its ``valid_from``) goes among its value's periods in `view`.

    The period holding at its start, if any, is restated; else, when every period ended by its start, it is
    the value's next period; else (before the value's first period, or between two) it restates the
    earliest period starting after it. A value new to the slot is its period 0.
    """
    key = (fresh.tier_key, fresh.slot, normalize_value(fresh.value))
    periods = sorted(
        (f for f in view if (f.tier_key, f.slot, normalize_value(f.value)) == key),
        key=lambda f: (start(f), f.period),
    )
    if not periods:
        return Placing(None, 0)
    starts = start(fresh)
    holding = next((f for f in periods if f.holds_at(starts)), None)
    if holding is not None:
        return Placing(holding)
    if all(f.valid_until is not None and check_time(f.valid_until, "valid_until") <= starts for f in periods):
        return Placing(None, max(f.period for f in periods) + 1)
    return Placing(next(f for f in periods if start(f) > starts))


def on_promotion(view: Iterable[Fact], promoted: Fact) -> list[Fact]:
    """The values a pending fact supersedes now that it is promoted: those holding when it starts."""
    return fit(view, promoted.with_(status=FactStatus.PROMOTED)).older
