"""pool_job / enqueue_pool_job: every PVM job queued with one policy (retries, result and failure TTLs)."""

from __future__ import annotations

import redis
from rq.job import Job

from contracts import keys
from pvm import defaults
from workers.runtime.queues import enqueue_pool_job, pool_job, pool_queue
from workers.runtime.serializers import MsgpackSerializer


def test_a_pool_job_has_the_policy_and_what_the_caller_asks(redis_client: redis.Redis) -> None:
    queue = pool_queue("index", redis_client)
    first = enqueue_pool_job(queue, keys.INDEX_RESET_JOB, ("p1",), timeout=None, retries=0)
    [second] = queue.enqueue_many(
        [pool_job(keys.INDEX_JOB, ([["m1", 1, b"x"]],), description="one batch", depends_on=first)]
    )
    stored = Job.fetch(second.id, connection=redis_client, serializer=MsgpackSerializer)
    assert stored.func_name == keys.INDEX_JOB and list(stored.args) == [[["m1", 1, b"x"]]]
    assert stored.retries_left == defaults.JOB_RETRIES
    assert stored.timeout == defaults.DOWNSTREAM_JOB_TIMEOUT_S
    assert (stored.result_ttl, stored.failure_ttl) == (defaults.JOB_RESULT_TTL_S, defaults.JOB_FAILURE_TTL_S)
    assert stored.description == "one batch" and stored._dependency_ids == [first.id]
    reset = Job.fetch(first.id, connection=redis_client, serializer=MsgpackSerializer)
    assert reset.retries_left is None and reset.func_name == keys.INDEX_RESET_JOB and list(reset.args) == ["p1"]
