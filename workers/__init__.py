"""The server side of PVM: the dispatcher, one module per worker pool, and the worker runner."""
