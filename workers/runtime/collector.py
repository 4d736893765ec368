"""Batch work with Python's cyclic garbage collector paused: a pool's batch frees what it allocates by refcount.

A batch (an index batch, an evaluation slice) allocates tens of containers per minute or memory, and
reference counting frees them all; the cyclic collector's passes over them cost ~4% of an index batch (A/B
over 20k minutes) and about a quarter of the evaluation's judging core (bench/lifecycle_evaluate.py at 100k).
Cycles made meanwhile are collected after the batch.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for the block (unless someone else already paused it)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
