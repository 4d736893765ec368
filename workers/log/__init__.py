"""The log pool: the durable, append-only log (the commit point) and the caches, and the fan-out downstream."""
