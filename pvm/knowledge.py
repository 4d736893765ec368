"""An agent's key-value memory: `learn`, `recall` and `promote`, as knowledge-change minutes.

`Emitter.learn(project, key, value, tier=...)` writes a ``fact_learned``
minute (`contracts.fact_changes.learned_minute`) the way `emit` writes any
minute; once the facts pool applies it, the value is a promoted fact in slot
(``learned``, key) of that tier, superseding the key's previous value.
`ContextReader.recall(project, key)` reads the key's current value: the task
tier first (when a task is named), then the project, then the global tier
(only when granted). `Emitter.promote(fact)` copies a current fact one tier
up (task -> project -> global) with a ``fact_tier_promoted`` minute.

Nothing here talks to Redis: these functions build and check the minutes and
keys, and every error names the argument to fix (`InvalidFact`,
`InvalidMinute`; both are `ValueError`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contracts.errors import InvalidFact
from contracts.fact_changes import learned_minute, learned_slot, tier_promoted_minute
from contracts.facts import FIELD_RULES, GLOBAL_KEY, Fact, FactStatus, FactType, Tier, TierKey
from contracts.memory import as_fact_record
from contracts.minute import Minute, check_project_id

TIER_NAMES = ", ".join(t.value for t in Tier)


def check_key(key: object) -> str:
    """`key` if it can name a learned value (the attribute of its slot), else `InvalidFact` naming ``key``."""
    if not isinstance(key, str):
        raise InvalidFact(
            "key", f"must be text naming what to remember (such as 'deploy window'), got {type(key).__name__}"
        )
    try:
        FIELD_RULES["attribute"](key)
        learned_slot(key)
    except InvalidFact as exc:
        raise InvalidFact("key", f"{exc.problem}; name what to remember, such as 'deploy window'") from None
    return key


def learn_tier_key(project_id: str, tier: Tier | str, task_id: str | None) -> TierKey:
    """The tier key `learn` writes to: the task's (tier ``task``, with `task_id`), the project's, or global."""
    check_project_id(project_id)
    try:
        kind = Tier(tier)
    except ValueError:
        raise InvalidFact("tier", f"{tier!r} must be one of {TIER_NAMES}") from None
    if kind is Tier.TASK:
        if task_id is None:
            raise InvalidFact("task_id", "tier='task' remembers for one task: pass task_id='<the task>'")
        try:
            return TierKey.for_task(project_id, task_id)
        except InvalidFact as exc:
            raise InvalidFact("task_id", exc.problem) from None
    if task_id is not None:
        raise InvalidFact("task_id", f"only tier='task' names a task; drop task_id or pass tier='task' (not {kind})")
    return GLOBAL_KEY if kind is Tier.GLOBAL else TierKey.for_project(project_id)


def learn_minute(
    project_id: str,
    key: str,
    value: str | int | float | bool,
    tier: Tier | str = Tier.PROJECT,
    *,
    task_id: str | None = None,
    type: FactType | str = FactType.FACT,
    text: str | None = None,
    agent_id: str | None = None,
) -> Minute:
    """The ``fact_learned`` minute of ``learn(key, value)`` in `project_id`'s log (a global key's too).

    `value` is text, a number or a boolean (a number is written canonically: ``16.0`` -> ``16``).
    """
    tier_key = learn_tier_key(project_id, tier, task_id)
    check_key(key)
    if not isinstance(value, (str, int, float)):  # a boolean is an int
        raise InvalidFact("value", f"must be text, a number or a boolean, got {value.__class__.__name__}")
    try:
        kind = FactType(type)
    except ValueError:
        raise InvalidFact("type", f"{type!r} must be one of {', '.join(t.value for t in FactType)}") from None
    return learned_minute(
        key,
        value,
        tier_key,
        type=kind,
        text=text,
        project_id=project_id if tier_key.tier is Tier.GLOBAL else None,
        agent_id=agent_id,
    )


def promote_minute(fact: Fact | Mapping[str, Any], *, agent_id: str | None = None) -> Minute:
    """The ``fact_tier_promoted`` minute copying `fact` (a `Fact`, or its `to_dict()` as in a context) a tier up.

    Only current knowledge is promoted: a pending, superseded or retracted fact is refused, naming its status.
    """
    held = fact if isinstance(fact, Fact) else Fact.from_dict(as_fact_record(fact))
    if held.status is not FactStatus.PROMOTED:
        raise InvalidFact(
            "status",
            f"fact {held.id} is {held.status}; only a current (promoted) fact is copied a tier up"
            + (" (promote it in place first: pvm facts promote ID)" if held.status is FactStatus.PENDING else ""),
        )
    if held.tier_key.parent is None:
        raise InvalidFact("tier_key", f"fact {held.id} is in the global tier, the top one; there is nothing above it")
    return tier_promoted_minute(held, agent_id=agent_id)
