"""The summarize pool's pure core: a thread's minutes in, its chunks and episodes out, the same from the log every time.

`advance` takes a thread's state, its minutes not in a chunk yet (in log order) and the project's
summarize head (every seq at or below it has reached the pool), and:

1. reads every minute newly at or below the head for episodes (`workers.summarize.episodes`), in log order;
2. while the thread has at least ``recent + chunk`` minutes at or below the head that are not in a
   chunk, folds the oldest ``chunk`` of them into a `Chunk` (the newest ``recent`` stay verbatim);
3. while it has more than ``max_chunks`` chunks, merges the two oldest ("Earlier: … Then: …"),
   keeping both seq ranges (and both chunks' decisions, the newest `MAX_DECISIONS`).

Each chunk also names what its decision minutes decided (`decision_lines`), from the minutes whoever
summarized it: a context too small for every summary still shows every decision.

Only minutes at or below the head are ever chunked or read for episodes, so a minute that reaches the
pool late (a second worker, a retried job) can never land before a boundary already drawn: boundaries
depend on the log alone, and `pvm replay` (which feeds the log through this same function) rebuilds
the same chunks and episodes. A chunk's summary is the summarizer's, unless the log holds a
``chunk_summarized`` minute for that chunk (`overrides`): then it is that minute's, and no model is called.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from contracts.summaries import (
    MAX_DECISIONS,
    MAX_PARTICIPANTS,
    MAX_SEQ_RANGES,
    MAX_SUMMARY_CHARS,
    MAX_TOPICS,
    Chunk,
    ChunkSummarized,
    Episode,
    ThreadRef,
    chunk_id,
)
from pvm import defaults
from workers.summarize.episodes import OpenPatterns, add, observe
from workers.summarize.summarizers import ChunkText, Logged, Summarizer, chunk_tokens, decision_lines, participants


@dataclass(frozen=True, slots=True)
class ThreadShape:
    """How threads are cut: newest `recent` verbatim, `chunk` minutes a chunk, at most `max_chunks` chunks."""

    recent: int = defaults.SUMMARY_RECENT
    chunk: int = defaults.SUMMARY_CHUNK
    max_chunks: int = defaults.SUMMARY_MAX_CHUNKS
    max_episodes: int = defaults.SUMMARY_MAX_EPISODES


DEFAULT_SHAPE = ThreadShape()


@dataclass
class ThreadState:
    """What the store keeps of one thread between batches (besides its pending minutes)."""

    thread: ThreadRef
    chunks: list[Chunk] = field(default_factory=list)
    episodes: list[Episode] = field(default_factory=list)
    open: OpenPatterns = field(default_factory=OpenPatterns)
    final_seq: int = 0  # every minute of the thread up to this seq was read for episodes
    chunked_seq: int = 0  # the last seq in a chunk
    minutes: int = 0  # minutes read as final


@dataclass
class Advanced:
    """What one `advance` did: chunks made (with what summarized each), merges, episodes made, ids chunked."""

    made: list[tuple[Chunk, ChunkText]] = field(default_factory=list)
    merged: int = 0
    episodes: int = 0
    chunked_ids: list[str] = field(default_factory=list)
    from_log: int = 0  # chunks whose summary a chunk_summarized minute gave


def advance(
    project_id: str,
    state: ThreadState,
    pending: Sequence[Logged],
    head: int,
    summarizer: Summarizer,
    shape: ThreadShape = DEFAULT_SHAPE,
    overrides: Mapping[str, ChunkSummarized] | None = None,
) -> Advanced:
    """Bring `state` up to `head` given the thread's `pending` minutes in log order (see the module docstring)."""
    done = Advanced()
    for logged in pending:
        if state.final_seq < logged.seq <= head:
            for episode in observe(project_id, state.thread, logged, state.open):
                state.episodes = add(state.episodes, episode, shape.max_episodes)
                done.episodes += 1
            state.final_seq = logged.seq
            state.minutes += 1
    final = [m for m in pending if state.chunked_seq < m.seq <= head]
    while len(final) >= shape.recent + shape.chunk:
        piece, final = final[: shape.chunk], final[shape.chunk :]
        first, last = piece[0].seq, piece[-1].seq
        logged_summary = (overrides or {}).get(chunk_id(project_id, state.thread, first, last))
        if logged_summary is not None:
            text = ChunkText(
                summary=logged_summary.summary,
                key_topics=logged_summary.key_topics,
                outcome=logged_summary.outcome,
                summarizer=f"llm:{logged_summary.model}"[: defaults.SUMMARY_MODEL_NAME_CHARS],
                participants=participants(piece),
                tokens=chunk_tokens(piece),
            )
            done.from_log += 1
        else:
            text = summarizer.summarize(project_id, state.thread, piece)
        chunk = Chunk(
            project_id=project_id,
            thread=state.thread,
            seq_ranges=((first, last),),
            minute_count=len(piece),
            summary=text.summary,
            key_topics=text.key_topics,
            participants=text.participants,
            outcome=text.outcome,
            summarizer=text.summarizer,
            tokens=text.tokens,
            decisions=decision_lines(piece),
        )
        state.chunks.append(chunk)
        state.chunked_seq = last
        done.made.append((chunk, text))
        done.chunked_ids += [m.minute.id for m in piece]
    while len(state.chunks) > shape.max_chunks:
        state.chunks[0:2] = [merge_chunks(state.chunks[0], state.chunks[1])]
        done.merged += 1
    return done


def _cut(text: str, chars: int) -> str:
    if len(text) <= chars:
        return text
    cut = text[: max(1, chars - 1)].rsplit(" ", 1)[0]
    return cut + "…"


def merge_chunks(earlier: Chunk, then: Chunk) -> Chunk:
    """One chunk of two neighbours: "Earlier: <earlier's summary> Then: <then's>", their ranges and counts kept.

    Bounded: the summary stays within `MAX_SUMMARY_CHARS` (the earlier part within `SUMMARY_MERGED_SHARE` of it
    when both do not fit); past `MAX_SEQ_RANGES` the two oldest ranges join into one span.
    """
    older = earlier.summary.removeprefix("Earlier: ")
    room = MAX_SUMMARY_CHARS - len("Earlier:  Then: ")
    if len(older) + len(then.summary) > room:
        older_room = max(room - len(then.summary), int(room * defaults.SUMMARY_MERGED_SHARE))
        older = _cut(older, older_room)
        newer = _cut(then.summary, room - len(older))
    else:
        newer = then.summary
    ranges = [*earlier.seq_ranges, *then.seq_ranges]
    while len(ranges) > MAX_SEQ_RANGES:
        ranges[0:2] = [(ranges[0][0], ranges[1][1])]
    return Chunk(
        project_id=earlier.project_id,
        thread=earlier.thread,
        seq_ranges=tuple(ranges),
        minute_count=earlier.minute_count + then.minute_count,
        summary=f"Earlier: {older} Then: {newer}",
        key_topics=tuple(dict.fromkeys((*then.key_topics, *earlier.key_topics)))[:MAX_TOPICS],
        participants=tuple(dict.fromkeys((*earlier.participants, *then.participants)))[:MAX_PARTICIPANTS],
        outcome=then.outcome or earlier.outcome,
        summarizer=then.summarizer if then.summarizer == earlier.summarizer else "mixed",
        tokens=earlier.tokens + then.tokens,
        merged=earlier.merged + then.merged,
        decisions=(*earlier.decisions, *then.decisions)[-MAX_DECISIONS:],
    )
