"""Contiguous heads: how far a derived store has caught up with a project's log, as a watermark with no holes.

A head (`keys.index_head`, `keys.facts_head`) is a hash beside a bitmap over the project's log sequence
(`keys.index_done`, `keys.facts_done`): bit n is set once minute n is done, and the head's ``seq`` rises
only while the next bit is set, so every seq at or below it is done, whatever order workers finish in.
``max_seq`` and ``gaps`` say what lies above it (decision 0005). The index pool and the facts
pool both keep their heads with this one script.
"""

from __future__ import annotations

from collections.abc import Sequence

# Bits one BITFIELD sets over a run of seqs: u32 fields, 1,000 per call (Lua's unpack() takes ~8,000 values).
HEAD_FIELDS_PER_CALL = 1_000

_ADVANCE = """
-- KEYS[1]: head (hash), KEYS[2]: done (bitmap over the project's log seq)
-- ARGV[1]: the time, written to `time_field` when the head moves; ARGV[2..]: the log seqs this batch did,
-- as runs of consecutive seqs: first, last, ...
-- Sets their bits, then raises the head's seq while the next seq's bit is set (a contiguous watermark).
-- Returns {seq before, seq after, per seq of the runs in order: '1' if its bit was clear (done for the
-- first time), else '0'}. A batch is nearly always one run, so each costs a BITCOUNT and a few u32 SETs.
local before = tonumber(redis.call('HGET', KEYS[1], 'seq') or '0')
local fresh = {}
local top = 0
for i = 2, #ARGV, 2 do
  local first, last = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  local n = last - first + 1
  if last > top then top = last end
  local already = redis.call('BITCOUNT', KEYS[2], first, last, 'BIT')
  if already == 0 then
    fresh[#fresh + 1] = string.rep('1', n)
  elseif already == n then
    fresh[#fresh + 1] = string.rep('0', n)
  else  -- part of the run was done before (a retry, a replay): bit by bit
    for seq = first, last do
      fresh[#fresh + 1] = redis.call('GETBIT', KEYS[2], seq) == 0 and '1' or '0'
    end
  end
  if already < n then
    local ops = {}
    local seq = first
    while seq <= last do
      local width = math.min(32, last - seq + 1)
      local k = #ops
      ops[k + 1], ops[k + 2], ops[k + 3], ops[k + 4] = 'SET', 'u' .. width, seq, 2 ^ width - 1
      seq = seq + width
      if k + 4 >= 4 * fields_per_call or seq > last then
        redis.call('BITFIELD', KEYS[2], unpack(ops))
        ops = {}
      end
    end
  end
end
-- Bit 0 is never set (seqs start at 1). A head written before this bitmap existed is taken as it is:
-- the scan starts above it. No clear bit up to the bitmap's end: every bit from the head up is set.
local head
local clear = redis.call('BITPOS', KEYS[2], 0, before + 1, -1, 'BIT')
if clear == -1 then
  head = math.max(before, redis.call('STRLEN', KEYS[2]) * 8 - 1)
else
  head = math.max(before, clear - 1)
end
local max_seq = math.max(tonumber(redis.call('HGET', KEYS[1], 'max_seq') or '0'), top, head)
local gaps = 0
if max_seq > head then
  gaps = max_seq - head - redis.call('BITCOUNT', KEYS[2], head + 1, max_seq, 'BIT')
end
local fields = {
  'seq', string.format('%d', head), 'max_seq', string.format('%d', max_seq), 'gaps', string.format('%d', gaps)
}
if head > before then
  fields[7], fields[8] = time_field, ARGV[1]
end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('HDEL', KEYS[1], 'id')  -- a high-water head named its newest minute; a watermark names none
return {before, head, table.concat(fresh)}
"""

FRESH = ord("1")  # a record's flag in the script's reply: done for the first time


def advance_script(time_field: str) -> str:
    """The head script writing the time the head last moved to `time_field` (``indexed_at``, ``applied_at``).

    KEYS: the head, the done bitmap; ARGV: the time, then `runs` of seqs. Returns {seq before, seq after,
    one flag per seq of the runs in order: ``'1'`` (`FRESH`) if it was not done before, else ``'0'``}.
    """
    return f"local fields_per_call = {HEAD_FIELDS_PER_CALL}\nlocal time_field = '{time_field}'\n{_ADVANCE}"


def runs(seqs: Sequence[int]) -> list[int]:
    """Seqs in their order as runs of consecutive ones, flat: first, last, first, last, ..."""
    out: list[int] = []
    first = prev = seqs[0]
    for seq in seqs[1:]:
        if seq != prev + 1:
            out += (first, prev)
            first = seq
        prev = seq
    out += (first, prev)
    return out
