"""write_minutes: PVM's own minutes onto their projects' shard streams, as emit puts an agent's, in chunks."""

from __future__ import annotations

import redis

from contracts import Minute, decode_minute, keys
from workers.runtime.minutes import add_minutes, stream_for, write_minutes


def _minutes(n: int) -> list[Minute]:
    return [Minute(project_id=f"p{i % 3}", event_type="message", memory_note=f"note {i}") for i in range(n)]


def test_every_minute_lands_once_on_its_projects_shard_stream_and_its_entry_ids_come_back(
    redis_client: redis.Redis,
) -> None:
    minutes = _minutes(7)
    ids = write_minutes(redis_client, 4, minutes, chunk=3)  # three MULTI/EXECs
    assert len(ids) == 7  # entry ids are per stream: two streams may hand out the same one
    for minute, entry_id in zip(minutes, ids, strict=True):
        stream = keys.stream(keys.shard_of(minute.project_id, 4))
        assert stream_for(minute.project_id, 4) == stream
        [(_, fields)] = redis_client.xrange(stream, entry_id, entry_id)
        assert decode_minute(fields[keys.MINUTE_FIELD]).id == minute.id
    assert sum(redis_client.xlen(keys.stream(s)) for s in range(4)) == 7
    assert write_minutes(redis_client, 4, []) == []


def test_add_minutes_queues_the_same_xadds_on_a_callers_pipeline(redis_client: redis.Redis) -> None:
    from contracts import encode_minute

    minutes = _minutes(4)
    pipe = redis_client.pipeline(transaction=False)
    pipe.set("written-first", "1")
    add_minutes(pipe, 2, ((m.project_id, encode_minute(m)) for m in minutes))
    replies = pipe.execute()
    assert replies[0] is True and len(replies) == 5
    assert sum(redis_client.xlen(keys.stream(s)) for s in range(2)) == 4
