"""The evaluate pool: periodic scoring, decay, dedupe, conflict resolution and pruning of derived memory."""
