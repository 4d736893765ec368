"""Every tunable default of PVM, in one place. `pvm.config.Settings` reads overrides from the environment."""

from __future__ import annotations

# Streams
SHARDS = 4
STREAM_FIELD_LIMIT_BYTES = 64 * 1024

# Emitter
EMIT_BUFFER_SIZE = 100_000  # minutes held in memory before spilling to the spool file
EMIT_BATCH_SIZE = 500  # XADDs per pipeline round trip
EMIT_FLUSH_INTERVAL_S = 0.002  # how often a recently busy flusher polls the buffer
EMIT_IDLE_AFTER_S = 1.0  # after this long with nothing to send the flusher sleeps until emit() wakes it
EMIT_IDLE_POLL_S = 0.1  # ...or this long at most
EMIT_RECONNECT_INTERVAL_S = 0.5  # how often a producer with Redis down probes it again
EMIT_SOCKET_TIMEOUT_S = 2.0
SPOOL_DIR = "var/spool"

# Pools the log pool feeds with every durable batch.
DOWNSTREAM = ("index", "facts", "summarize")
# Their jobs may call providers that retry with backoff (embeddings: up to 6 tries of 30 s).
DOWNSTREAM_JOB_TIMEOUT_S = 600

# Dispatcher
# Minutes per log-pool job (and per XREADGROUP). 1,000 halves the pipeline's per-job costs per minute against 500
# (issue 14, bench/ingest.py); the log pool's fan-out still hands the downstream pools FANOUT_BATCH_SIZE at a time.
DISPATCH_BATCH_SIZE = 1000
# Records per downstream job (index, facts, summarize): a log job's fan-out is cut into jobs of at most this many,
# in order. The downstream pools' batches, and so the index engine's segments and the reader's figures, were all
# measured at 500 (bench/lifecycle_evaluate.py's context p99 read 10.6 and 19.1 ms at 100k minutes indexed in
# 1,000-minute batches against 9.8 and 8.9 ms at 500): a larger log job leaves them as they were.
FANOUT_BATCH_SIZE = 500
DISPATCH_BLOCK_MS = 500
# While the log pool has work queued, a dispatcher gathers entries for up to this
# long (or until a batch is full) before making a job: fewer, fuller jobs under
# load; no wait at all when the log pool is idle.
DISPATCH_LINGER_MS = 50
# While a pool the log pool feeds (index, facts, summarize) has jobs waiting, a dispatcher gathers for up to this
# long instead: those pools pay their per-job work (leases, reads, an engine segment) per job, and at 1,000
# minutes/s evenly spaced, 50 ms made jobs of ~57 minutes the pools on 2 cores did not keep up with, 200 ms ~180
# that they did (bench/freshness.py). The log pool's own backlog keeps DISPATCH_LINGER_MS (its durable latency).
DISPATCH_DOWNSTREAM_LINGER_MS = 200
DISPATCH_CLAIM_IDLE_MS = 30_000  # an entry pending this long with a silent consumer is reclaimed
DISPATCH_CLAIM_INTERVAL_S = 5.0
DISPATCH_MAX_DELIVERIES = 5  # more deliveries than this and an entry goes to the dead-letter stream
DISPATCH_TRIM_INTERVAL_S = 5.0
DISPATCH_STALE_CONSUMER_MS = 3_600_000  # consumers idle this long with nothing pending are removed from the group
DEAD_LETTER_MAXLEN = 1_000_000
# With Redis unreachable, a dispatcher retries after this wait, doubled each failure up to the max.
DISPATCH_RECONNECT_MIN_S = 0.2
DISPATCH_RECONNECT_MAX_S = 5.0

# RQ jobs and workers
JOB_TIMEOUT_S = 120
JOB_RETRIES = 3
JOB_RESULT_TTL_S = 600
JOB_FAILURE_TTL_S = 7 * 24 * 3600
WORKER_ALIVE_TTL_S = 10  # a worker whose alive key lapses this long is dead; its job is requeued
WORKER_ALIVE_REFRESH_S = 2.0
REAPER_INTERVAL_S = 3.0
# A worker process that lost Redis pings it again after this wait, doubled each failure up to the max.
WORKER_RECONNECT_MIN_S = 0.2
WORKER_RECONNECT_MAX_S = 5.0
# A job RQ moved to a queue's intermediate list but no worker started for this long is requeued: its worker
# died between BLMOVE and the started registry. RQ's own cleanup would mark it failed after 1-2 minutes.
STRANDED_GRACE_S = 10.0

# Durable log
LOG_DIR = "var/log"
LOG_SEGMENT_BYTES = 64 * 1024 * 1024

# Redis caches the reader uses
RECENT_WINDOW = 200  # newest minutes per project (and per agent) kept in Redis
MINUTE_CACHE_SIZE = 20_000  # minutes per project kept by id in Redis

# Embedded stack
EMBEDDED_DATA_DIR = "var/valkey"

# Reader
CONTEXT_RECENT = 50  # newest minutes of the project in a context
CONTEXT_EXPERIENCE_K = 5  # similar past minutes in a context
CONTEXT_BUDGET_TOKENS = 2_000
CONTEXT_EXPERIENCE_OVERFETCH = 3  # relevant experience: fetch this many times k, keep the best k that differ
CONTEXT_NEAR_DUPLICATE = 0.7  # two notes sharing this much of their words (Jaccard) say the same thing

# Embeddings (OpenAI-compatible endpoint)
EMBED_BATCH_SIZE_MAX = 2048  # OpenAI's limit on inputs per request
EMBED_BATCH_SIZE = EMBED_BATCH_SIZE_MAX
EMBED_MAX_RETRIES = 5
EMBED_TIMEOUT_S = 30.0
# A search's query embedding: one try, this long, then the answer is lexical-only (an agent never waits on a provider).
EMBED_QUERY_TIMEOUT_S = 2.0
EMBED_BACKOFF_BASE_S = 0.5
EMBED_BACKOFF_MAX_S = 20.0
EMBED_MALFORMED_RETRIES = 2  # retries of answers that parse wrong: a proxy hiccup heals, a wrong server does not
# OpenAI caps a request at 300k tokens in total and an input at 8,192 tokens; past
# either the whole batch is a 400 that no retry fixes. Tokens are estimated from
# UTF-8 bytes / 3, which overestimates English (~4 bytes a token).
EMBED_MAX_BATCH_TOKENS = 250_000
EMBED_MAX_INPUT_CHARS = 24_000
OPENAI_DEFAULT_BASE_URL = "https://api.openai.com/v1"

# Vector store and search
VECTOR_DIR = "var/qdrant"  # under PVM_HOME: the embedded engine's shards, one per project
# Ranking weights (semantic, keyword, recency, importance) when PVM_SEARCH_WEIGHTS is unset. Lexical only, the
# semantic share is void. With dense vectors (PVM_EMBED_MODEL) the semantic leg leads: bench/retrieval.py with
# all-MiniLM-L6-v2 measured recall@5 0.599 (0.691 @10) at 0.6/0.1 against 0.544 (0.639) at 0.4/0.3.
SEARCH_WEIGHTS = (0.4, 0.3, 0.2, 0.1)
SEARCH_WEIGHTS_WITH_EMBEDDINGS = (0.6, 0.1, 0.2, 0.1)
SEARCH_HALF_LIFE_MS = 7 * 24 * 3600 * 1000  # recency halves every week
# The embedded engine's hot window (`pvm.vectors.hot`): of a project past 8 times SEARCH_HOT_MINUTES, its newest
# SEARCH_HOT_MINUTES to twice that many minutes again, which its lexical searches read first (the whole project
# when the window finds too few). 0: no window, every search reads the whole project.
SEARCH_HOT_MINUTES = 25_000
SEARCH_MIN_CANDIDATES = 50  # each leg fetches at least this many candidates to re-rank ...
SEARCH_CANDIDATES_PER_HIT = 5  # ... or this many per hit asked for
# After a query embedding fails, searches skip the dense leg this long before one of them tries the provider again.
SEARCH_DENSE_COOLDOWN_S = 10.0

# Reader HTTP API
API_MAX_BATCH = 1_000  # minutes per POST /v1/minutes, ids per /minutes request
API_MAX_BODY_BYTES = 8 * 1024 * 1024
API_TOKENS_RELOAD_CHECK_S = 1.0  # how often, at most, a serving process looks at the tokens file's mtime

# Replay
REPLAY_BATCH = 500  # minutes per index job a replay enqueues

# Scheduler
SCHEDULER_LEASE_MS = 15_000  # a standby scheduler takes over this long after the leader stops renewing
SCHEDULER_TICK_S = 1.0  # how often a scheduler renews its lease and looks for due schedules
OPTIMIZE_EVERY_S = 3600  # the embedded engine's periodic optimize (merge segments, build HNSW)
OPTIMIZE_JOB_TIMEOUT_S = 3600

# `pvm up` / WorkerGroup supervision: a child that exits within CRASH_LOOP_S of its start is
# restarted with backoff (1 s doubling to CRASH_LOOP_MAX_DELAY_S) instead of at once.
CRASH_LOOP_S = 10.0
CRASH_LOOP_MAX_DELAY_S = 30.0

# Emitter: refused writes, process exit, byte cap
EMIT_BUFFER_BYTES = 64 * 1024 * 1024  # bytes of encoded minutes held in memory before spilling to the spool file
EMIT_REFUSED_RETRY_S = 1.0  # first wait before retrying after a refusal an operator must fix (NOPERM, WRONGTYPE...)
EMIT_REFUSED_RETRY_MAX_S = 30.0  # ...doubling up to this
EMIT_EXIT_TIMEOUT_S = 2.0  # at interpreter exit, how long emitters may send what they hold before spooling the rest
EMIT_CLOSE_GRACE_S = 0.1  # close() waits at least this long for the flusher to stop before spooling what it holds

# CLI: replay, dead letters, exporter lag (area: cli)
REPLAY_POLL_S = 0.2  # how often a waiting replay reads its jobs' states and the index heads
REPLAY_STATUS_BATCH = 500  # job states (oldest pending first) a waiting replay reads per poll
REPLAY_WORKER_CHECK_S = 2.0  # how often it checks that a live worker still serves the index queue
DEAD_LETTER_PAGE = 500  # dead letters read (and retried or dropped) per round trip by `pvm dead ... --all`
FAILED_JOBS_PAGE = 500  # failed job ids read per round trip by `pvm failed retry --all`
# When XINFO GROUPS gives a NULL lag, the exporter counts unread entries on the server (a script: only the
# count comes back), at most this many per group and scrape; past it the lag is a lower bound. Above the
# PVMStreamLagHigh threshold (10,000), so the alert still fires on a capped count.
EXPORTER_LAG_COUNT_CAP = 20_000
EXPORTER_LAG_COUNT_PAGE = 1_000  # entries per XRANGE inside that script
CLI_REDIS_CONNECT_TIMEOUT_S = 5.0  # a `pvm` command gives up on an unreachable Redis after this long

# A long-running command started while Redis restarts (or loads its data) waits this long for it, saying so
# once, before it gives up with the one-line error: under a supervisor an exit would only add crash-loop backoff.
REDIS_START_WAIT_S = 30.0  # PVM_REDIS_START_WAIT

# Settings, ports and addresses (area: settings). deploy/ and docker-compose.yml repeat the ports and
# PVM_SHARDS / PVM_DOWNSTREAM; tests/deploy/test_deploy_files.py checks they equal these.
API_PORT = 8080  # the reader API: `pvm serve --port`, `pvm up --api-port`
API_URL = f"http://127.0.0.1:{API_PORT}"  # PVM_API_URL unset: the reader API of `pvm up` / `pvm serve` on this machine
EXPORTER_PORT = 9108  # `pvm exporter --port`
BIND_ADDR = "127.0.0.1"  # what `pvm serve` and `pvm exporter` listen on (0.0.0.0 in containers)
REDIS_URL_EXAMPLE = "redis://127.0.0.1:6379/0"  # shown in errors and help: a Redis on this machine
QDRANT_URL_EXAMPLE = "http://localhost:6333"  # shown in errors and help: a Qdrant server on this machine
SEARCH_K = 5  # hits a search returns unless asked for more or fewer
DEMO_MINUTES = 300  # minutes `pvm demo` emits

# HTTP client of the reader API, pvm.client.PVMClient (area: client)
API_TIMEOUT_S = 30.0  # seconds a call may wait for the API to read the request or answer
API_CONNECT_TIMEOUT_S = 5.0  # seconds to open a connection
API_RETRIES = 2  # more tries of a call that could not connect or was answered 503 (every client call is idempotent)
API_RETRY_BACKOFF_S = 0.25  # wait before the first retry, doubled for each further one
API_QUERY_BYTES = 6_000  # minute ids per by-id read: as many as fit this many URL bytes (servers cap a request line)
API_POST_BYTES = 4 * 1024 * 1024  # bytes of JSON per POST /v1/minutes, half the server's API_MAX_BODY_BYTES

# LLM client, pvm.llm (area: llm). PVM_LLM_MODEL unset: no LLM; rule-based extraction and extractive summaries.
LLM_TIMEOUT_S = 60.0  # PVM_LLM_TIMEOUT: seconds per chat request (a structured answer of a few hundred tokens)
LLM_MAX_RETRIES = 2  # PVM_LLM_MAX_RETRIES: retries of 429s, 5xx answers, timeouts and connection errors
LLM_MAX_TOKENS = 2_048  # PVM_LLM_MAX_TOKENS: completion tokens an answer may use
LLM_TEMPERATURE = 0.0  # PVM_LLM_TEMPERATURE: extraction and judging want the same answer every time
LLM_BACKOFF_BASE_S = 1.0  # first wait before a retry, doubled per retry, with jitter ...
LLM_BACKOFF_MAX_S = 30.0  # ... never above this, Retry-After included
LLM_MALFORMED_RETRIES = 2  # retries of HTTP answers that are not a chat completion (a proxy hiccup heals)
# After this many calls in a row fail for good (retries spent), calls fail at once (LLMUnavailable) for the
# cool-down, then one call tries the endpoint again: a pool falls back to its rule path instead of waiting out
# (1 + PVM_LLM_MAX_RETRIES) timeouts per chunk during an outage.
LLM_BREAKER_THRESHOLD = 3
LLM_BREAKER_COOLDOWN_S = 30.0

# LLM fact extractor, workers.facts.extraction_llm (area: llm-extractor). Off unless PVM_LLM_MODEL is set.
LLM_EXTRACT_CHUNK_MINUTES = 10  # minutes per call, of one project (issue 10: <= 10): more per call, fewer calls
LLM_EXTRACT_MAX_KNOWN = 40  # known facts shown per call (those the chunk's text names first), each with a small ref
LLM_EXTRACT_MAX_FIELD_CHARS = 2_000  # characters of one text field of a minute in the prompt (the rest is cut)
# A model's own confidence is not calibrated: capped at the rule path's strongest text reading (a decision or a
# "must not", 0.85), so an LLM statement never outranks the data convention (0.95) or a person.
LLM_EXTRACT_MAX_CONFIDENCE = 0.85

# Facts pool and store, workers/facts/pool.py and pvm/stores/facts.py (area: facts pool)
# A candidate fact at or above this confidence is promoted (current knowledge) when asserted or confirmed; below it
# waits as pending. Chosen on the calibration wording of bench/fact_sessions.py (seed 11, rule path, the facts pool):
# current-view accuracy 0.30 at 0.8, 0.34 at 0.7, 0.37 at 0.6, while the share of current facts that are right stays
# 0.56 / 0.54 / 0.55 -- the rules' confidences between 0.6 and 0.8 do not tell right from wrong on new wording, and a
# newer value left pending keeps an old one current. Held-out (reported, not used): 0.36 / 0.38 / 0.41 current view,
# 0.80 / 0.82 / 0.83 right. Below 0.6 nothing changes (no rule reads lower). docs/extraction.md has the table.
FACT_PROMOTE_AT = 0.6  # PVM_FACT_PROMOTE_AT
FACT_STATEMENTS = "keep"  # PVM_FACT_STATEMENTS: keep what a speaker says of themselves, as said (or "off")
FACTS_SLOT_LEASE_MS = 10_000  # a facts worker's lease on a slot while it decides and writes its changes
FACTS_LEASE_WAIT_S = 30.0  # a batch waits this long for slots another worker holds, then fails (and is retried)
FACTS_LEASE_POLL_S = 0.005  # first wait before asking again for a busy slot, doubled up to 0.2 s
FACTS_COMMIT_RETRIES = 100  # optimistic tries to apply changes to one project's facts while others write to them
# A facts worker's decision for one source minute in one slot, kept from before its change minutes are written until
# they are applied, so that a retry writes the same minutes (a day covers RQ's retries and a same-day requeue).
FACTS_DECISION_TTL_MS = 86_400_000

# Fact points in the vector store, the index pool's fact step (area: fact-index; workers/index/fact_points.py).
FACT_POINT_MAX_CHANGES = 64  # changes kept on a fact point; past this the oldest fold into one state
FACT_POINT_MAX_PENDING = 256  # changes kept on a point whose fact's assertion is not indexed yet (oldest dropped)
FACT_POINTS_LOCK_S = 60.0  # lease of the worker folding a tenant's fact points (a crashed holder frees it after)
FACT_POINTS_LOCK_WAIT_S = 30.0  # a batch waits this long for that lease, then fails and is retried

# Facts and rules in an agent's context, pvm/reader.py and pvm/context_facts.py (area: facts reader).
# The facts section ("What we know") may use this share of a context's budget and the rules section this one;
# what they leave unused goes on to the experience and minutes sections, which keep at least the rest.
CONTEXT_FACT_SHARE = 0.3
CONTEXT_RULE_SHARE = 0.1
# How the facts section's tokens split across tiers: task, project, global (PVM_FACT_TIER_SPLIT). A tier a context
# does not read (no task named, no global grant) or that needs less gives its share to the others.
FACT_TIER_SPLIT = (40.0, 40.0, 20.0)
# A rule (a procedure fact) applies when the task text holds at least this share of the words of its condition:
# more than half, so a two-word condition needs both ("deploying to staging" does not apply to a production deploy).
RULE_MATCH_AT = 0.6
# Parsed fact records a reader keeps, by their stored bytes (a changed record is new bytes): reading a fact again
# costs a dict lookup instead of its validation (~50 us). Past this many the memo starts over.
CONTEXT_FACT_MEMO = 4_096
# Decoded minutes and their prompt lines a reader remembers (the recent windows of the projects it serves).
CONTEXT_MINUTE_MEMO = 8_192

# The facts routes of the reader API, workers/api/fact_routes.py (area: facts-api).
API_FACTS_LIMIT = 50  # facts per page of GET /v1/projects/{p}/facts unless `limit` says otherwise
API_FACTS_MAX = 1_000  # the largest `limit`
API_FACTS_MAX_OFFSET = 100_000  # the largest `offset`
API_FACTS_SEARCH_MAX = 1_000  # with `q`, facts ranked at most (offset + limit past it: no further page)
API_FACTS_LEASE_WAIT_S = 5.0  # an assertion waits this long for a slot a facts worker decides, then answers 503

# Retrieval ranking, pvm/search.py (area: retrieval, issue 12). Chosen on bench/retrieval.py's sessions and timeline
# sets; the multi-hop set is held out (docs/search.md has the numbers).
SEARCH_FUSION = "agree"  # how the legs are fused: agree | max | minmax | engine | rrf (docs/search.md)
SEARCH_RRF_K = 10  # fusion "rrf": each leg adds weight / (k + rank)
# Recency and importance are a prior: together at most this share of a score, so they order near-ties of relevance
# and never lift a minute that matches worse by more than this over one that matches better.
SEARCH_PRIOR_SHARE = 0.05
# When the query asks for the newest ("latest", "current", "now", "last time"...) or the caller does
# (prefer="recent"), recency leads with this share: the candidates' own span, newest 1, oldest 0.
SEARCH_RECENT_SHARE = 0.5
SEARCH_RECENT_WORDS = (
    "latest", "current", "currently", "now", "nowadays", "these days", "today", "last time", "most recent",
    "recently", "newest", "lately", "right now", "at the moment",
)  # fmt: skip
# Importance is the stored scores without their recency (ranking counts recency once): the mean of these parts,
# or the composite where a payload has only that (fact points).
SEARCH_IMPORTANCE_PARTS = ("relevance", "accuracy", "impact")

# Evaluate pool (area: evaluate pool; workers/evaluate/pool.py, docs/lifecycle.md): scores, decay, prune, dedupe
EVALUATE_EVERY_S = 6 * 3600  # PVM_EVALUATE_EVERY: seconds between the scheduler's evaluation runs (0: never)
EVALUATE_SLICE = 5_000  # PVM_EVALUATE_SLICE: log minutes (or facts) one job evaluates: a run of 1M is 200 jobs
EVALUATE_JOB_TIMEOUT_S = 600  # one slice job
EVALUATE_LOCK_S = 24 * 3600  # a run's lease on its project; released when the run completes or fails
EVALUATE_WAIT_POLL_S = 0.2  # how often `pvm evaluate` (not a dry run) reads its run's progress
# Scores, each 0..1 (the design): recency falls linearly to 0 over RECENCY_SPAN; relevance reaches 1 at
# RELEVANCE_FULL reads by agents; impact is the mean of min(1, later references / IMPACT_REFS_FULL) and the task's
# success (1 succeeded, 0 failed, 0.5 unknown); accuracy loses CORRECTION_PENALTY for each later correction.
SCORE_RECENCY_SPAN_S = 28 * 24 * 3600
SCORE_RELEVANCE_FULL = 5
SCORE_IMPACT_REFS_FULL = 3
SCORE_CORRECTION_PENALTY = 0.25
SCORE_WEIGHTS = (1.0, 1.0, 1.0, 1.0)  # PVM_SCORE_WEIGHTS: recency, relevance, accuracy, impact (composite = mean)
# Facts decay: 0.5 ** (days since last access (else since recorded) / half-life) + min(0.1 x reads, 0.5), capped at 1.
FACT_HALF_LIFE_S = 30 * 24 * 3600
FACT_ACCESS_BOOST = 0.1
FACT_ACCESS_BOOST_MAX = 0.5
PRUNE_BELOW = 0.3  # PVM_PRUNE_BELOW: a memory whose composite (a fact: importance x decay) is below this is pruned ...
PRUNE_GRACE_S = 14 * 24 * 3600  # PVM_PRUNE_GRACE: ... once it is older than this
# Near-duplicates: two minutes of one tier key (a task, else the project) and event type whose notes share this
# much of their words (Jaccard of word sets) merge. Measured on bench/lifecycle_evaluate.py's planted set
# (paraphrased duplicates vs distinct minutes of the same tasks): see docs/lifecycle.md for the table.
DEDUPE_AT = 0.6  # PVM_DEDUPE_AT
DEDUPE_MIN_WORDS = 4  # notes with fewer words are never judged duplicates (too little to tell)
# Fact near-duplicates (area: evaluate pool, fact dedupe): two current facts of one tier key, type and attribute,
# with one slot subject and values whose words (`workers.evaluate.evaluation.fact_words`) overlap this
# much (Jaccard), or one value and subjects that do, merge into the better scored one; one side's words must hold
# the other's, so two different values never merge at any threshold. Measured in bench/lifecycle_evaluate.py
# (docs/lifecycle.md).
FACT_DEDUPE_AT = 0.6  # PVM_FACT_DEDUPE_AT
# Dedupe across the pages of a run (area: evaluate pool, evalscope): a run's candidate index
# (workers/evaluate/candidate_index.py) files each kept memory under its buckets; a bucket keeps the newest this
# many ids, so a page's lookups stay bounded (a bucket fills only with many memories of one group sharing a word).
DEDUPE_BUCKET_CAP = 32
DEDUPE_ORDER_CACHE = 200_000  # words whose place in the prefix filter's order a process keeps (then starts over)
# Contradicting patterns: the losing memory's composite is multiplied by this, so the better outcome ranks first.
CONFLICT_PENALTY = 0.5
# Fusion "agree" (area: retrieval, issue 12 follow-up): min-max legs whose dense share of relevance follows the legs'
# agreement on the query, |top-N lexical & top-N dense| / N with N = SEARCH_AGREE_DEPTH. At SEARCH_AGREE_FULL or more
# the configured semantic : keyword weights hold; at no agreement the dense leg has SEARCH_AGREE_FLOOR of relevance
# (a configured share below the floor is kept). Chosen on bench/retrieval.py's sessions and timeline sets with
# MiniLM and hashing embeddings and on bench/fusion.py's good / weak / noise dense legs; multihop held out.
SEARCH_AGREE_DEPTH = 10
SEARCH_AGREE_FULL = 0.5
SEARCH_AGREE_FLOOR = 0.4
# Two more readings can give the dense leg its configured share (pvm.search._dense_share, issue 12 with MiniLM):
# the words back its picks (their average min-max score over its top N reaches SEARCH_AGREE_SUPPORT), or the words
# single nothing out (their top N within SEARCH_AGREE_FLAT of the best one's score, relatively). And each leg's best
# candidates are kept in the answer: SEARCH_LEG_SLOTS of k places, split by the dense share, go to the legs' own top
# ones. Chosen on sessions + timeline (MiniLM and hashing, seeds 7 and 11) and bench/fusion.py's legs; multihop held
# out. docs/search.md has the figures.
SEARCH_AGREE_SUPPORT = 0.4
SEARCH_AGREE_FLAT = 0.2
SEARCH_LEG_SLOTS = 0.4
# Multi-hop (area: retrieval, issue 12 item 5): the minutes of a top hit's thread that are among the candidates
# rank at least that hit's score times SEARCH_THREAD_DECAY, for the best SEARCH_THREAD_HITS candidates. Chosen on
# the sessions and timeline sets (timeline multi-hop recall@10 0.28 -> 0.53 at scale 0.5, sessions not lower).
SEARCH_THREAD_HITS = 5
SEARCH_THREAD_DECAY = 0.97
# ... but only the candidates within SEARCH_THREAD_NEAR places of a top hit in time, among all its thread's minutes
# (read from the engine's timestamp index; session 21: counted among the thread's candidates, 2 places could be
# twenty turns of a long conversation; LoCoMo lexical recall@10 0.681 -> 0.695, multi-hop 0.364 -> 0.409, the
# generated sets unchanged); and a thread's match (SEARCH_THREAD_MATCH) reaches only those near its best minute
# of either leg (session 20, issue 24): on LoCoMo's dev half a whole session lifted crowded the top 10 (4.4 of
# them from the top hit's session); lifting what was said around the hit keeps the generated sets' figures and
# raises LoCoMo's recall@5, @20 and multi-hop, with and without MiniLM. Chosen among 0 to 4 and the whole thread
# on both; docs/search.md.
SEARCH_THREAD_NEAR = 2
# In a thread, the minute just before and just after each of the best SEARCH_ADJACENT_HITS hits comes in at
# SEARCH_ADJACENT_DECAY of the hit's score, whatever it says (the reply to the turn with the question's words).
# Chosen on LoCoMo dev and the generated sets together (session 21: 1-5 hits, decay 0.6-0.9; docs/search.md).
SEARCH_ADJACENT_HITS = 2
SEARCH_ADJACENT_DECAY = 0.7
# A thread as one answer (area: retrieval, issue 12, session 16): with both legs, a minute's relevance is at least
# SEARCH_THREAD_MATCH times its thread's, fused from the thread's best keyword and best semantic score among the
# candidates (one minute says the question's words, another its meaning). And words whose top N are tied within
# SEARCH_AGREE_FLAT (flatness >= SEARCH_WORD_SLOTS_FLAT) single nothing out: they get no place of their own
# (SEARCH_LEG_SLOTS). Chosen on sessions + timeline (MiniLM and hashing, seeds 7, 11, 13) over captured candidates,
# the other defaults unchanged; multihop held out. docs/search.md has the figures.
SEARCH_THREAD_MATCH = 0.95
SEARCH_WORD_SLOTS_FLAT = 0.5
# Thread neighbours (area: retrieval, issue 12 item 5, session 16): with a dense leg, each of the best
# SEARCH_NEIGHBOUR_HITS hits brings in the minute before and the minute after it in its thread (among the thread's
# SEARCH_NEIGHBOUR_LIMIT minutes nearest the query, one dense query per thread) at SEARCH_NEIGHBOUR_DECAY of its
# score, when the neighbour's query similarity is at least the dense candidates' lowest minus SEARCH_NEIGHBOUR_MARGIN
# and SEARCH_NEIGHBOUR_RELATIVE of the hit's. Chosen offline on sessions + timeline (MiniLM and hashing, seeds 7,
# 11, 13), multihop held out; docs/search.md ("Thread neighbours").
SEARCH_NEIGHBOUR_HITS = 5
# 0.95 until session 21: with the adjacent minutes (0.7) beside them, 0.8 took LoCoMo's hybrid recall@10 0.721 ->
# 0.732 (0.9: 0.727, 0.85: 0.730) and left every generated figure as it was (MiniLM and hashing legs).
SEARCH_NEIGHBOUR_DECAY = 0.8
SEARCH_NEIGHBOUR_MARGIN = 0.15
SEARCH_NEIGHBOUR_RELATIVE = 0.6
SEARCH_NEIGHBOUR_LIMIT = 20

# Summarize pool, workers/summarize/pool.py and workers/summarize/summarizers.py (area: summarize pool).
THREAD_BY = ("thread", "task", "project")  # PVM_THREAD_BY: what names a minute's thread, first found first
SUMMARY_RECENT = 20  # PVM_SUMMARY_RECENT: a thread's newest minutes, kept verbatim
SUMMARY_CHUNK = 10  # PVM_SUMMARY_CHUNK: minutes per chunk, in log order
SUMMARY_MAX_CHUNKS = 25  # PVM_SUMMARY_MAX_CHUNKS: past this the two oldest chunks merge ("Earlier: ... Then: ...")
SUMMARIZER = "extractive"  # PVM_SUMMARIZER: extractive, or llm (PVM_LLM_MODEL)
# PVM_SUMMARY_RATIO: an extractive summary's tokens aim at this share of its chunk's (issue 11 asks <= 0.2);
# decisions are kept beyond it.
SUMMARY_RATIO = 0.15
SUMMARY_MIN_TOKENS = 24  # ... but a summary may always take this many
SUMMARY_SENTENCE_WORDS = 30  # a longer sentence is cut to this many words
SUMMARY_TOPICS = 5  # key topics per chunk
SUMMARY_DECISION_WORDS = 24  # a chunk's decision line: its decision minute's first sentence, cut to this many words
SUMMARY_MERGED_SHARE = 0.5  # a merged chunk's "Earlier:" part keeps this share of the summary's room
SUMMARY_MAX_EPISODES = 64  # episodes kept per thread; past it the least significant (then oldest) goes
SUMMARY_OPEN_PATTERNS = 64  # failures waiting for their task's completion, decisions by topic, per thread
SUMMARY_LLM_MAX_FIELD_CHARS = 1_000  # characters of one text field of a minute in the summary prompt
SUMMARY_MODEL_NAME_CHARS = 128
SUMMARIZE_LOCK_MS = 30_000  # a summarize worker's lease on a project while it works a batch
SUMMARIZE_LOCK_WAIT_S = 30.0  # a batch waits this long for a project another worker holds, then fails (retried)
SUMMARIZE_LOCK_POLL_S = 0.005  # first wait before asking again, doubled up to 0.2 s
# A context built for a thread (pvm/reader.py): the thread's newest minutes may use this share of the budget
# (PVM_CONTEXT_RECENT_SHARE); its chunk summaries, then its episodes, this share plus what the recent minutes left
# (PVM_CONTEXT_RETRIEVED_SHARE). What both leave goes on to the facts and experience sections.
CONTEXT_RECENT_SHARE = 0.6
CONTEXT_RETRIEVED_SHARE = 0.4

# -- Markdown memory and the memory tools (workers/agent/memory_files.py, workers/agent/memory_tools.py) ---------
MEMORY_FILE_MAX_BYTES = 64 * 1024  # one Markdown memory file (UTF-8); a fact's text is at most 2,048 characters
MEMORY_PATH_MAX_CHARS = 240  # a memory path, relative to the project's memory root
MEMORY_IMPORT_MAX_FILES = 500_000  # files one import reads (a folder or a PUT body)
MEMORY_IMPORT_MAX_BYTES = 512 * 1024 * 1024  # bytes one folder import reads (the API's PUT is capped by its body limit)
MEMORY_WRITE_CHUNK = 1_000  # minutes per MULTI/EXEC when an import writes its changes to the stream
MEMORY_SLUG_CHARS = 60  # the readable part of a file name (subject and attribute), before the id's first 8 hex
MEMORY_EXPORT_DIR = "var/memory"  # where `make demo` exports the demo project's memory

# -- MCP server, `pvm mcp` (workers/agent/mcp_server.py) (area: agentapi) --------------------------------------------
MCP_PORT = 8090  # `pvm mcp --transport http --port`; the reader API keeps API_PORT
MCP_PATH = "/mcp"  # where the streamable HTTP transport answers
MCP_CLIENTS = 64  # API clients kept open over HTTP, one per bearer token seen; the least recently used goes first
MCP_SEARCH_K = 5  # hits the `search` tool returns unless asked
MCP_FACTS_LIMIT = 20  # facts the `facts` tool lists unless asked

# PAIR loop, pvm/pair.py, pvm/checklist.py and pvm/pair_llm.py (area: pair).
PAIR_TARGET = 95  # PVM_PAIR_TARGET: the score (0-100) at which the loop stops
PAIR_ROUNDS = 3  # PVM_PAIR_ROUNDS: judgments per run at most (and one revision fewer)
PAIR_K = 5  # PVM_PAIR_K: memories retrieved per gap
PAIR_MAX_K = 16
PAIR_JUDGE = "checklist"  # PVM_PAIR_JUDGE: checklist (offline, deterministic) or llm (PVM_LLM_MODEL)
PAIR_REVISER = "extractive"  # PVM_PAIR_REVISER: extractive (offline, quotes memories) or llm
PAIR_SEARCH_EXTRA = 2  # hits searched beyond k, so that PAIR's own minutes left out rarely leave k short ...
PAIR_SEARCH_MAX = 100  # ... and when they do, the search asks again for 4x as many, up to this many
PAIR_ABOUT_WORDS = 2  # a quoted sentence shares this many of its criterion's other words (or all, when fewer)
PAIR_LABEL_COVER = 0.6  # a sentence fills a missing label of three or more words when it holds this share of them

# Log group commit (issue 14): each log writer's journal is its commit point, one fsync per batch. Past this size
# the writer fsyncs the segments it wrote and empties its journal (a checkpoint); after a machine crash, at most
# this much journal is read back into the segments.
LOG_JOURNAL_BYTES = 32 * 1024 * 1024

# Summaries in search, workers/index/summary_points.py and pvm/search.py (area: retrieval, issue 12 item 6).
# A summary point names at most this many source minutes (a long thread's merged chunk: its first and last halves).
SUMMARY_POINT_MAX_SOURCES = 256
