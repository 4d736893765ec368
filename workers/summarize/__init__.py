"""The summarize pool: per-thread chunks, summaries and episodes."""
