"""Generated multi-agent sessions that plant facts, with the gold labels a fact extractor is scored against.

A session is a few projects' minutes in time order. Into each project the
generator plants facts it knows, over all seven fact types:

- fact:       a component's attribute (the billing service's database is
              Postgres), the tool for a purpose (we use Sentry for error
              tracking), why a kind of task fails (a `task_failed` minute
              with `data.error`), a task's deadline (task tier);
- decision:   a new value for an attribute, usually replacing an old one
              (switch the billing service's database from Postgres to
              CockroachDB), in decision, conflict_resolved or message minutes;
- entity:     what a named thing is (Acme is a payment provider), its aliases;
- preference: what the team prefers for a topic;
- constraint: what must (not) be done, by everyone or by one component;
- goal:       what a component should achieve;
- procedure:  condition -> action (to rotate the TLS certificates, run ...;
              when the disk fills up, expand the volume ...).

What makes it a test and not a demo:

- **value changes**: a slot (tier key + subject + attribute) gets up to three
  values over time; every statement of a value comes before the next value's;
- **restatements**: a fact is stated up to three times, in different
  templates, by different agents, sometimes days apart (dedupe must merge
  them), and some values have several surface forms (``8 hours`` / ``8h``);
- **look-alikes**: facts in different slots that share a subject or an
  attribute (the billing service's database and the billing worker's
  database; the auth service's session TTL and its request timeout), stated
  close together: one must never invalidate the other;
- **filler**: chatter that states nothing, and traps that look like a fact
  and are not (questions, hedges, "must have failed", "I cannot reproduce",
  "when I got in, the build was red");
- **relative dates**: deadlines and goals with "next Friday" or "in 3 days",
  and statements valid "starting tomorrow" or "since yesterday", grounded
  against the stating minute's timestamp;
- **tiers**: a share of the facts belongs to a task (minutes with
  ``scope="task"``), the rest to the project, across several projects that
  reuse the same subjects;
- **the structured convention**: a share of the statements carry the fact in
  ``data`` (``{"fact": {...}}``, see docs/extraction.md) with a note that
  states nothing.

Every statement is phrased from a template; ``split="heldout"`` phrases the
same planted facts with templates the rule extractor was not written against,
so a benchmark reports both. The gold is a `GoldFact` per planted fact (type,
tier key, slot, value, valid_from, the minute ids that state it) and the
current view (`FactSession.current_view`). `score()` compares an extractor's
candidates with the gold.

Relative dates mean what docs/extraction.md says (the extractor implements
the same table): a date phrase names a UTC day, its start is the valid_from.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from bench.sessions import AGENTS, CHATTER, ENTITIES
from contracts import Minute
from workers.facts.extraction import Candidate, single_valued, value_key
from workers.rules.statements import STATEMENT

SPLITS = ("default", "heldout")  # the benchmark's
DEV = "dev"  # rule changes are made against it (see DEV_TEMPLATES)
CALIBRATION = "calibration"  # the rules' confidences are measured on it (bench/calibrate_rules.py)
WORDINGS = (*SPLITS, DEV, CALIBRATION)
FACT_TYPES = ("fact", "decision", "entity", "preference", "constraint", "goal", "procedure")
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)  # a Monday; sessions are dated, never "now", so they are reproducible
STEP_MINUTES = (2, 150)  # a project's minutes are this many minutes apart (uniform): a session spans days
FILLER_SHARE = 0.35  # share of a project's minutes that state nothing
STRUCTURED_SHARE = 0.15  # share of statements that carry the fact in data (the structured convention)
ADVERBIAL_SHARE = 0.15  # share of attribute statements with a "starting tomorrow"-like valid_from

# -- the inventory (the same for both splits) ---------------------------------------

# Components, in pairs that look alike (a fact about one must never invalidate the other's).
SUBJECTS = (
    "billing service",
    "billing worker",
    "auth service",
    "auth gateway",
    "search api",
    "search indexer",
    "checkout page",
    "mobile app",
    "web frontend",
    "data pipeline",
    "notification service",
    "reporting job",
    "admin console",
    "payments api",
    "image service",
    "user service",
)


@dataclass(frozen=True)
class Attribute:
    """An attribute of a component: canonical name, how people say it, values it takes."""

    name: str
    surfaces: tuple[str, ...]
    values: tuple[tuple[str, ...], ...]  # each value: its canonical form first, then other ways to write it


ATTRIBUTES = (
    Attribute(
        "database",
        ("database", "DB", "datastore"),
        (("Postgres",), ("CockroachDB",), ("MySQL",), ("MongoDB",), ("DynamoDB",), ("SQLite",)),
    ),
    Attribute("cache", ("cache", "cache backend"), (("Redis",), ("Memcached",), ("Valkey",))),
    Attribute("queue", ("queue", "message broker"), (("RabbitMQ",), ("Kafka",), ("SQS",), ("NATS",))),
    Attribute(
        "language",
        ("language", "programming language"),
        (("Go",), ("Python",), ("Rust",), ("Kotlin",), ("TypeScript",)),
    ),
    Attribute(
        "session_ttl",
        ("session TTL", "session time-to-live"),
        (("8 hours", "8h", "eight hours"), ("30 minutes", "30m", "thirty minutes"), ("24 hours", "24h"), ("2 hours",)),
    ),
    Attribute(
        "request_timeout",
        ("request timeout",),
        (("30 seconds", "30s"), ("5 seconds", "5s", "five seconds"), ("10 seconds", "10s"), ("2 minutes",)),
    ),
    Attribute("max_retries", ("max retries", "retry limit"), (("3", "three"), ("5", "five"), ("10",))),
    Attribute(
        "owner",
        ("owner", "owning team"),
        (("team-payments",), ("team-identity",), ("team-data",), ("team-platform",), ("team-growth",)),
    ),
    Attribute("region", ("region", "cloud region"), (("eu-west-1",), ("us-east-1",), ("eu-central-1",))),
    Attribute("replicas", ("replica count", "number of replicas"), (("2",), ("3", "three"), ("5",), ("7",))),
    Attribute("log_level", ("log level", "logging level"), (("debug",), ("info",), ("warn",), ("error",))),
    Attribute(
        "rate_limit",
        ("rate limit",),
        (("100 requests per second",), ("500 requests per second",), ("50 requests per second",)),
    ),
    Attribute("batch_size", ("batch size",), (("100",), ("500",), ("1000",), ("5000",))),
    Attribute(
        "retention",
        ("retention period", "data retention"),
        (("30 days",), ("90 days",), ("1 year", "one year"), ("7 days", "seven days")),
    ),
    Attribute(
        "framework",
        ("framework", "web framework"),
        (("Django",), ("FastAPI",), ("Spring Boot",), ("Rails",), ("Express",)),
    ),
    Attribute(
        "deploy_window",
        ("deploy window", "release window"),
        (("Tuesday mornings",), ("weekdays before 3pm",), ("Thursday afternoons",)),
    ),
)
# Attribute pairs stated about one component close together (look-alikes in different slots).
LOOKALIKE_ATTRIBUTES = (("session_ttl", "request_timeout"), ("database", "cache"), ("replicas", "max_retries"))

# Purposes and the tools for them ("we use Sentry for error tracking": subject = purpose, attribute = tool).
TOOLS = (
    ("error tracking", ("Sentry", "Rollbar", "Bugsnag")),
    ("feature flags", ("LaunchDarkly", "Unleash", "Flagsmith")),
    ("secrets management", ("Vault", "Doppler", "AWS Secrets Manager")),
    ("continuous integration", ("GitHub Actions", "Buildkite", "CircleCI")),
    ("metrics", ("Prometheus", "Datadog", "InfluxDB")),
    ("incident paging", ("PagerDuty", "Opsgenie")),
    ("log search", ("Loki", "Elasticsearch", "Splunk")),
    ("infrastructure as code", ("Terraform", "Pulumi", "OpenTofu")),
)

# Named things and what they are (entity), with an alias for some.
NAMED = (
    ("Acme", "payment provider", "AcmePay"),
    ("Orion", "codename for the billing rewrite", None),
    ("pg-main", "PostgreSQL cluster", "the main database"),
    ("kafka-eu", "Kafka cluster in Frankfurt", None),
    ("Hermes", "email relay", "the mailer"),
    ("ledgerd", "ledger daemon", None),
    ("Nimbus", "internal cloud console", "the console"),
    ("Beacon", "status page", None),
    ("Quartz", "scheduling service", "the scheduler"),
    ("atlas-ui", "design system", None),
)

# Topics and the options a team may prefer for them.
PREFERENCES = (
    ("merging pull requests", ("squash merges", "rebase merges", "merge commits")),
    ("internal APIs", ("gRPC", "REST", "GraphQL")),
    ("config files", ("YAML", "TOML", "JSON")),
    ("new services", ("Go", "Rust", "Kotlin")),
    ("test data", ("factories", "fixtures")),
    ("logging", ("structured JSON logs", "plain text logs")),
    ("code review", ("small pull requests", "pair review")),
    ("frontend state", ("Redux", "Zustand", "signals")),
    ("dependency updates", ("weekly batches", "automatic merges")),
)

# Constraints: (base form, gerund form) of what must or must not be done.
MUST_NOT_SCOPE = (
    ("deploy on Fridays", "deploying on Fridays"),
    ("push directly to main", "pushing directly to main"),
    ("store secrets in the repository", "storing secrets in the repository"),
    ("skip code review", "skipping code review"),
    ("run migrations during business hours", "running migrations during business hours"),
    ("share customer data in chat", "sharing customer data in chat"),
    ("force-push to shared branches", "force-pushing to shared branches"),
)
MUST_SCOPE = (
    ("encrypt backups at rest", "encrypting backups at rest"),
    ("run the test suite before merging", "running the test suite before merging"),
    ("tag every release", "tagging every release"),
    ("write a changelog entry for each release", "writing a changelog entry for each release"),
    ("get two approvals for schema changes", "getting two approvals for schema changes"),
)
MUST_NOT_COMPONENT = (
    ("log card numbers", "logging card numbers"),
    ("call the admin API", "calling the admin API"),
    ("write to the primary database directly", "writing to the primary database directly"),
    ("cache personal data", "caching personal data"),
    ("block the event loop", "blocking the event loop"),
)
MUST_COMPONENT = (
    ("validate webhook signatures", "validating webhook signatures"),
    ("emit audit events", "emitting audit events"),
    ("support offline mode", "supporting offline mode"),
    ("retry idempotently", "retrying idempotently"),
)

# Goals of a component: an infinitive phrase; {d} is a date the generator grounds.
GOALS = (
    "cut p99 latency below 200 ms",
    "reach 99.9% uptime",
    "handle 10k requests per second",
    "halve the error rate",
    "get test coverage above 80%",
    "ship the v2 API by {d}",
    "drop the legacy endpoints by {d}",
)

# Procedures: for a purpose ("to rotate the TLS certificates, ...") or on a trigger ("when the disk fills up, ...").
PURPOSE_PROCEDURES = (
    ("rotate the TLS certificates", ("run certbot renew and reload nginx", "use the cert-manager renew job")),
    (
        "release a hotfix",
        ("branch from the last tag and run the release pipeline", "cherry-pick onto the release branch"),
    ),
    ("restore a backup", ("use the point-in-time restore in the console", "replay the WAL archive onto a fresh node")),
    ("onboard a new agent", ("add it to the registry and grant read-only tokens",)),
    ("clear the CDN cache", ("purge by surrogate key", "call the purge endpoint with the asset path")),
    ("add a database index", ("create it concurrently during low traffic",)),
)
TRIGGER_PROCEDURES = (
    ("the disk fills up", ("expand the volume and page the DBA", "delete old snapshots first")),
    ("replication lag exceeds 30 seconds", ("fail over to the replica",)),
    ("a deploy fails", ("roll back to the previous release", "freeze the pipeline and open an incident")),
    ("the error rate spikes", ("disable the newest feature flag",)),
    ("a certificate expires", ("renew it manually and file an incident",)),
    ("the queue backs up", ("scale the workers to 10", "pause the importers")),
)

# Why kinds of task fail: a task_failed minute with data.task_kind and data.error.
FAILURE_KINDS = ("deploy", "migration", "backup", "import", "build")
FAILURE_CAUSES = (
    "the migration lock timed out",
    "out of disk space on the runner",
    "the vendor API returned 429s",
    "a flaky integration test",
    "missing environment variable DATABASE_URL",
    "expired credentials",
)
CONFLICT_TYPES = ("resource", "priority", "design")

# -- the templates ------------------------------------------------------------------
# Fields: {s} "the billing service", {s_pos} "the billing service's", {s_bare} "billing service", {a} attribute,
# {v} value, {old} the value it replaces, {p} purpose, {x} a name, {art} a/an, {t} topic, {alt} another option,
# {act}/{ger} what must (not) be done, {c} condition, {d} a date phrase.

TEMPLATES: dict[str, dict[str, tuple[str, ...]]] = {
    "attribute": {
        "default": (
            "{s_pos} {a} is {v}",
            "the {a} of {s} is {v}",
            "{s_bare} {a}: {v}",
            "{s_bare} {a} = {v}",
            "the {a} for {s_bare} is {v}",
            "{s} uses {v} as its {a}",
            "FYI, {s_pos} {a} is {v}",
            "note: {s_bare} {a} is {v}",
        ),
        "heldout": (
            "{v} is the {a} of {s}",
            "for {s}, the {a} we use is {v}",
            "{s} has its {a} set at {v}",
            "{s_pos} {a} currently sits at {v}",
            "{s_bare} — {a} {v}",
            "we're on {v} for the {a} of {s}",
            "checked the config: {s_bare} {a} reads {v}",
        ),
    },
    "attribute_change": {
        "default": (
            "{s_pos} {a} is now {v}",
            "{s_bare} {a} was changed to {v}",
            "we set the {a} of {s} to {v}",
            "we changed {s_pos} {a} to {v}",
        ),
        "heldout": (
            "{s_pos} {a} got bumped to {v}",
            "{s_bare} {a} updated: {v}",
            "heads up, {s} runs with {v} for its {a} from here on",
        ),
    },
    "decision": {
        "default": (
            "we decided to use {v} for the {s_bare} {a}",
            "decision: {s_pos} {a} is {v}",
            "going forward, {s_pos} {a} will be {v}",
            "we are going with {v} for the {a} of {s}",
            "decided: {s_bare} {a} = {v}",
        ),
        "heldout": (
            "the team settled on {v} for {s_pos} {a}",
            "after the review, {s} will use {v} as its {a}",
            "we signed off on {v} as the {a} for {s}",
            "consensus reached: {s_pos} {a} becomes {v}",
        ),
    },
    "decision_change": {
        "default": (
            "we'll switch the {s_bare} {a} from {old} to {v}",
            "use {v} instead of {old} for the {s_bare} {a}",
            "decision: {s_pos} {a} moves from {old} to {v}",
            "we decided to replace {old} with {v} as {s_pos} {a}",
        ),
        "heldout": (
            "{s_bare} {a}: moving to {v} (was {old})",
            "final call: {v} replaces {old} as {s_pos} {a}",
            "we're dropping {old}; {s} gets {v} as its {a}",
        ),
    },
    "tool": {
        "default": (
            "we use {v} for {p}",
            "{p} tool: {v}",
            "our {p} tool is {v}",
            "the team uses {v} for {p}",
            "for {p}, we use {v}",
        ),
        "heldout": (
            "{v} handles our {p}",
            "{p} runs through {v}",
            "{p} is done in {v} these days",
        ),
    },
    "tool_change": {
        "default": (
            "we're moving {p} from {old} to {v}",
            "decision: {p} switches from {old} to {v}",
            "use {v} instead of {old} for {p}",
        ),
        "heldout": (
            "we replaced {old} with {v} for {p}",
            "{p} is on {v} now, {old} is gone",
        ),
    },
    "entity": {
        "default": (
            "{x} is {art} {v}",
            "{x} is our {v}",
            "FYI: {x} is {art} {v}",
            "note: {x} is the {v}",
        ),
        "heldout": (
            "{x} refers to the {v}",
            "when we say {x} we mean the {v}",
            "meet {x}, the new {v}",
        ),
    },
    "alias": {
        "default": ("{x} is also known as {v}", "{x} aka {v}"),
        "heldout": ("{v} is just another name for {x}", "people also call {x} {v}"),
    },
    "preference": {
        "default": (
            "we prefer {v} for {t}",
            "for {t}, we prefer {v}",
            "our preference for {t} is {v}",
            "we'd rather use {v} for {t}",
            "the team prefers {v} over {alt} for {t}",
            "{v} is preferred for {t}",
        ),
        "heldout": (
            "when it comes to {t}, {v} is the team's favourite",
            "{v} wins for {t} in our book",
            "for {t} we lean on {v}",
            "given the choice, we go with {v} for {t}",
        ),
    },
    "must_not_scope": {
        "default": (
            "we must not {act}",
            "never {act}",
            "do not {act}",
            "nobody may {act}",
            "rule: never {act}",
            "we must never {act}",
        ),
        "heldout": (
            "{ger} is off-limits",
            "under no circumstances should anyone {act}",
            "it's a hard no to {act}",
            "we don't {act}, ever",
        ),
    },
    "must_scope": {
        "default": ("we must always {act}", "always {act}", "every agent must {act}", "rule: always {act}"),
        "heldout": ("{ger} is mandatory", "make sure you {act}, every time", "no exceptions: {act}"),
    },
    "must_not_component": {
        "default": ("{s} must not {act}", "{s} must never {act}", "{s} cannot {act}"),
        "heldout": ("{s} should under no circumstances {act}", "keep {s} from {ger}", "{s} has no business {ger}"),
    },
    "must_component": {
        "default": ("{s} must {act}", "{s} must always {act}"),
        "heldout": ("{s} is required to {act}", "{s} has to {act} at all times"),
    },
    "goal": {
        "default": (
            "our goal for {s} is to {v}",
            "goal for {s}: {v}",
            "{s_bare} goal: {v}",
            "target for {s}: {v}",
            "we aim to {v} on {s}",
            "the objective for {s} is to {v}",
        ),
        "heldout": (
            "what we want from {s}: {v}",
            "success for {s} means we {v}",
            "next milestone for {s} is that we {v}",
        ),
    },
    "purpose": {
        "default": ("to {c}, {act}", "how to {c}: {act}", "runbook: to {c}, {act}", "if you need to {c}, {act}"),
        "heldout": ("{act}; that's how we {c}", "the way to {c} is to {act}", "want to {c}? {act}"),
    },
    "trigger": {
        "default": (
            "when {c}, {act}",
            "if {c}, {act}",
            "whenever {c}, {act}",
            "{act} whenever {c}",
            "{act} when {c}",
            "runbook: if {c}, {act}",
        ),
        "heldout": ("in case {c}, {act}", "as soon as {c}, {act}", "{c}? then {act}"),
    },
    "deadline": {
        "default": (
            "this task is due {d}",
            "deadline for this task: {d}",
            "the deadline of this task is {d}",
            "this task's deadline is {d}",
        ),
        "heldout": ("we need this task wrapped up {d}", "this task has to land {d}", "due date {d}, no slack"),
    },
    "failure": {
        "default": ("{agent} failed {task}: {e}", "{task} failed: {e}"),
        "heldout": ("{task} broke again — {e}", "no luck with {task}; {e}"),
    },
    # "starting tomorrow" and friends: the statement holds from the phrase's day.
    "adverbial": {
        "default": ("{stmt} starting {d}", "{stmt}, as of {d}", "{stmt} from {d} on"),
        "heldout": ("{stmt}, effective {d}", "{stmt} (in force since {d})"),
    },
    # Look like facts, state none.
    "trap": {
        "default": (
            "should we move the {s_bare} {a} to {v}?",
            "maybe {v} would be a better {a} for {s}",
            "the {s_bare} {a} is slow again today",
            "the deploy must have failed overnight",
            "a must-have for the next release: dark mode",
            "I cannot reproduce the flaky test on my machine",
            "when I got in, the build was red",
            "if you have a minute, review my pull request",
            "to be fair, the tests were flaky last week",
            "what is the {a} of {s} again?",
            "I'd prefer a quick call over chat for this",
            "never mind, found it",
            "don't worry about the lint warnings",
            "the goal is clear enough",
            "{agent} is a bit behind on reviews",
            "this is a known issue",
            "{s_pos} {a} migration is done",
            "we could use {v} for the {s_bare} {a}",
            "someone said the {s_bare} {a} might be {v}",
            "is {s_pos} {a} still {v}?",
            "the standup is at 10",
        ),
        "heldout": (
            "I'd rather not touch {s} today",
            "we must be careful with {s}",
            "if only {s} had better docs",
            "the target audience is internal users",
            "goals for the offsite: have fun",
            "no idea what the {a} of {s} is",
            "{agent} cannot make the retro, will read the notes",
            "once the coffee kicks in, I'll look at {s}",
            "{s_bare} {a}, anyone? I keep forgetting",
        ),
    },
}

# Two more wordings of the same facts, neither a benchmark split (the held-out split stays unseen by tuning):
#
# - dev: written after the rules, as agents write (plain forms, indirect ones, chatter with the rules' trigger
#   words). Rule changes are made against it (`bench/calibrate_rules.py --split dev` lists what each rule gets
#   wrong), so the rules' precision on it is biased upward, like the default split's.
#   It is two rounds: a first wording, then a second one that was first written to calibrate and turned out to
#   show the rules cutting values wrong ("X rather than Y", "…, for anyone new", "if ever …"); the rules were
#   fixed against it, so it became dev wording too (`_DEV_ROUND_2`).
# - calibration: written after the dev fixes and never used to change a rule. `bench/calibrate_rules.py`
#   measures each rule's precision on it (seeds of its own) and that sets the rule's confidence
#   (workers.facts.extraction.RULE_CONFIDENCE) and whether the rule runs at all.
DEV_TEMPLATES: dict[str, tuple[str, ...]] = {
    "attribute": (
        "{s_pos} {a} is {v}, per the runbook",
        "the {a} on {s} is {v}",
        "{s} is configured with {v} as the {a}",
        "just confirmed {s_pos} {a} is {v}",
        "{s_bare} {a} is set to {v}",
    ),
    "attribute_change": (
        "{s_pos} {a} is {v} now",
        "changed the {a} of {s} to {v} this morning",
        "{s_bare} {a} moved to {v}",
    ),
    "decision": (
        "we agreed that {s_pos} {a} will be {v}",
        "decision made: {v} for the {a} of {s}",
        "{s} will use {v} for its {a}, decided in the sync",
    ),
    "decision_change": (
        "we decided to switch {s_pos} {a} from {old} to {v}",
        "{v} replaces {old} as the {a} of {s}, agreed",
        "changing course: {s_bare} {a} goes to {v} instead of {old}",
    ),
    "tool": ("we're using {v} for {p}", "{p} happens in {v}", "the tool for {p} is {v}"),
    "tool_change": ("{p} moved from {old} to {v}", "we switched {p} to {v}; {old} is retired"),
    "entity": ("{x} is the name of our {v}", "{x}: {art} {v}", "{x} is {art} {v} we run"),
    "alias": ("{x}, also called {v}", "{v} is what some folks call {x}"),
    "preference": (
        "we like {v} better than {alt} for {t}",
        "our default for {t} is {v}",
        "prefer {v} for {t}",
        "{v} is our pick for {t}",
    ),
    "must_not_scope": ("please never {act}", "we're not allowed to {act}", "{ger} is forbidden"),
    "must_scope": ("we always {act}", "it's required to {act}", "remember: always {act}"),
    "must_not_component": ("{s} is not allowed to {act}", "{s} may not {act}", "{s} can't {act} (policy)"),
    "must_component": ("{s} always needs to {act}", "{s} is expected to {act}"),
    "goal": ("the goal for {s}: {v}", "we're trying to {v} on {s}", "for {s}, the aim is to {v}"),
    "purpose": ("to {c}, you {act}", "if you want to {c}, {act}", "steps to {c}: {act}"),
    "trigger": ("if {c}, then {act}", "whenever {c}, please {act}", "when {c}: {act}"),
    "deadline": ("this task is due {d}, please", "please get this task done {d}", "the due date for this task: {d}"),
    "failure": ("{task} failed again: {e}", "{agent} hit an error on {task}: {e}"),
    "adverbial": ("{stmt} beginning {d}", "{stmt}, starting {d}"),
    "trap": (
        "we prefer to discuss this in the standup",
        "I can't get {s} to start locally",
        "{agent} cannot join today",
        "when the build finishes, I'll ping you",
        "if the tests pass, I'll merge",
        "to be honest, {s} is a mess",
        "the goal of this PR is cleanup",
        "we use a lot of memory in {s} during tests",
        "{s_pos} {a} looks wrong to me, is it {v}?",
        "always happy to help with {s}",
        "never seen {s} this slow",
        "is {s_bare} {a} {v} or not?",
        "we should probably use {v} for {s_pos} {a} at some point",
        "{agent} is the on-call this week",
        "don't forget the retro at 3",
    ),
}
_DEV_ROUND_2: dict[str, tuple[str, ...]] = {
    "attribute": (
        "for the record, {s_pos} {a} is {v}",
        "the current {a} for {s} is {v}",
        "quick note: {s_pos} {a} is {v}",
        "{s_bare} is on {v} for {a}",
        "{s} runs {v} for its {a}",
    ),
    "attribute_change": (
        "{s_pos} {a} has been changed to {v}",
        "we bumped {s_pos} {a} to {v}",
        "{s_bare} {a} is {v} since the last deploy",
    ),
    "decision": (
        "we've decided: {s_pos} {a} is {v}",
        "the call is {v} for {s_pos} {a}",
        "{v} it is for the {a} of {s}",
    ),
    "decision_change": (
        "we're moving {s_pos} {a} off {old} and onto {v}",
        "{s_bare} {a}: {old} is out, {v} is in",
        "decided to go with {v} rather than {old} for {s_pos} {a}",
    ),
    "tool": ("{v} is what we use for {p}", "all our {p} goes through {v}", "we do {p} with {v}"),
    "tool_change": ("we migrated {p} from {old} to {v}", "{p}: {old} out, {v} in"),
    "entity": ("{x} is {art} {v}, for anyone new", "{x} (our {v})", "{x} is basically {art} {v}"),
    "alias": ("{x}, or {v} as some call it", "{x} goes by {v} too"),
    "preference": (
        "the team would rather have {v} than {alt} for {t}",
        "we tend to prefer {v} for {t}",
        "{v} is the preferred choice for {t} here",
        "for {t}, {v} please",
    ),
    "must_not_scope": ("nobody should ever {act}", "we can never {act}", "do NOT {act}"),
    "must_scope": ("everyone has to {act}", "we need to always {act}", "policy: {act}"),
    "must_not_component": ("{s} should never {act}", "{s} must not be allowed to {act}", "{s} is forbidden to {act}"),
    "must_component": ("{s} should always {act}", "{s} needs to {act}, always"),
    "goal": ("the plan for {s} is to {v}", "our objective with {s}: {v}", "for {s} we want to {v}"),
    "purpose": ("need to {c}? {act}", "in order to {c}, {act}", "here's how to {c}: {act}"),
    "trigger": ("once {c}, {act}", "{act} if {c}", "if ever {c}, {act}"),
    "deadline": ("this task needs to be done {d}", "target date for this task: {d}", "we ship this task {d}"),
    "failure": ("{agent}: {task} failed with {e}", "{task} did not complete: {e}"),
    "adverbial": ("{stmt}, valid from {d}", "{stmt} - takes effect {d}"),
    "trap": (
        "the goal was to finish before lunch, didn't happen",
        "if anyone has time, the flaky test needs love",
        "when you get a chance, look at {s}",
        "I can never remember {s_pos} {a}",
        "{agent} must be out today",
        "we used to use {v} for the {s_bare} {a}, I think",
        "to whoever broke the build: thanks",
        "{s} is a pain to deploy",
        "always fun when {s} goes down on a Friday",
        "never again will I touch {s_pos} {a} on a Friday",
        "do we really need {v} for {s_pos} {a}?",
        "the {a} of {s} used to be {v}",
        "{agent} prefers tea",
        "ping me if {s} acts up",
        "{s_bare} {a} discussion moved to Thursday",
    ),
}
CALIBRATION_TEMPLATES: dict[str, tuple[str, ...]] = {
    "attribute": (
        "heads-up that {s_pos} {a} is {v}",
        "{s} has {v} as its {a}",
        "in prod, {s_pos} {a} is {v}",
        "{s_bare}: {a} is {v}",
        "looked it up - {s_pos} {a} is {v}",
    ),
    "attribute_change": (
        "{s_pos} {a} was just changed to {v}",
        "new {a} for {s}: {v}",
        "{s_bare} {a} updated to {v} today",
    ),
    "decision": (
        "after some back and forth, we chose {v} for {s_pos} {a}",
        "ruling: {s_pos} {a} will be {v}",
        "{s_bare} {a} -> {v}, decided",
    ),
    "decision_change": (
        "we agreed to replace {old} with {v} for {s_pos} {a}",
        "swapping {old} for {v} as {s_pos} {a}",
        "no more {old}: {s_pos} {a} will be {v}",
    ),
    "tool": ("{p}? we have {v} for that", "{v} takes care of {p}", "we rely on {v} for {p}"),
    "tool_change": ("{p} now lives in {v} instead of {old}", "we've replaced {old} with {v} for {p}"),
    "entity": ("{x} is {art} {v} owned by our team", "for context, {x} is {art} {v}", "{x} = {art} {v}"),
    "alias": ("{x}, a.k.a. {v}", "{x} (aka {v})"),
    "preference": (
        "we generally go for {v} for {t}",
        "our team prefers {v} when it comes to {t}",
        "{v} over {alt} for {t}, as a rule of thumb",
        "for {t}, {v} is the way we like it",
    ),
    "must_not_scope": ("nobody is allowed to {act}", "under no condition should you {act}", "it is not okay to {act}"),
    "must_scope": ("all of us must {act}", "we are required to {act}", "always, always {act}"),
    "must_not_component": (
        "{s} is never to {act}",
        "{s} should not {act}, ever",
        "{s} must under no circumstances {act}",
    ),
    "must_component": ("{s} is required to always {act}", "{s} has to {act}"),
    "goal": ("{s_bare} objective: {v}", "the aim for {s} is to {v}", "we want {s} to {v}"),
    "purpose": ("to {c}: {act}", "the trick to {c} is to {act}", "how do you {c}? {act}"),
    "trigger": ("after {c}, {act}", "each time {c}, {act}", "{act} as soon as {c}"),
    "deadline": ("this task must be finished {d}", "ETA for this task: {d}", "this task is due no later than {d}"),
    "failure": ("{task} errored out: {e}", "{agent} reports {task} failed, cause: {e}"),
    "adverbial": ("{stmt} (from {d})", "{stmt}; effective from {d}"),
    "trap": (
        "we chose the wrong day for the offsite",
        "is there a goal for the hackathon?",
        "the team prefers not to be paged for this",
        "{agent} has to leave early today",
        "after lunch I'll pair with {agent}",
        "if {s} goes down again, I'm going to cry",
        "{s_pos} {a} was a hot topic in the retro",
        "we rely on coffee for standups",
        "the aim of the exercise was to learn",
        "for context, the outage lasted 10 minutes",
        "{agent} = on vacation until Monday",
        "how do you even debug {s}?",
        "new {a} for {s}? let's discuss",
        "{s_bare} {a} -> needs review",
        "all of us must be tired of {s} by now",
    ),
}
for _family in TEMPLATES:
    DEV_TEMPLATES[_family] += _DEV_ROUND_2[_family]
    TEMPLATES[_family]["dev"] = DEV_TEMPLATES[_family]
    TEMPLATES[_family]["calibration"] = CALIBRATION_TEMPLATES[_family]

# Date phrases for deadlines and goals (value dates) and for adverbials (valid_from).
VALUE_DATE_PHRASES = ("tomorrow", "next Friday", "in 3 days", "next week", "in two weeks", "next Monday")
ADVERBIAL_DATE_PHRASES = ("today", "yesterday", "tomorrow", "next Monday", "last Monday", "2 days ago")
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
NUMBER_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}


# -- the gold ------------------------------------------------------------------------


@dataclass(frozen=True)
class GoldFact:
    """A planted fact: what an extractor should find, and in which minutes it is stated."""

    key: str  # unique in the session, e.g. "atlas/017"
    type: str
    project_id: str
    task_id: str | None  # set for task-tier facts
    subject: str
    attribute: str
    value: str
    single_valued: bool
    valid_from: str  # ISO 8601 UTC: the earliest statement's valid_from
    minute_ids: tuple[str, ...]  # the minutes that state it, in time order
    statement_valid_from: tuple[str, ...]  # each statement's own valid_from, parallel to minute_ids
    replaces: str | None = None  # key of the fact this one changes (same slot, earlier value)

    @property
    def tier(self) -> str:
        return "task" if self.task_id else "project"

    @property
    def tier_key(self) -> tuple[str, ...]:
        return (self.project_id, self.task_id) if self.task_id else (self.project_id,)

    @property
    def slot(self) -> tuple[str, str]:
        return (self.subject, self.attribute)


SlotKey = tuple[tuple[str, ...], str, str]  # tier key, subject, attribute


@dataclass
class FactSession:
    """Minutes in time order across projects, the facts planted in them, and what holds at the end."""

    minutes: list[Minute]
    facts: list[GoldFact]
    split: str
    seed: int
    lookalikes: list[tuple[str, str]] = field(default_factory=list)  # keys of facts in different slots that look alike

    def current_view(self) -> dict[SlotKey, frozenset[str]]:
        """The values each slot holds after the session: the newest (by valid_from) for a single-valued slot, all
        values of a multi-valued one. Values are `value_key`s."""
        by_slot: dict[SlotKey, list[GoldFact]] = {}
        for fact in self.facts:
            by_slot.setdefault((fact.tier_key, fact.subject, fact.attribute), []).append(fact)
        view: dict[SlotKey, frozenset[str]] = {}
        for slot, facts in by_slot.items():
            if facts[0].single_valued:
                newest = max(enumerate(facts), key=lambda pair: (pair[1].valid_from, pair[0]))[1]
                view[slot] = frozenset({value_key(newest.value)})
            else:
                view[slot] = frozenset(value_key(f.value) for f in facts)
        return view

    @property
    def restated(self) -> list[GoldFact]:
        """Facts stated in more than one minute (the ones dedupe must merge)."""
        return [f for f in self.facts if len(f.minute_ids) > 1]


# -- planting ------------------------------------------------------------------------


@dataclass
class _Plan:
    """A fact before it is phrased: its gold label, and how to phrase it."""

    key: str
    type: str
    family: str  # the template family
    project_id: str
    task_id: str | None
    subject: str
    attribute: str
    value: str
    single_valued: bool
    fields: dict[str, Any]  # template fields other than those computed per statement
    surfaces: tuple[str, ...] = ()  # ways to write the value (attributes)
    statements: int = 1
    replaces: str | None = None
    value_date: str | None = None  # the value is this date's phrase (deadlines) or holds it (goals: {d})
    structured_ok: bool = True


@dataclass
class _Statement:
    """One minute that states a planted fact (or, with plan None, states nothing)."""

    plan: _Plan | None


def _a_or_an(text: str) -> str:
    return "an" if text[:1].lower() in "aeiou" else "a"


class _Planter:
    """Plans one project's facts; `plans` are grouped in threads whose order must hold (a slot's values)."""

    def __init__(self, project_id: str, rng: random.Random, number: int) -> None:
        self.project_id = project_id
        self.rng = rng
        self.number = number
        self.threads: list[list[_Plan]] = []
        self._count = 0
        self.tasks = [f"{rng.choice(('launch', 'refactor', 'audit', 'cleanup'))}-{number * 10 + i}" for i in range(2)]

    def _key(self) -> str:
        self._count += 1
        return f"{self.project_id}/{self._count:03d}"

    def _statements(self) -> int:
        return self.rng.choices((1, 2, 3), weights=(4, 4, 2))[0]

    def _values_over_time(self) -> int:
        return self.rng.choices((1, 2, 3), weights=(45, 40, 15))[0]

    def plan_all(self) -> None:
        rng = self.rng
        subjects = rng.sample(SUBJECTS, 8)
        by_name = {a.name: a for a in ATTRIBUTES}
        # Look-alike pairs first: the same component, two attributes that read alike.
        pairs = rng.sample(LOOKALIKE_ATTRIBUTES, 2)
        slots: list[tuple[str, Attribute]] = []
        for (first, second), subject in zip(pairs, subjects[:2], strict=True):
            slots += [(subject, by_name[first]), (subject, by_name[second])]
        for subject in subjects[2:]:
            for attribute in rng.sample(ATTRIBUTES, 2):
                if (subject, attribute) not in slots:
                    slots.append((subject, attribute))
        # The same attribute on the look-alike component (billing service / billing worker).
        twin = SUBJECTS[SUBJECTS.index(subjects[0]) ^ 1]
        slots.append((twin, by_name[pairs[0][0]]))
        for i, (subject, attribute) in enumerate(slots):
            task = self.tasks[i % 2] if i % 6 == 5 else None  # a share of the attribute slots belongs to a task
            self._attribute_thread(subject, attribute, task)
        for purpose, tools in rng.sample(TOOLS, 3):
            self._tool_thread(purpose, tools)
        for name, kind, alias in rng.sample(NAMED, 4):
            self._single("entity", "entity", name.lower(), "kind", kind, {"x": name, "art": _a_or_an(kind)})
            if alias and rng.random() < 0.6:
                self._single("entity", "alias", name.lower(), "alias", alias, {"x": name}, single_valued=False)
        for topic, options in rng.sample(PREFERENCES, 3):
            self._preference_thread(topic, options)
        self._constraints(subjects)
        for subject in rng.sample(subjects, 2):
            self._goal_thread(subject)
        for condition, actions in rng.sample(PURPOSE_PROCEDURES, 2):
            self._procedure_thread("purpose", condition, actions)
        for condition, actions in rng.sample(TRIGGER_PROCEDURES, 2):
            self._procedure_thread("trigger", condition, actions)
        for kind in rng.sample(FAILURE_KINDS, 2):
            cause = rng.choice(FAILURE_CAUSES)
            self._single("fact", "failure", kind, "failure_cause", cause, {"kind": kind}, single_valued=False)
        for task in self.tasks:
            self._deadline_thread(task)

    def _single(
        self,
        type_: str,
        family: str,
        subject: str,
        attribute: str,
        value: str,
        fields: dict[str, Any],
        single_valued: bool = True,
        task_id: str | None = None,
    ) -> _Plan:
        plan = _Plan(
            self._key(),
            type_,
            family,
            self.project_id,
            task_id,
            subject,
            attribute,
            value,
            single_valued,
            fields,
            statements=self._statements(),
        )
        self.threads.append([plan])
        return plan

    def _attribute_thread(self, subject: str, attribute: Attribute, task_id: str | None) -> None:
        # An attribute that holds a collection (owner) gains values rather than changing: one here.
        changes = single_valued("fact", attribute.name)
        count = self._values_over_time() if changes else 1
        values = self.rng.sample(attribute.values, min(count, len(attribute.values)))
        thread: list[_Plan] = []
        for i, forms in enumerate(values):
            previous = thread[-1] if thread else None
            if previous is None:
                type_, family = "fact", "attribute"
            elif self.rng.random() < 0.7:
                type_, family = "decision", self.rng.choice(("decision", "decision_change", "decision_change"))
            else:
                type_, family = "fact", "attribute_change"
            thread.append(
                _Plan(
                    self._key(),
                    type_,
                    family,
                    self.project_id,
                    task_id,
                    subject,
                    attribute.name,
                    forms[0],
                    changes,
                    {"s_bare": subject, "surfaces_a": attribute.surfaces, "old": values[i - 1][0] if i else None},
                    surfaces=forms,
                    statements=self._statements(),
                    replaces=previous.key if previous else None,
                )
            )
        self.threads.append(thread)

    def _tool_thread(self, purpose: str, tools: tuple[str, ...]) -> None:
        chosen = self.rng.sample(tools, min(self._values_over_time(), len(tools)))
        thread: list[_Plan] = []
        for i, tool in enumerate(chosen):
            change = i > 0
            # A switch ("moving X from A to B") is a decision; a new value stated plainly is a fact.
            type_ = "decision" if change and self.rng.random() < 0.6 else "fact"
            thread.append(
                _Plan(
                    self._key(),
                    type_,
                    "tool_change" if type_ == "decision" else "tool",
                    self.project_id,
                    None,
                    purpose,
                    "tool",
                    tool,
                    True,
                    {"p": purpose, "old": chosen[i - 1] if change else None},
                    statements=self._statements(),
                    replaces=thread[-1].key if thread else None,
                )
            )
        self.threads.append(thread)

    def _preference_thread(self, topic: str, options: tuple[str, ...]) -> None:
        count = self.rng.choices((1, 2), weights=(7, 3))[0]
        chosen = self.rng.sample(options, min(count, len(options)))
        thread: list[_Plan] = []
        for option in chosen:
            alternatives = [o for o in options if o != option]
            thread.append(
                _Plan(
                    self._key(),
                    "preference",
                    "preference",
                    self.project_id,
                    None,
                    topic.lower(),
                    "preference",
                    option,
                    True,
                    {"t": topic, "alt": self.rng.choice(alternatives)},
                    statements=self._statements(),
                    replaces=thread[-1].key if thread else None,
                )
            )
        self.threads.append(thread)

    def _constraints(self, subjects: Sequence[str]) -> None:
        rng = self.rng
        for family, pool, subject in (
            ("must_not_scope", MUST_NOT_SCOPE, None),
            ("must_not_scope", MUST_NOT_SCOPE, None),
            ("must_scope", MUST_SCOPE, None),
            ("must_not_component", MUST_NOT_COMPONENT, rng.choice(subjects)),
            ("must_component", MUST_COMPONENT, rng.choice(subjects)),
        ):
            act, ger = rng.choice(pool)
            attribute = "must_not" if family.startswith("must_not") else "must"
            plan = _Plan(
                self._key(),
                "constraint",
                family,
                self.project_id,
                None,
                subject or "scope",
                attribute,
                act,
                False,
                {"act": act, "ger": ger, "s_bare": subject},
                statements=self._statements(),
            )
            if any(p.value == act and p.subject == plan.subject for t in self.threads for p in t):
                continue
            self.threads.append([plan])

    def _goal_thread(self, subject: str) -> None:
        """One or two goals of a component; a later goal adds to the earlier one (goals hold many values)."""
        count = self.rng.choices((1, 2), weights=(6, 4))[0]
        thread: list[_Plan] = []
        for goal in self.rng.sample(GOALS, count):
            thread.append(
                _Plan(
                    self._key(),
                    "goal",
                    "goal",
                    self.project_id,
                    None,
                    subject,
                    "goal",
                    goal,
                    False,
                    {"s_bare": subject},
                    statements=self._statements(),
                    value_date="{d}" if "{d}" in goal else None,
                )
            )
        self.threads.append(thread)

    def _procedure_thread(self, family: str, condition: str, actions: tuple[str, ...]) -> None:
        count = self.rng.choices((1, 2), weights=(7, 3))[0]
        thread: list[_Plan] = []
        for action in self.rng.sample(actions, min(count, len(actions))):
            thread.append(
                _Plan(
                    self._key(),
                    "procedure",
                    family,
                    self.project_id,
                    None,
                    _condition_subject(condition),
                    "action",
                    action,
                    True,
                    {"c": condition, "act": action},
                    statements=self._statements(),
                    replaces=thread[-1].key if thread else None,
                )
            )
        self.threads.append(thread)

    def _deadline_thread(self, task: str) -> None:
        count = self.rng.choices((1, 2), weights=(6, 4))[0]
        thread: list[_Plan] = []
        for _ in range(count):
            thread.append(
                _Plan(
                    self._key(),
                    "fact",
                    "deadline",
                    self.project_id,
                    task,
                    "task",
                    "deadline",
                    "",  # the date: set when the first statement is dated
                    True,
                    {},
                    statements=self._statements(),
                    replaces=thread[-1].key if thread else None,
                    value_date="",
                )
            )
        self.threads.append(thread)


def _condition_subject(condition: str) -> str:
    """The gold subject of a procedure: its condition in lower case, without a leading article."""
    words = condition.lower().split()
    return " ".join(words[1:] if words[0] in ("the", "a", "an") else words)


# -- dates (the gold's own implementation of docs/extraction.md's table) ----------------


def _day(at: datetime) -> date:
    return at.astimezone(UTC).date()


def _phrase_day(phrase: str, at: datetime) -> date:
    """The day a date phrase names, said at `at`."""
    today = _day(at)
    words = phrase.lower().split()
    if phrase.lower() == "today":
        return today
    if phrase.lower() == "yesterday":
        return today - timedelta(days=1)
    if phrase.lower() == "tomorrow":
        return today + timedelta(days=1)
    if words[0] == "in" and words[-1] in ("days", "weeks"):
        n = int(words[1]) if words[1].isdigit() else NUMBER_WORDS[words[1]]
        return today + timedelta(days=n * (7 if words[-1] == "weeks" else 1))
    if words[-1] == "ago":
        n = int(words[0]) if words[0].isdigit() else NUMBER_WORDS[words[0]]
        return today - timedelta(days=n * (7 if words[1] == "weeks" else 1))
    if words == ["next", "week"]:
        return today - timedelta(days=today.weekday()) + timedelta(days=7)
    if words[0] in ("next", "last") and words[1] in WEEKDAYS:
        target = WEEKDAYS.index(words[1])
        if words[0] == "next":
            return today + timedelta(days=(target - today.weekday() - 1) % 7 + 1)
        return today - timedelta(days=(today.weekday() - target - 1) % 7 + 1)
    raise ValueError(f"no day for {phrase!r}")


def _phrase_for(day: date, at: datetime, rng: random.Random) -> str:
    """A phrase that names `day` when said at `at`: a relative one when one fits, else the ISO date."""
    today = _day(at)
    options = [p for p in VALUE_DATE_PHRASES if _phrase_day(p, at) == day]
    delta = (day - today).days
    if delta == 0:
        options.append("today")
    if 2 <= delta <= 9:
        options.append(f"in {delta} days")
    return rng.choice(options) if options else day.isoformat()


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _day_start(day: date) -> str:
    return _iso(datetime(day.year, day.month, day.day, tzinfo=UTC))


_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def _minute_id(at: datetime, rng: random.Random) -> str:
    """A ULID-shaped id like `contracts.ids.new_minute_id` makes, from the seeded generator (reproducible)."""
    value = (int(at.timestamp() * 1000) << 80) | rng.getrandbits(80)
    return "".join(_CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))


# -- phrasing ------------------------------------------------------------------------


def _capitalized(text: str, rng: random.Random) -> str:
    return text[:1].upper() + text[1:] if rng.random() < 0.5 else text


class _Phraser:
    """Turns statements into minutes: picks the template, the event type and the data."""

    def __init__(self, split: str, rng: random.Random) -> None:
        self.split = split
        self.rng = rng
        self.first_day: dict[str, date] = {}  # plan key -> the date its value names (deadlines, dated goals)

    def templates(self, family: str) -> tuple[str, ...]:
        return TEMPLATES[family][self.split]

    def minute(
        self, project_id: str, statement: _Statement, at: datetime, tasks: Sequence[str]
    ) -> tuple[Minute, str | None]:
        """The minute for a statement, and the statement's gold valid_from (None for filler)."""
        rng = self.rng
        agent = rng.choice(AGENTS)
        if statement.plan is None:
            note, data = self._filler(agent, tasks)
            return self._make(project_id, "message", agent, note, data, at, "project"), None
        plan = statement.plan
        valid_from = _iso(at)
        fields = self._fields(plan, at)
        if plan.family == "failure":
            task = f"{plan.subject}-{rng.randint(100, 999)}"
            note = rng.choice(self.templates("failure")).format(agent=agent, task=task, e=plan.value)
            data = {
                "task_id": task,
                "task_kind": plan.subject,
                "error": plan.value,
                "success_criteria_met": rng.randint(0, 30),
            }
            return self._make(project_id, "task_failed", agent, note, data, at, "project"), valid_from
        templates = self._families(plan)
        plain = templates is not self.templates(plan.family)
        event = self._event(plan, plain)
        data: dict[str, Any] = {}
        if plan.task_id:
            data["task_id"] = plan.task_id
        elif rng.random() < 0.3:
            data["task_id"] = rng.choice(tasks)  # a project fact said while working on a task
        if plan.structured_ok and rng.random() < STRUCTURED_SHARE:
            data.update(self._structured(plan, fields, event))
            note = rng.choice(("noted", "recorded for the team", "updated the notes", "see data"))
        else:
            text = rng.choice(templates).format(**fields)
            if plan.family in ("attribute", "attribute_change", "decision", "decision_change") and (
                rng.random() < ADVERBIAL_SHARE
            ):
                phrase = rng.choice(ADVERBIAL_DATE_PHRASES)
                text = rng.choice(self.templates("adverbial")).format(stmt=text, d=phrase)
                valid_from = _day_start(_phrase_day(phrase, at))
            note = _capitalized(text, rng)
            if event == "task_failed":
                note = f"{rng.choice(tasks)} failed. Lesson learned: {text}"
            if event == "conflict_resolved":
                data["conflict_type"] = rng.choice(CONFLICT_TYPES)
                data["resolution"] = text
                about = fields.get("s") or fields.get("p") or "the plan"
                note = f"the {data['conflict_type']} conflict over {about} is resolved"
        scope = "task" if plan.task_id else "project"
        return self._make(project_id, event, agent, note, data, at, scope), valid_from

    def _make(
        self, project_id: str, event: str, agent: str, note: str, data: dict[str, Any], at: datetime, scope: str
    ) -> Minute:
        return Minute(
            project_id=project_id,
            event_type=event,
            id=_minute_id(at, self.rng),
            timestamp=_iso(at),
            agent_id=agent,
            data=data,
            memory_note=note,
            thread_id=data.get("task_id"),
            scope=scope,
        )

    def _families(self, plan: _Plan) -> tuple[str, ...]:
        templates = self.templates(plan.family)
        if plan.type == "decision" and plan.family in ("decision", "decision_change") and self.rng.random() < 0.2:
            return self.templates("attribute")  # a plain statement in a decision minute is a decision
        return templates

    def _event(self, plan: _Plan, plain: bool) -> str:
        """The minute's event type; a decision phrased as a plain statement is one by its minute alone."""
        rng = self.rng
        if plan.type == "decision":
            weights = (6, 3, 0) if plain else (6, 3, 1)
            return rng.choices(("decision", "conflict_resolved", "message"), weights=weights)[0]
        if plan.type == "constraint":
            return rng.choices(("knowledge", "message", "task_failed"), weights=(4, 4, 2))[0]
        if plan.type == "goal":
            return rng.choices(("message", "task_assigned", "knowledge"), weights=(2, 1, 1))[0]
        if plan.type == "preference":
            return rng.choices(("message", "knowledge"), weights=(3, 1))[0]
        if plan.family == "deadline":
            return rng.choices(("task_assigned", "message"), weights=(2, 3))[0]
        return rng.choice(("knowledge", "message"))

    def _fields(self, plan: _Plan, at: datetime) -> dict[str, Any]:
        rng = self.rng
        fields = dict(plan.fields)
        subject = fields.get("s_bare")
        if subject:
            fields["s"] = f"the {subject}"
            fields["s_pos"] = f"the {subject}'s"
        if "surfaces_a" in fields:
            fields["a"] = rng.choice(fields.pop("surfaces_a"))
        if plan.surfaces:
            fields["v"] = rng.choice(plan.surfaces)
        else:
            fields.setdefault("v", plan.value)
        if plan.value_date is not None:
            day = self.first_day.get(plan.key)
            if day is None:
                previous = self.first_day.get(plan.replaces or "")
                options = [d for p in VALUE_DATE_PHRASES if (d := _phrase_day(p, at)) != previous]
                day = self.first_day[plan.key] = rng.choice(options)  # a moved deadline moves
            phrase = _phrase_for(day, at, rng)
            if plan.family == "deadline":
                fields["d"] = phrase
            else:
                fields["v"] = plan.value.format(d=phrase)
        return fields

    def _structured(self, plan: _Plan, fields: Mapping[str, Any], event: str) -> dict[str, Any]:
        """The fact in the data convention (docs/extraction.md), in the surface words a producer would use."""
        rng = self.rng
        if plan.type == "procedure":
            body: dict[str, Any] = {"condition": fields["c"], "action": fields["act"]}
        else:
            subject = {"scope": "everyone", "task": "this task"}.get(plan.subject, plan.subject)
            if plan.family in ("entity", "alias"):
                subject = fields["x"]
            attribute = fields.get("a", plan.attribute.replace("_", " "))
            value = fields.get("v", plan.value) if plan.family not in ("deadline",) else fields["d"]
            if plan.type == "constraint":
                value = plan.value
            body = {"subject": subject if rng.random() < 0.5 else subject.title(), "attribute": attribute}
            body["value"] = value
        default_type = "decision" if event in ("decision", "conflict_resolved") else "fact"
        key = "fact"
        if plan.type != default_type or rng.random() < 0.3:
            if rng.random() < 0.5 and plan.type != "fact":
                key = plan.type  # the shortcut: {"decision": {...}}
            else:
                body["type"] = plan.type
        return {key: body}

    def _filler(self, agent: str, tasks: Sequence[str]) -> tuple[str, dict[str, Any]]:
        rng = self.rng
        other = rng.choice([a for a in AGENTS if a != agent])
        data: dict[str, Any] = {"task_id": rng.choice(tasks)} if rng.random() < 0.3 else {}
        if rng.random() < 0.5:
            return rng.choice(CHATTER).format(agent=agent, other=other, e=rng.choice(ENTITIES)[0]), data
        subject = rng.choice(SUBJECTS)
        attribute = rng.choice(ATTRIBUTES)
        text = rng.choice(self.templates("trap")).format(
            s=f"the {subject}",
            s_pos=f"the {subject}'s",
            s_bare=subject,
            a=rng.choice(attribute.surfaces),
            v=rng.choice(attribute.values)[0],
            agent=other,
        )
        return _capitalized(text, rng), data


# -- the session ---------------------------------------------------------------------


def fact_session(split: str = "default", seed: int = 11, projects: int = 6) -> FactSession:
    """A labeled session: `projects` projects' minutes, time-ordered, with the facts planted in them.

    The facts planted depend on `seed` and `projects` only: both splits plant the
    same facts and differ in their wording (and so in their minutes).
    """
    if split not in WORDINGS:
        raise ValueError(f"split {split!r} must be one of {', '.join(WORDINGS)}")
    names = ("atlas", "borealis", "cygnus", "draco", "eridanus", "fornax", "gemini", "hydra", "indus", "lyra")
    if not 1 <= projects <= len(names):
        raise ValueError(f"projects must be 1..{len(names)}, got {projects}")
    planters = []
    for number, name in enumerate(names[:projects], start=1):
        planter = _Planter(name, random.Random(f"{seed}:{name}:plan"), number)
        planter.plan_all()
        planters.append(planter)
    rng = random.Random(f"{seed}:{split}:phrase")
    phraser = _Phraser(split, rng)
    minutes: list[Minute] = []
    stated: dict[str, list[tuple[str, str]]] = {}  # plan key -> (minute id, valid_from)
    plans: dict[str, _Plan] = {}
    for offset, planter in enumerate(planters):
        at = START + timedelta(minutes=7 * offset)
        for statement in _weave(planter.threads, rng):
            at += timedelta(minutes=rng.randint(*STEP_MINUTES), seconds=rng.randint(0, 59))
            minute, valid_from = phraser.minute(planter.project_id, statement, at, planter.tasks)
            minutes.append(minute)
            if statement.plan is not None and valid_from is not None:
                plans[statement.plan.key] = statement.plan
                stated.setdefault(statement.plan.key, []).append((minute.id, valid_from))
    minutes.sort(key=lambda m: (m.timestamp, m.id))
    facts = []
    for key, statements in stated.items():
        plan = plans[key]
        value = plan.value
        if plan.value_date is not None:
            day = phraser.first_day[key].isoformat()
            value = day if plan.family == "deadline" else plan.value.format(d=day)
        facts.append(
            GoldFact(
                key=key,
                type=plan.type,
                project_id=plan.project_id,
                task_id=plan.task_id,
                subject=plan.subject,
                attribute=plan.attribute,
                value=value,
                single_valued=plan.single_valued,
                valid_from=min(v for _, v in statements),
                minute_ids=tuple(i for i, _ in statements),
                statement_valid_from=tuple(v for _, v in statements),
                replaces=plan.replaces,
            )
        )
    facts.sort(key=lambda f: f.key)
    assert all(f.single_valued == single_valued(f.type, f.attribute) for f in facts), "gold and extractor disagree"
    return FactSession(minutes, facts, split, seed, _lookalikes(facts))


def _weave(threads: Sequence[Sequence[_Plan]], rng: random.Random) -> Iterable[_Statement]:
    """The statements of all threads, interleaved at random with filler; each thread's order holds."""
    queues = [[_Statement(plan) for plan in thread for _ in range(plan.statements)] for thread in threads]
    queues = [q for q in queues if q]
    while queues:
        if rng.random() < FILLER_SHARE:
            yield _Statement(None)
            continue
        queue = rng.choice(queues)
        yield queue.pop(0)
        if not queue:
            queues.remove(queue)


def _lookalikes(facts: Sequence[GoldFact]) -> list[tuple[str, str]]:
    """Pairs of facts of one tier key in different slots that share a subject or an attribute."""
    pairs = []
    by_key: dict[tuple[str, ...], list[GoldFact]] = {}
    for fact in facts:
        by_key.setdefault(fact.tier_key, []).append(fact)
    for group in by_key.values():
        for i, a in enumerate(group):
            for b in group[i + 1 :]:
                if a.slot == b.slot or a.type not in ("fact", "decision") or b.type not in ("fact", "decision"):
                    continue
                if a.subject == b.subject or (a.attribute == b.attribute and a.attribute != "tool"):
                    pairs.append((a.key, b.key))
    return pairs


# -- scoring -------------------------------------------------------------------------


def score(candidates: Sequence[Candidate], gold: Sequence[GoldFact]) -> dict[str, Any]:
    """Precision, recall and type accuracy of an extractor's candidates against the planted facts.

    A candidate matches a planted fact when it comes from a minute that states
    the fact and has its type, slot and value (compared as `value_key`s).
    precision: matching candidates / candidates; recall: facts matched by at
    least one candidate / facts; statement_recall: (fact, stating minute) pairs
    matched / pairs; type_accuracy: of the candidates whose slot and value match
    a fact stated in their minute, the share with its type; tier_accuracy and
    valid_from_accuracy: of the matching candidates, the share with the fact's
    tier (and task) and with the statement's valid_from. by_type gives precision
    and recall per gold type; precision_at gives precision and recall when only
    candidates of at least that confidence count (the promote threshold's curve).
    """
    said = sum(1 for c in candidates if c.attribute == STATEMENT)
    # What a speaker said of themselves (`workers.rules.statements`) is kept as said, not as a typed fact: it is
    # counted apart ("said") and not scored against the planted facts.
    candidates = [c for c in candidates if c.attribute != STATEMENT]
    stated_in: dict[str, list[tuple[GoldFact, str]]] = {}
    for fact in gold:
        for minute_id, valid_from in zip(fact.minute_ids, fact.statement_valid_from, strict=True):
            stated_in.setdefault(minute_id, []).append((fact, valid_from))
    matched_facts: set[str] = set()
    matched_statements: set[tuple[str, str]] = set()
    located = typed = tiered = dated = 0
    hits: list[tuple[Candidate, GoldFact | None]] = []
    for candidate in candidates:
        found: tuple[GoldFact, str, str] | None = None
        slot_and_value: GoldFact | None = None
        for minute_id in candidate.source_minute_ids:
            for fact, valid_from in stated_in.get(minute_id, ()):
                if fact.slot != candidate.slot or value_key(fact.value) != value_key(candidate.value):
                    continue
                slot_and_value = slot_and_value or fact
                if fact.type == candidate.type and found is None:
                    found = (fact, minute_id, valid_from)
        if slot_and_value is not None:
            located += 1
            typed += found is not None
        if found is None:
            hits.append((candidate, None))
            continue
        fact, minute_id, valid_from = found
        hits.append((candidate, fact))
        matched_facts.add(fact.key)
        matched_statements.add((fact.key, minute_id))
        tiered += candidate.tier == fact.tier and candidate.task_id == fact.task_id
        dated += _same_instant(candidate.valid_from, valid_from)
    true = sum(1 for _, fact in hits if fact is not None)
    statements = sum(len(f.minute_ids) for f in gold)
    out: dict[str, Any] = {
        "candidates": len(candidates),
        "said": said,
        "facts": len(gold),
        "statements": statements,
        "precision": _ratio(true, len(candidates)),
        "recall": _ratio(len(matched_facts), len(gold)),
        "statement_recall": _ratio(len(matched_statements), statements),
        "type_accuracy": _ratio(typed, located),
        "tier_accuracy": _ratio(tiered, true),
        "valid_from_accuracy": _ratio(dated, true),
    }
    by_type: dict[str, dict[str, float]] = {}
    for type_ in FACT_TYPES:
        of_type = [f for f in gold if f.type == type_]
        emitted = [c for c, _ in hits if c.type == type_]
        right = [c for c, f in hits if c.type == type_ and f is not None]
        by_type[type_] = {
            "facts": len(of_type),
            "candidates": len(emitted),
            "precision": _ratio(len(right), len(emitted)),
            "recall": _ratio(sum(1 for f in of_type if f.key in matched_facts), len(of_type)),
        }
    out["by_type"] = by_type
    curve = {}
    for threshold in (0.5, 0.6, 0.7, 0.8, 0.9):
        kept = [(c, f) for c, f in hits if c.confidence >= threshold]
        found_keys = {f.key for _, f in kept if f is not None}
        curve[f"{threshold:.1f}"] = {
            "precision": _ratio(sum(1 for _, f in kept if f is not None), len(kept)),
            "recall": _ratio(len(found_keys), len(gold)),
        }
    out["precision_at"] = curve
    return out


def _ratio(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else 0.0


def _same_instant(a: str, b: str) -> bool:
    return datetime.fromisoformat(a) == datetime.fromisoformat(b)


def summary(session: FactSession) -> dict[str, Any]:
    """What a session holds (for a benchmark's report)."""
    types: dict[str, int] = {}
    for fact in session.facts:
        types[fact.type] = types.get(fact.type, 0) + 1
    slots = {(f.tier_key, f.slot) for f in session.facts}
    return {
        "split": session.split,
        "seed": session.seed,
        "minutes": len(session.minutes),
        "projects": len({m.project_id for m in session.minutes}),
        "facts": len(session.facts),
        "facts_by_type": dict(sorted(types.items())),
        "slots": len(slots),
        "changed_slots": sum(1 for f in session.facts if f.replaces),
        "restated_facts": len(session.restated),
        "task_tier_facts": sum(1 for f in session.facts if f.task_id),
        "lookalike_pairs": len(session.lookalikes),
        "filler_minutes": len(session.minutes) - len({i for f in session.facts for i in f.minute_ids}),
    }
