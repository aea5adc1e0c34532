"""The commands' heavy imports (torch, transformers, the pipelines) with Python's cyclic garbage collector paused.

Those imports create a few million long-lived objects, and the collector, which runs whenever allocations outnumber
frees, walks them all again and again while they load: stage1-run's imports ran 6 full collections, about 0.6 s of
the 3.7 s of CPU they take (tiny model's imports on a 2-core CPU machine, 3 runs each). Afterwards the objects are
frozen (`gc.freeze`), so the run's later full collections skip them too."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The block runs without cyclic garbage collection; what exists after it is frozen out of later collections."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
