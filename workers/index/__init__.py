"""The index pool: durable minutes, facts and summaries as points in the vector engine."""
