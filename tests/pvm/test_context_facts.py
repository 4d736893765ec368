"""What we know and the rules that apply: the facts and rules sections of an agent's context (pvm.context_facts)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from contracts import Minute, encode_minute, keys
from contracts.fact_changes import asserted_minute, tier_promoted_minute
from contracts.facts import GLOBAL_KEY, Fact, FactStatus, FactType, TierKey
from contracts.memory import ContextPackage, fact_line
from pvm.config import Settings
from pvm.context_facts import relevance, rule_matches, words
from pvm.knowledge import promote_minute
from pvm.reader import ContextReader, line_cost
from pvm.stores.facts import FactStore
from pvm.stores.log import LogReader
from tests.memory_helpers import round_trips
from workers.facts.pool import FactsContext, facts_batch

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)  # every fact here holds from a time already past
P1 = TierKey.for_project("p1")
TASK = TierKey.for_task("p1", "T-7")
_n = iter(range(1, 10**9))


def at(minutes: float) -> str:
    return (T0 + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def mid() -> str:
    return f"src{next(_n):07d}"


def known(
    text: str,
    *,
    tier: TierKey = P1,
    type: FactType = FactType.FACT,
    subject: str | None = None,
    attribute: str = "note",
    value: str | None = None,
    minute: float = 0,
    importance: float | None = None,
    tags: Sequence[str] = (),
    status: FactStatus = FactStatus.PROMOTED,
) -> Fact:
    return Fact.new(
        type=type,
        text=text,
        subject=subject or text,
        attribute=attribute,
        value=value or text,
        tier_key=tier,
        confidence=0.9,
        source_minute_ids=(mid(),),
        status=status,
        valid_from=at(minute),
        recorded_at=at(minute),
        importance=importance,
        tags=tuple(tags),
    )


def put(store: FactStore, *facts: Fact) -> None:
    """Apply each fact as the pool does: an assertion minute, or a tier promotion's for a global copy."""
    for fact in facts:
        if fact.tier_key == GLOBAL_KEY:
            below = fact.with_(tier_key=TierKey.for_project("elsewhere"), promoted_from=None)
            store.apply(tier_promoted_minute(below, minute_id=mid(), timestamp=fact.recorded_at))
        else:
            store.apply(asserted_minute(fact, minute_id=mid(), timestamp=fact.recorded_at))


@pytest.fixture
def reader(redis_client: redis.Redis, settings: Settings) -> ContextReader:
    return ContextReader(redis_client, LogReader(settings.log_dir))


@pytest.fixture
def store(redis_client: redis.Redis) -> FactStore:
    return FactStore(redis_client)


def texts(pkg: ContextPackage) -> list[str]:
    return [f["text"] for f in pkg.facts]


def minute_at(n: int, minutes: float, **fields: Any) -> Minute:
    """Minute `n` of project p1 by agent a1, `minutes` after T0."""
    return Minute(id=f"m{n:05d}", project_id="p1", agent_id="a1", timestamp=at(minutes), **fields)


def pool(redis_client: redis.Redis, settings: Settings, minutes: Sequence[Minute]) -> dict[str, Any]:
    """Run the facts pool in-process over `minutes`, as the log pool would hand them on."""
    records = [[m.id, i + 1, encode_minute(m), None] for i, m in enumerate(minutes)]
    return facts_batch(FactsContext.build(redis_client, settings), redis_client, records)


# -- what we know -------------------------------------------------------------------------------------------------


def test_a_changed_slot_shows_only_its_current_value(
    reader: ContextReader, store: FactStore, redis_client: redis.Redis, settings: Settings
) -> None:
    def said(n: int, value: str, minutes: float) -> Minute:
        stated = {"subject": "auth service", "attribute": "session ttl", "value": value, "confidence": 0.95}
        return minute_at(n, minutes, event_type="knowledge", data={"fact": stated})

    pool(redis_client, settings, [said(1, "30 minutes", 0), said(2, "8 hours", 60)])
    pkg = reader.build_context("p1", "coder", task="what is the auth service session ttl?")
    assert [f["value"] for f in pkg.facts] == ["8 hours"]
    text = pkg.render()
    assert "## What we know" in text and "8 hours" in text and "30 minutes" not in text
    history = store.history(P1, pkg.facts[0]["id"])
    assert [(f.value, f.status) for f in history] == [("30 minutes", "superseded"), ("8 hours", "promoted")]


def test_pending_retracted_and_future_facts_are_not_what_we_know(reader: ContextReader, store: FactStore) -> None:
    later = datetime.now(UTC) + timedelta(days=3)
    put(
        store,
        known("the cache is redis", subject="cache", attribute="engine", value="redis"),
        known("the queue is rq", subject="queue", attribute="engine", value="rq", status=FactStatus.PENDING),
    )
    future = Fact.new(
        type=FactType.DECISION,
        text="freeze deploys next week",
        subject="deploys",
        attribute="freeze",
        value="yes",
        tier_key=P1,
        confidence=0.9,
        source_minute_ids=(mid(),),
        status=FactStatus.PROMOTED,
        valid_from=later.isoformat(),
        recorded_at=at(0),
    )
    put(store, future)
    assert texts(reader.build_context("p1", "a1", task="cache queue deploys")) == ["the cache is redis"]


def test_constraints_and_goals_are_kept_under_a_tight_budget(reader: ContextReader, store: FactStore) -> None:
    relevant = [known(f"the payments api retries failed charges {i} times before it alerts") for i in range(30)]
    constraint = known(
        "never deploy on fridays", type=FactType.CONSTRAINT, subject="deploys", attribute="day", value="not friday"
    )
    goal = known("ship v2 by march", type=FactType.GOAL, subject="v2", attribute="ship by", value="march")
    put(store, *relevant, constraint, goal)
    whole = reader.build_context("p1", "a1", task="payments api retries failed charges", budget_tokens=100_000)
    assert len(whole.facts) == 32 and not whole.budget.tier_cut
    pkg = reader.build_context("p1", "a1", task="payments api retries failed charges", budget_tokens=300)
    kept = texts(pkg)
    assert set(kept[:2]) == {"never deploy on fridays", "ship v2 by march"}  # ahead of every more relevant fact
    assert 2 < len(kept) < 32
    assert pkg.budget.tier_cut == {"project": 32 - len(kept)} and pkg.budget.cut["facts"] == 32 - len(kept)
    assert pkg.budget.tiers["project"] == pkg.budget.sections["facts"] <= 300 * 0.3
    # With room for little else, the goal and the constraint still go first.
    tiny = reader.build_context("p1", "a1", task="payments api retries failed charges", budget_tokens=60)
    assert texts(tiny) and set(texts(tiny)) <= {"never deploy on fridays", "ship v2 by march"}


def test_the_most_relevant_facts_come_first(reader: ContextReader, store: FactStore) -> None:
    put(
        store,
        known("the billing service bills monthly", minute=3),
        known("the login page uses oauth through the gateway", minute=1),
        known("the login session cookie lasts eight hours", minute=2),
    )
    pkg = reader.build_context("p1", "a1", task="why does the login session cookie expire?")
    assert texts(pkg) == [
        "the login session cookie lasts eight hours",
        "the login page uses oauth through the gateway",
        "the billing service bills monthly",
    ]
    assert relevance(words("login session cookie"), words("the login session cookie lasts")) == 1.0


def fact_cost(pkg: ContextPackage) -> int:
    """What one of `_tiered`'s facts costs in the budget (they all cost the same)."""
    return line_cost(fact_line(pkg.facts[-1]))


def _tiered(store: FactStore, per_tier: int = 40) -> None:
    """`per_tier` facts of one cost (same length of text) in each of the task, project and global tiers."""
    for tier, name in ((TASK, "task"), (P1, "proj"), (GLOBAL_KEY, "glob")):
        put(
            store, *(known(f"{name} fact number {i:03d} about the deploy pipeline", tier=tier) for i in range(per_tier))
        )


def test_the_facts_budget_splits_40_40_20_across_tiers(reader: ContextReader, store: FactStore) -> None:
    _tiered(store)
    pkg = reader.build_context(
        "p1", "a1", task="deploy pipeline", budget_tokens=2000, task_id="T-7", include_global=True
    )
    tiers = pkg.budget.tiers
    cost = fact_cost(pkg)
    room = 2000 * 0.3
    assert set(tiers) == {"task", "project", "global"}
    assert abs(tiers["task"] - 0.4 * room) <= cost and abs(tiers["project"] - 0.4 * room) <= cost
    assert abs(tiers["global"] - 0.2 * room) <= cost
    assert sum(tiers.values()) == pkg.budget.sections["facts"] <= room
    assert all(pkg.budget.tier_cut[t] > 0 for t in ("task", "project", "global"))
    counts = {
        t: sum(1 for f in pkg.facts if f["tier_key"].startswith(p))
        for t, p in (("task", "task:"), ("project", "project:"), ("global", "global"))
    }
    assert {t: 40 - n for t, n in counts.items()} == pkg.budget.tier_cut
    # Tiers come in order: the task's, the project's, then every project's.
    order = [f["tier_key"].split(":")[0] for f in pkg.facts]
    assert order == sorted(order, key=["task", "project", "global"].index)
    text = pkg.render()
    assert text.index("### This task (T-7)") < text.index("### This project") < text.index("### Every project")


def test_a_tier_not_read_gives_its_share_to_the_others(reader: ContextReader, store: FactStore) -> None:
    _tiered(store)
    room = 2000 * 0.3
    no_task = reader.build_context("p1", "a1", task="deploy pipeline", budget_tokens=2000, include_global=True)
    cost = fact_cost(no_task)
    assert set(no_task.budget.tiers) == {"project", "global"}  # no task named: its tier is not read
    assert abs(no_task.budget.tiers["project"] - room * 2 / 3) <= cost
    assert abs(no_task.budget.tiers["global"] - room / 3) <= cost
    project_only = reader.build_context("p1", "a1", task="deploy pipeline", budget_tokens=2000)
    assert set(project_only.budget.tiers) == {"project"} and project_only.budget.tiers["project"] > room - cost
    assert all(f["tier_key"] == "project:p1" for f in project_only.facts)


def test_a_tier_needing_less_leaves_the_rest_to_the_others(reader: ContextReader, store: FactStore) -> None:
    _tiered(store)
    put(store, known("the one fact of task T-8 about the deploy pipeline", tier=TierKey.for_task("p1", "T-8")))
    room = 2000 * 0.3
    pkg = reader.build_context(
        "p1", "a1", task="deploy pipeline", budget_tokens=2000, task_id="T-8", include_global=True
    )
    tiers = pkg.budget.tiers
    assert "task" not in pkg.budget.tier_cut and tiers["task"] < 0.1 * room
    assert tiers["project"] > 0.5 * room and tiers["global"] > 0.25 * room  # 2 : 1 of what the task left
    assert sum(tiers.values()) > room - fact_cost(pkg)


def test_the_split_is_configurable(redis_client: redis.Redis, settings: Settings, store: FactStore) -> None:
    _tiered(store)
    settings = settings.with_(fact_tier_split=(0.0, 1.0, 3.0))
    reader = ContextReader(redis_client, LogReader(settings.log_dir), fact_tier_split=settings.fact_tier_split)
    pkg = reader.build_context(
        "p1", "a1", task="deploy pipeline", budget_tokens=2000, task_id="T-7", include_global=True
    )
    assert pkg.budget.tiers["task"] == 0 and abs(
        pkg.budget.tiers["global"] - 3 * pkg.budget.tiers["project"]
    ) <= 3 * fact_cost(pkg)
    # A tier of weight 0 gets what the others leave once they have every fact.
    put(store, known("the one p2 fact", tier=TierKey.for_project("p2")))
    put(
        store,
        *(
            known(f"p2 task fact {i:03d} about the deploy pipeline", tier=TierKey.for_task("p2", "T-7"))
            for i in range(40)
        ),
    )
    p2 = reader.build_context("p2", "a1", task="deploy pipeline", budget_tokens=2000, task_id="T-7")
    assert 0 < p2.budget.tiers["project"] < p2.budget.tiers["task"] and p2.budget.tier_cut == {
        "task": 40 - len(p2.facts) + 1
    }
    with pytest.raises(ValueError, match="PVM_FACT_TIER_SPLIT"):
        ContextReader(redis_client, LogReader(settings.log_dir), fact_tier_split=(1, 1))
    with pytest.raises(ValueError, match="PVM_FACT_TIER_SPLIT"):
        ContextReader(redis_client, LogReader(settings.log_dir), fact_tier_split=(0, 0, 0))


# -- tenancy ------------------------------------------------------------------------------------------------------


def test_global_facts_need_the_grant(reader: ContextReader, store: FactStore) -> None:
    put(store, known("every service logs in json", tier=GLOBAL_KEY), known("p1 deploys with helm"))
    closed = reader.build_context("p1", "a1", task="how do services log and deploy", task_id="T-7")
    assert texts(closed) == ["p1 deploys with helm"] and "global" not in closed.budget.tiers
    assert "Every project" not in closed.render()
    granted = reader.build_context("p1", "a1", task="how do services log and deploy", include_global=True)
    assert set(texts(granted)) == {"every service logs in json", "p1 deploys with helm"}


def test_facts_of_another_project_or_task_never_appear(reader: ContextReader, store: FactStore) -> None:
    for project in ("p1", "p2", "p3"):
        put(
            store,
            known(f"{project} project fact on deploys", tier=TierKey.for_project(project)),
            known(f"{project} task fact on deploys", tier=TierKey.for_task(project, "T-7")),
            known(f"{project} other task fact on deploys", tier=TierKey.for_task(project, "T-9")),
        )
    for project in ("p1", "p2", "p3"):
        pkg = reader.build_context(project, "a1", task="deploys", task_id="T-7", include_global=True)
        assert sorted(texts(pkg)) == [f"{project} project fact on deploys", f"{project} task fact on deploys"]
        assert {f["tier_key"] for f in pkg.facts} == {f"project:{project}", f"task:{project}:T-7"}
    assert texts(reader.build_context("p4", "a1", task="deploys", task_id="T-7", include_global=True)) == []
    with pytest.raises(ValueError, match="task_id"):
        reader.build_context("p1", "a1", task_id=" ")
    with pytest.raises(ValueError, match="tags must be a list of strings"):
        reader.build_context("p1", "a1", tags="deploy")


# -- rules --------------------------------------------------------------------------------------------------------


def rule(condition: str, action: str, priority: float, tier: TierKey = P1, tags: Sequence[str] = ()) -> Fact:
    return known(
        f"when {condition}, {action}",
        type=FactType.PROCEDURE,
        subject=condition,
        attribute="action",
        value=action,
        importance=priority,
        tags=tags,
        tier=tier,
    )


def test_a_rule_appears_when_its_condition_matches_the_task_or_a_tag(reader: ContextReader, store: FactStore) -> None:
    put(
        store,
        rule("deploying to production", "run the smoke tests first", 0.6),
        rule("a payment fails", "page the payments on-call", 0.9, tags=["payments"]),
        rule("touching the schema", "write a migration", 0.7, tier=TASK),
    )
    deploy = reader.build_context("p1", "a1", task="deploying the billing service to production")
    assert [r["value"] for r in deploy.rules] == ["run the smoke tests first"]
    assert "## Rules that apply" in deploy.render()
    assert "- when deploying to production: run the smoke tests first (priority 0.6)" in deploy.render()
    assert deploy.facts == ()  # procedures are rules, not facts
    unrelated = reader.build_context("p1", "a1", task="fix the login page", tags=["frontend"], task_id="T-7")
    assert unrelated.rules == () and "## Rules that apply" not in unrelated.render()
    by_tag = reader.build_context("p1", "a1", task="look into it", tags=["payments", "production"], task_id="T-7")
    assert [r["value"] for r in by_tag.rules] == ["page the payments on-call", "run the smoke tests first"]
    schema = reader.build_context("p1", "a1", task="touching the schema of users", task_id="T-7")
    assert [r["value"] for r in schema.rules] == ["write a migration"]
    assert reader.build_context("p1", "a1", task="touching the schema of users").rules == ()  # the task's own rule
    assert rule_matches(words("deploying to production"), frozenset(), words("deploy it to production"), frozenset())
    assert not rule_matches(words("deploying to staging"), frozenset(), words("deploy to production"), frozenset())
    assert rule_matches(
        words("a payment fails on checkout"), frozenset(), words("checkout payment failed"), frozenset()
    )
    assert rule_matches(
        words("a payment fails on checkout"), frozenset(), words("payment failed at checkout"), frozenset()
    )
    assert not rule_matches(words("a payment fails on checkout"), frozenset(), words("checkout page"), frozenset())
    assert not rule_matches(words("deploying to production"), frozenset(), words("fix it"), words("frontend"))


def test_the_package_carries_facts_and_rules_over_the_wire(reader: ContextReader, store: FactStore) -> None:
    put(store, known("p1 deploys with helm"), rule("deploying to production", "run the smoke tests first", 0.6))
    pkg = reader.build_context("p1", "a1", task="deploying to production", include_global=True)
    assert pkg.facts and pkg.rules
    assert ContextPackage.from_dict(pkg.to_dict()) == pkg
    assert pkg.budget.sections["rules"] > 0 and pkg.budget.tiers == {
        "project": pkg.budget.sections["facts"],
        "global": 0,
    }


def test_the_facts_a_context_keeps_have_their_reads_counted(
    reader: ContextReader, store: FactStore, redis_client: redis.Redis
) -> None:
    facts = [known(f"fact {i} about deploys " + "x" * 60) for i in range(20)]
    put(store, *facts)
    pkg = reader.build_context("p1", "a1", task="deploys", budget_tokens=300)
    kept = {f["id"] for f in pkg.facts}
    assert 0 < len(kept) < 20
    counted = {k.decode() for k in redis_client.hkeys("pvm:{p:p1}:facts:reads") if b":at" not in k}
    assert counted == kept


# -- round trips --------------------------------------------------------------------------------------------------


def test_a_context_with_facts_waits_on_one_round_trip_and_counts_its_reads_without_waiting(
    reader: ContextReader, store: FactStore, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tiered(store, 5)
    put(store, rule("deploying to production", "run the smoke tests first", 0.6))
    reader.build_context("p1", "a1", task="deploy", task_id="T-7", include_global=True)  # loads the scripts
    trips = round_trips(monkeypatch)
    pkg = reader.build_context("p1", "a1", task="deploying to production", task_id="T-7", include_global=True)
    assert pkg.facts and pkg.rules
    # The scripts' write (sent before the search, read after it), then the read counters, sent after CLIENT REPLY
    # SKIP: the server answers none of them, and the context does not wait.
    assert trips == [b"EVALSHA", b"CLIENT"]
    fact = Fact.from_dict(pkg.facts[0])
    counted = redis_client.hgetall(keys.fact_reads(fact.tier_key))
    assert counted[fact.id.encode()] == b"2"  # kept by both contexts: both counts landed


_projects = st.sampled_from(["p1", "p2", "p3"])
_tier_names = st.sampled_from(["project", "task:T-1", "task:T-2", "global"])


@hsettings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(
    layout=st.lists(st.tuples(_projects, _tier_names, st.booleans()), min_size=1, max_size=15),
    asked=_projects,
    task_id=st.sampled_from([None, "T-1", "T-2"]),
    include_global=st.booleans(),
)
def test_a_context_reads_exactly_the_tiers_it_names(
    reader: ContextReader,
    redis_client: redis.Redis,
    layout: list[tuple[str, str, bool]],
    asked: str,
    task_id: str | None,
    include_global: bool,
) -> None:
    redis_client.flushdb()
    store = FactStore(redis_client)
    for i, (project, tier_name, procedure) in enumerate(layout):
        if tier_name == "global":
            tier = GLOBAL_KEY
        elif tier_name == "project":
            tier = TierKey.for_project(project)
        else:
            tier = TierKey.for_task(project, tier_name.split(":")[1])
        if procedure:
            put(store, rule(f"deploying service {i}", f"check {i}", 0.5, tier=tier, tags=["deploy"]))
        else:
            put(store, known(f"fact {i} of {tier} about deploys", tier=tier))
    wanted = {f"project:{asked}"} | ({f"task:{asked}:{task_id}"} if task_id else set())
    wanted |= {"global"} if include_global else set()
    pkg = reader.build_context(
        asked,
        "a1",
        task="deploys",
        tags=["deploy"],
        budget_tokens=100_000,
        task_id=task_id,
        include_global=include_global,
    )
    expected_facts, expected_rules = set(), set()
    for i, (project, tier_name, procedure) in enumerate(layout):
        key = (
            "global"
            if tier_name == "global"
            else f"{tier_name.split(':')[0]}:{project}"
            + (f":{tier_name.split(':')[1]}" if tier_name.startswith("task") else "")
        )
        if key in wanted:
            (expected_rules if procedure else expected_facts).add(i)
    assert {f["tier_key"] for f in (*pkg.facts, *pkg.rules)} <= wanted
    assert {int(f["text"].split()[1]) for f in pkg.facts} == expected_facts
    assert {int(r["subject"].split()[-1]) for r in pkg.rules} == expected_rules


def test_words_read_the_same_from_the_stem_memo_as_stemmed_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    import random

    from pvm import context_facts

    monkeypatch.setattr(context_facts, "_STEMS_SIZE", 5)  # the memo starts over many times below
    rng = random.Random(3)
    vocabulary = ["the", "Deploys", "failing", "studies", "ran", "I", "ÉCOLE", "naïve", "x_y", "with", "caches"]
    for _ in range(500):
        text = " ".join(rng.choice(vocabulary) for _ in range(rng.randint(0, 9)))
        said = context_facts._WORD.findall(text.casefold())
        assert context_facts.words(text) == {context_facts._stem(w) for w in said if w not in context_facts._STOPWORDS}


def test_a_fact_a_newer_minute_questions_is_shown_with_it_not_as_settled(
    reader: ContextReader, redis_client: redis.Redis, settings: Settings
) -> None:
    def noted(n: int, note: str, minutes: float) -> Minute:
        return minute_at(n, minutes, event_type="message", memory_note=note)

    pool(redis_client, settings, [noted(1, "The release train runs every two weeks.", 0)])
    pool(
        redis_client,
        settings,
        [noted(2, "OK, we're going weekly. Starting next Monday every train is one week long.", 60)],
    )
    pkg = reader.build_context("p1", "planner", task="how often does the release train run?")
    # One line: the held value with the newer minute's words beside it; the statement is not a line of its own.
    assert [f["value"] for f in pkg.facts] == ["every two weeks"]
    lines = [line for line in pkg.render().splitlines() if "every two weeks" in line or "one week long" in line]
    assert len(lines) == 1
    assert lines[0].endswith(
        f"- questioned by a newer minute ({at(60)[:10]}): Starting next Monday every train is one week long."
    )
    assert pkg.facts[0]["questioned_by"]["source_minute_ids"] == ["m00002"]
    # The record is still the fact's for the calls that take a context's fact (a tier promotion).
    assert promote_minute(pkg.facts[0]).data["fact"]["value"] == "every two weeks"
    # Read as a change, the new value replaces the old; the statement then stands on its own.
    pool(redis_client, settings, [noted(3, "The release train now runs weekly.", 120)])
    pkg = reader.build_context("p1", "planner", task="how often does the release train run?")
    assert sorted(f["value"] for f in pkg.facts) == ["Starting next Monday every train is one week long.", "weekly"]
    assert "questioned" not in pkg.render()
