"""Every Redis key, stream, group and queue name PVM uses, in one place.

Stream keys carry a ``{s<N>}`` hash tag so each shard's stream and dead-letter
stream share a Redis Cluster slot; per-project cache keys carry ``{p:<project>}``
so a project's caches can be updated by one script. Facts of the global tier
carry ``{g}``.
"""

from __future__ import annotations

import zlib

from contracts.facts import FactType, Slot, Tier, TierKey

PREFIX = "pvm"

# Consumer group every dispatcher joins on every shard stream.
DISPATCH_GROUP = "pvm-dispatch"

# Stream entry field holding the msgpack-encoded minute.
MINUTE_FIELD = b"m"

# RQ queues, one per pool. Later pools add theirs here.
LOG_QUEUE = "pvm-log"
FACTS_QUEUE = "pvm-facts"
SUMMARIZE_QUEUE = "pvm-summarize"
QUEUES = {
    "log": LOG_QUEUE,
    "index": "pvm-index",
    "facts": FACTS_QUEUE,
    "summarize": SUMMARIZE_QUEUE,
}


def shard_of(project_id: str, shards: int) -> int:
    """Stable shard number for a project: CRC-32 of its UTF-8 bytes modulo the shard count."""
    return zlib.crc32(project_id.encode("utf-8")) % shards


def stream(shard: int) -> str:
    """The minutes stream of one shard."""
    return f"{PREFIX}:{{s{shard}}}:minutes"


def dead_letter_stream(shard: int) -> str:
    """Entries of one shard that could not be processed, with the reason and original bytes."""
    return f"{PREFIX}:{{s{shard}}}:dead"


def recent_window(project_id: str) -> str:
    """Sorted set of the newest minute ids of a project, scored by log sequence."""
    return f"{PREFIX}:{{p:{project_id}}}:recent"


def agent_recent_window(project_id: str, agent_id: str) -> str:
    """Sorted set of the newest minute ids of one agent in a project."""
    return f"{PREFIX}:{{p:{project_id}}}:agent:{agent_id}:recent"


def minute_by_id(project_id: str) -> str:
    """Hash minute id -> msgpack minute, bounded in size by `minute_by_id_order`."""
    return f"{PREFIX}:{{p:{project_id}}}:byid"


def minute_by_id_order(project_id: str) -> str:
    """Sorted set of the ids held in `minute_by_id`, scored by log sequence, for trimming."""
    return f"{PREFIX}:{{p:{project_id}}}:byid:order"


def log_head(project_id: str) -> str:
    """Hash of the newest durable minute of a project: its id, sequence and durable time.

    Contiguous by construction: the log assigns a project's sequence numbers under its ``flock`` and fsyncs
    them before the lock is released, so every seq at or below any head ever written is durable.
    """
    return f"{PREFIX}:{{p:{project_id}}}:log:head"


def index_head(project_id: str) -> str:
    """Hash of how far a project's vector index has caught up with its log: a contiguous watermark.

    ``seq``: every log seq at or below it is indexed; ``indexed_at``: when ``seq`` last moved;
    ``max_seq``: the newest seq indexed; ``gaps``: seqs below ``max_seq`` not indexed yet. Kept with
    `index_done` by the index pool.
    """
    return f"{PREFIX}:{{p:{project_id}}}:index:head"


def agents(project_id: str) -> str:
    """Set of the agent ids that have an agent memory in a project."""
    return f"{PREFIX}:{{p:{project_id}}}:agents"


def agent_memory(project_id: str, agent_id: str) -> str:
    """Hash of one agent's track record in a project: task counts, success sum and count, last active."""
    return f"{PREFIX}:{{p:{project_id}}}:agent:{agent_id}:memory"


def agent_capabilities(project_id: str, agent_id: str) -> str:
    """Set of the capabilities one agent has shown in a project."""
    return f"{PREFIX}:{{p:{project_id}}}:agent:{agent_id}:capabilities"


def agent_memory_counted(project_id: str) -> str:
    """Bitmap over a project's log sequence: bit n is set once minute n has been counted into agent memory."""
    return f"{PREFIX}:{{p:{project_id}}}:agents:counted"


def access_counts(project_id: str) -> str:
    """Hash minute id -> how often a reader returned it (feeds relevance scoring)."""
    return f"{PREFIX}:{{p:{project_id}}}:access"


def projects() -> str:
    """Set of every project that has minutes in the log."""
    return f"{PREFIX}:projects"


def worker_alive(worker_name: str) -> str:
    """Short-lived key a running PVM worker keeps refreshed; its absence means the worker died."""
    return f"{PREFIX}:worker:{worker_name}:alive"


def stranded_seen(queue_name: str) -> str:
    """Hash the reaper keeps: job id -> when it first saw the job dequeued but never started, per RQ queue."""
    return f"{PREFIX}:reaper:{queue_name}:stranded"


# -- the scheduler (periodic maintenance jobs) -----------------------------------


def scheduler_leader() -> str:
    """Lease naming the one `pvm scheduler` that acts (SET NX PX, renewed by its holder)."""
    return f"{PREFIX}:scheduler:leader"


def schedules() -> str:
    """Hash of every schedule's state: ``<name>:last`` (run time, s), ``<name>:every`` (s), ``<name>:job`` (id)."""
    return f"{PREFIX}:scheduler:schedules"


# -- metrics the pools record for the exporter --------------------------------


def metrics_stages() -> str:
    """Set of stage names that recorded batch metrics."""
    return f"{PREFIX}:metrics:stages"


def metrics_stage(stage: str) -> str:
    """Hash of counters of one stage: minutes, batches, failures."""
    return f"{PREFIX}:metrics:stage:{stage}"


def metrics_stage_duration(stage: str) -> str:
    """Histogram hash of a stage's batch durations."""
    return f"{PREFIX}:metrics:stage:{stage}:duration"


def metrics_freshness_stages() -> str:
    """Set of stages that recorded freshness (durable, indexed, ...)."""
    return f"{PREFIX}:metrics:freshness"


def metrics_freshness(stage: str) -> str:
    """Histogram hash of emit -> `stage` latency."""
    return f"{PREFIX}:metrics:freshness:{stage}"


def metrics_providers() -> str:
    """Set of "provider|kind" names that recorded calls."""
    return f"{PREFIX}:metrics:providers"


def metrics_provider(name: str) -> str:
    """Hash of one provider's counters: calls:<outcome>, tokens (sent), completion_tokens (answered)."""
    return f"{PREFIX}:metrics:provider:{name}"


def metrics_provider_latency(name: str) -> str:
    """Histogram hash of one provider's call latency."""
    return f"{PREFIX}:metrics:provider:{name}:latency"


# Why the reaper requeued a job: the fields of `metrics_reaper`, and the `reason` label of its counter.
REQUEUED_DEAD_WORKER = "dead_worker"  # its worker's alive key lapsed while the job was started
REQUEUED_STRANDED = "stranded"  # it sat dequeued and never started for longer than the grace
REAPER_REASONS = (REQUEUED_DEAD_WORKER, REQUEUED_STRANDED)


def metrics_reaper(queue_name: str) -> str:
    """Hash of the reaper's counters for one RQ queue: jobs requeued, one field per `REAPER_REASONS` reason."""
    return f"{PREFIX}:metrics:reaper:{queue_name}"


# -- jobs: the only work PVM workers run, by stable name (the runner's area) --------------------------------
#
# A job stored in Redis names its work by one of these names, never by a module path: a module can move without
# stranding the jobs queued before the move. The function behind each name is in the runtime's one registry
# (`workers.runtime.jobs.JOBS`). A name, once used, is never reused for other work.

LOG_JOB = "log-batch"  # one dispatcher batch into the durable log
INDEX_JOB = "index-batch"  # one batch of durable minutes into the vector index
INDEX_RESET_JOB = "index-reset-project"  # forget a project's derived memory before a replay
INDEX_OPTIMIZE_JOB = "index-optimize"  # optimize the embedded engine's shards
FACTS_JOB = "facts-batch"  # one fanned-out batch of durable minutes into the facts store
SUMMARIZE_JOB = "summarize-batch"  # one fanned-out batch of durable minutes into threads' chunks

# The job each pool runs on a batch the log pool fans out to it, by pool name (the keys of `QUEUES`).
POOL_JOBS = {
    "log": LOG_JOB,
    "index": INDEX_JOB,
    "facts": FACTS_JOB,
    "summarize": SUMMARIZE_JOB,
}

JOB_FUNCTIONS = frozenset({LOG_JOB, INDEX_JOB, INDEX_RESET_JOB, INDEX_OPTIMIZE_JOB, FACTS_JOB, SUMMARIZE_JOB})
"""The names of every job a PVM worker may run, and nothing else (with `LEGACY_JOB_NAMES`, the same jobs).

A worker checks a job's function name against this set before it imports or
calls anything: whoever can write to Redis can put any job on a PVM queue, and
resolving a name like ``os.system`` or an attacker's module would already run
code. A job naming anything else (or asking for callbacks, webhooks or a method
of an instance, which PVM jobs never use) goes to its queue's failed registry
with the reason, unimported. A new job is named here, next to the others, and
registered in `workers.runtime.jobs.JOBS`.
"""

# -- index pool: contiguous index heads ------------------------------------------


def index_done(project_id: str) -> str:
    """Bitmap over a project's log sequence: bit n is set once minute n is in the vector index (see `index_head`)."""
    return f"{PREFIX}:{{p:{project_id}}}:index:done"


# -- facts pool: the current view of long-term memory ----------------------------------------------------------
#
# The queue (`FACTS_QUEUE`, in `QUEUES`) and the job (`FACTS_JOB`, in `POOL_JOBS` and `JOB_FUNCTIONS`) are named
# above with the other pools'.

# Every key below is a projection of the log (knowledge-change minutes, contracts/fact_changes.py): replay rebuilds
# them. Task and project tiers of a project carry the project's tag ``{p:<project>}`` (with its other caches, so one
# script can update a project's facts); the global tier carries ``{g}``. Within a tag, the tier is the key's last
# part: ``project``, ``task:<task id>`` (free text, so it comes last and nothing follows it) or ``global``.


def _facts_tag(tier_key: TierKey) -> str:
    return "{g}" if tier_key.tier is Tier.GLOBAL else f"{{p:{tier_key.project_id}}}"


def _facts_key(tier_key: TierKey, what: str) -> str:
    scope = f"task:{tier_key.task_id}" if tier_key.tier is Tier.TASK else tier_key.tier.value
    return f"{PREFIX}:{_facts_tag(tier_key)}:facts:{what}:{scope}"


def facts_by_id(tier_key: TierKey) -> str:
    """Hash fact id -> the fact's record (the store's encoding of `Fact.to_dict()`), every status, history included.

    One hash per project (its task and project tiers together, so a read by id needs only the project) and one
    for the global tier.
    """
    return f"{PREFIX}:{_facts_tag(tier_key)}:facts:byid"


def facts_in_tier(tier_key: TierKey) -> str:
    """Sorted set of every fact id of one tier key, scored by ``recorded_at`` (Unix ms): what clearing a task drops."""
    return _facts_key(tier_key, "all")


def facts_in_slot(tier_key: TierKey, slot: Slot) -> str:
    """Sorted set of the fact ids of one slot of one tier key, scored by ``valid_from`` (Unix ms): the slot's history.

    Supersession, contradiction and dedupe read this and nothing else (invariant 10). The slot is named by
    `Slot.digest`, so subjects and attributes of any text make a fixed-shape key.
    """
    return _facts_key(tier_key, f"slot:{slot.digest}")


def facts_slot_lock(tier_key: TierKey, slot: Slot) -> str:
    """Lease (SET NX PX) held by the one worker deciding and applying changes to a slot of a tier key (invariant 8).

    Different slots, and different tier keys, proceed in parallel.
    """
    return _facts_key(tier_key, f"lock:{slot.digest}")


def facts_decided(tier_key: TierKey, slot: Slot) -> str:
    """Hash source minute id -> the change minutes a facts worker decided from it in one slot, not applied yet.

    Written (with a TTL, `FACTS_DECISION_TTL_MS`) before the change minutes are XADDed and emptied once
    they are applied. A worker that died in between leaves its decisions here, and whoever takes the
    slot's lease next writes and applies them before deciding, so a decision is written once, under one
    set of ids, however the log and the retries interleave (issue 22).
    """
    return _facts_key(tier_key, f"decided:{slot.digest}")


def facts_of_type(tier_key: TierKey, fact_type: FactType | str) -> str:
    """Set of the fact ids of one type (`FactType`) in one tier key."""
    return _facts_key(tier_key, f"type:{FactType(fact_type).value}")


def learned_keys(tier_key: TierKey) -> str:
    """Hash of one tier key's learned keys: normalized key -> id of the fact holding its current value (``recall``)."""
    return _facts_key(tier_key, "learned")


def procedural_rules(tier_key: TierKey) -> str:
    """Sorted set of the ``procedure`` fact ids of one tier key, scored by priority: the rules a reader matches."""
    return _facts_key(tier_key, "rules")


def fact_reads(tier_key: TierKey) -> str:
    """Hash of read statistics, kept beside the records so replay never needs them: ``<id>`` -> access count,
    ``<id>:at`` -> last access time. One per project (task and project tiers) and one for the global tier.
    """
    return f"{PREFIX}:{_facts_tag(tier_key)}:facts:reads"


def facts_head(project_id: str) -> str:
    """Hash of how far a project's facts have caught up with its log: a contiguous watermark like `index_head`.

    ``seq``: every log seq at or below it is applied; ``applied_at``: when ``seq`` last moved; ``max_seq``: the
    newest seq applied; ``gaps``: seqs below ``max_seq`` not applied yet. Kept with `facts_done` by the facts pool.
    Per project, global facts included: a change to the global tier is a minute in some project's log.
    """
    return f"{PREFIX}:{{p:{project_id}}}:facts:head"


def facts_done(project_id: str) -> str:
    """Bitmap over a project's log sequence: bit n is set once minute n is applied to the facts (see `facts_head`)."""
    return f"{PREFIX}:{{p:{project_id}}}:facts:done"


# -- fact extraction metrics (area: llm-extractor) ----------------------------------------------------------------


def metrics_extraction() -> str:
    """Hash of fact-extraction counters: ``<extractor>:chunks:<outcome>`` and ``<extractor>:items:<outcome>``.

    The LLM extractor's chunks (``answered``, or the rule fallback after ``rejected`` / ``unavailable`` /
    ``error``) and its answer's items (``kept``, or dropped: ``unknown_ref``, ``refused``); docs/extraction.md.
    """
    return f"{PREFIX}:metrics:extraction"


# -- facts pool: the store's bookkeeping and counters (area: facts pool) ---------------------------------------


def facts_parked(tier_key: TierKey) -> str:
    """Hash fact id -> msgpack list of change minutes that name a fact the store does not hold yet.

    A change can reach the store before the minute that asserts its fact (two log workers, two facts workers):
    it waits here and is applied when the fact arrives, so the order minutes are applied in never changes the
    result. One per project (task and project tiers) and one for the global tier, like `facts_by_id`.
    """
    return f"{PREFIX}:{_facts_tag(tier_key)}:facts:parked"


def facts_cleared(project_id: str) -> str:
    """Hash task tier key -> the order key of the newest ``task_memory_cleared`` applied to it.

    A fact of that task asserted before the clearing leaves the current view, even when its minute arrives after.
    """
    return f"{PREFIX}:{{p:{project_id}}}:facts:cleared"


# The facts pool's counters: the fields of `metrics_fact_changes`, and the `change` label of pvm_facts_changes_total.
FACT_CHANGE_COUNTERS = ("extracted", "asserted", "confirmed", "promoted", "superseded", "contradicted", "refused")


def metrics_fact_changes() -> str:
    """Hash of the facts pool's counters (`FACT_CHANGE_COUNTERS`): candidates ``extracted``; change minutes it
    wrote by kind (``asserted``, ``confirmed``, ``promoted`` — at assertion or on confirmation —, ``superseded``,
    ``contradicted``); and change minutes from the log it ``refused``.
    """
    return f"{PREFIX}:metrics:facts:changes"


# -- fact points: the index pool's fact step (area: fact-index) ---------------------------------------------------


def fact_points_lock(project_id: str | None) -> str:
    """Lease of the one index worker folding a tenant's fact points (invariant 8): a project's, or global's (None).

    A fact point is read, folded with a batch's knowledge changes and written back; two index workers (a Qdrant
    server allows several) must not interleave on one tenant. Held only while a batch carries knowledge changes.
    """
    if project_id is None:
        return f"{PREFIX}:{{g}}:index:facts:lock"
    return f"{PREFIX}:{{p:{project_id}}}:index:facts:lock"


# -- evaluate pool: scores, prunes, merges and conflicts of a project's memories (area: evaluate pool) -----------
#
# The evaluate pool is run by `pvm scheduler`, never fed by the log pool's fan-out: its queue is in `QUEUES`, its
# jobs in `JOB_FUNCTIONS`, and it is not in `POOL_JOBS` (the pools the log feeds). Everything below is derived:
# `pvm replay` of a project deletes it (pruned and merged memories come back) and rescores the project.

EVALUATE_QUEUE = "pvm-evaluate"
QUEUES["evaluate"] = EVALUATE_QUEUE
SCHEDULED_POOLS = ("evaluate",)  # pools of `QUEUES` the scheduler (or a person) feeds, not the log pool

EVALUATE_PLAN_JOB = "evaluate-plan"  # start an evaluation run of every project (the schedule's job)
EVALUATE_SLICE_JOB = "evaluate-slice"  # one bounded slice of one project's run
JOB_FUNCTIONS = JOB_FUNCTIONS | {EVALUATE_PLAN_JOB, EVALUATE_SLICE_JOB}


def evaluation_scores(project_id: str) -> str:
    """Hash memory id (a minute id or a fact id) -> msgpack of its scores as the last evaluation left them."""
    return f"{PREFIX}:{{p:{project_id}}}:eval:scores"


def evaluation_pruned(project_id: str) -> str:
    """Hash memory id -> msgpack record of its prune (when, why, composite, tokens): the prune log of a project.

    A counter-like record, not a minute: a prune is a decision about derived memory that replay undoes, so it
    must not be replayed from the log (decision in docs/lifecycle.md).
    """
    return f"{PREFIX}:{{p:{project_id}}}:eval:pruned"


def evaluation_merged(project_id: str) -> str:
    """Hash duplicate memory id -> the id of the memory it was merged into (provenance; the survivor lists them)."""
    return f"{PREFIX}:{{p:{project_id}}}:eval:merged"


def evaluation_conflicts(project_id: str) -> str:
    """Hash memory id -> the id of the memory that contradicts it and won (its outcome was better)."""
    return f"{PREFIX}:{{p:{project_id}}}:eval:conflicts"


def evaluation_totals(project_id: str) -> str:
    """Hash of a project's evaluation counters: pruned, merged, conflicts, tokens_reclaimed (since its last replay)."""
    return f"{PREFIX}:{{p:{project_id}}}:eval:totals"


def evaluation_run(project_id: str) -> str:
    """Hash of a project's current or last evaluation run: id, started, slices, done, scored, finished, ..."""
    return f"{PREFIX}:{{p:{project_id}}}:eval:run"


def evaluation_scratch(project_id: str, run_id: str, what: str) -> str:
    """A run's working hash: what newer slices learned for older ones (``refs``, ``corrections``, ``tasks``), and
    which slices told them (``pushed``); the run's candidate index for dedupe across pages (``buckets``: bucket ->
    ids of kept memories, ``records``: id -> what dedupe and the writer need; `workers.evaluate.candidate_index`).

    The global tier's run is named `pvm.vectors.GLOBAL_TENANT` (``_global``) in every evaluation key."""
    return f"{PREFIX}:{{p:{project_id}}}:eval:{run_id}:{what}"


def evaluation_lock(project_id: str) -> str:
    """Lease of the one evaluation run of a project (invariant 8): a second run waits for the next schedule."""
    return f"{PREFIX}:{{p:{project_id}}}:eval:lock"


def evaluated_projects() -> str:
    """Hash project -> Unix time its last evaluation run completed (`pvm status`, the exporter)."""
    return f"{PREFIX}:eval:completed"


def metrics_evaluate() -> str:
    """Hash of the evaluate pool's counters: scored, pruned, merged, conflicts, slices, runs."""
    return f"{PREFIX}:metrics:evaluate"


# -- summarize pool: threads, chunks and episodes (area: summarize pool) ------------------------------------------
#
# The queue (`SUMMARIZE_QUEUE`) and the job (`SUMMARIZE_JOB`) are named above with the other pools'. Every key
# below is a projection of the log (replay rebuilds it) and carries the project's tag; a thread is named by
# `contracts.summaries.ThreadRef.digest` (thread ids are free text).


def summary_threads(project_id: str) -> str:
    """Hash thread digest -> the thread's name (``thread:<id>``, ``task:<id>``, ``project``): a project's threads."""
    return f"{PREFIX}:{{p:{project_id}}}:summ:threads"


def thread_state(project_id: str, digest: str) -> str:
    """Hash of one thread's summaries: ``chunks`` and ``episodes`` (msgpack lists of their records), ``open``
    (the episode patterns waiting for a later minute), ``final_seq`` (seqs up to it were read for episodes),
    ``chunked_seq`` (the last seq in a chunk) and ``minutes`` (how many minutes the thread has had)."""
    return f"{PREFIX}:{{p:{project_id}}}:summ:thread:{digest}"


def thread_pending(project_id: str, digest: str) -> str:
    """Sorted set of one thread's minute ids not in a chunk yet, scored by log seq: its newest ones, verbatim."""
    return f"{PREFIX}:{{p:{project_id}}}:summ:thread:{digest}:pending"


def thread_bodies(project_id: str, digest: str) -> str:
    """Hash minute id -> msgpack minute, for the ids in `thread_pending` (what a chunk is made from)."""
    return f"{PREFIX}:{{p:{project_id}}}:summ:thread:{digest}:bodies"


def summary_dirty(project_id: str) -> str:
    """Set of the digests of a project's threads holding minutes above the summarize head (not final yet)."""
    return f"{PREFIX}:{{p:{project_id}}}:summ:dirty"


def summary_lock(project_id: str) -> str:
    """Lease (SET NX PX) of the one summarize worker changing a project's threads (invariant 8)."""
    return f"{PREFIX}:{{p:{project_id}}}:summ:lock"


def summarize_head(project_id: str) -> str:
    """Hash of how far a project's threads have caught up with its log: a contiguous watermark like `index_head`
    (``seq``, ``summarized_at``, ``max_seq``, ``gaps``); chunk boundaries are drawn only at or below ``seq``."""
    return f"{PREFIX}:{{p:{project_id}}}:summ:head"


def summarize_done(project_id: str) -> str:
    """Bitmap over a project's log sequence: bit n is set once minute n reached the summarize pool."""
    return f"{PREFIX}:{{p:{project_id}}}:summ:done"


# The summarize pool's counters: the fields of `metrics_summaries`, the `what` label of pvm_summaries_total.
SUMMARY_COUNTERS = ("chunks", "merged", "episodes", "llm_summaries", "llm_fallbacks", "refused")


def metrics_summaries() -> str:
    """Hash of the summarize pool's counters (`SUMMARY_COUNTERS`): chunks made, chunks merged, episodes made,
    chunks a model summarized, chunks the extractive summarizer took over from it, ``chunk_summarized`` refused."""
    return f"{PREFIX}:metrics:summaries"


# -- summary points: the summarize pool's chunks and episodes in the vector index (area: retrieval, issue 12) ------

# Runs on the index queue (the index worker owns the vector engine): what a summarize batch changed of a project's
# threads, as summary points (workers/index/summary_points.py).
SUMMARY_POINTS_JOB = "index-summaries"
JOB_FUNCTIONS = JOB_FUNCTIONS | {SUMMARY_POINTS_JOB}

# The names jobs were queued under before jobs had stable names (the module paths of their functions in PVM 0.1.0
# before 2026-11-28): a job an older PVM queued, still in Redis after an upgrade, runs as the job it names.
LEGACY_JOB_NAMES = {
    "workers.log_pool.run": LOG_JOB,
    "workers.index_pool.run": INDEX_JOB,
    "workers.index_pool.reset_project": INDEX_RESET_JOB,
    "workers.index_pool.optimize": INDEX_OPTIMIZE_JOB,
    "workers.index_pool.run_summaries": SUMMARY_POINTS_JOB,
    "workers.facts_pool.run": FACTS_JOB,
    "workers.summarize_pool.run": SUMMARIZE_JOB,
    "workers.evaluate_pool.plan": EVALUATE_PLAN_JOB,
    "workers.evaluate_pool.run_slice": EVALUATE_SLICE_JOB,
}


def job_name(stored: str) -> str:
    """The stable name of the job a stored job names: itself, or the stable name of a legacy one."""
    return LEGACY_JOB_NAMES.get(stored, stored)
