"""The ingest pool: the dispatcher that reads the minute streams and hands batches to the log pool."""
