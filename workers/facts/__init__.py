"""The facts pool: typed facts extracted from durable minutes, with their changes decided per slot."""
