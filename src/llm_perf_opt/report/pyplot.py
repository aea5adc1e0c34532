"""matplotlib's pyplot, imported when the first plot is drawn, not when a report module is imported: its import takes
a few tenths of a second, and on a machine's first run matplotlib also builds its font cache. A run that will plot
calls :func:`preload` early, so the import happens on a background thread while the model builds."""

from __future__ import annotations

import functools
import logging
import sys
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import ParamSpec, TypeVar

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

_preloading: threading.Thread | None = None
_preload_lock = threading.Lock()


def _import() -> ModuleType:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def pyplot() -> ModuleType:
    """`matplotlib.pyplot` on the Agg backend (waiting for a :func:`preload` under way rather than importing beside
    it)."""
    if _preloading is not None:
        _preloading.join()
    return _import()


def preload() -> None:
    """Import pyplot (and build matplotlib's font cache where none is saved) on a background thread; once per
    process."""
    global _preloading
    with _preload_lock:
        if _preloading is not None:
            return

        def run() -> None:
            started = time.perf_counter()
            try:
                _import()
            except (ImportError, OSError, RuntimeError, ValueError) as exc:  # the plots meet it again and raise
                log.warning("importing matplotlib in the background failed: %s: %s", type(exc).__name__, exc)
                return
            log.debug("matplotlib imported in the background in %.1f s", time.perf_counter() - started)

        _preloading = threading.Thread(target=run, name="matplotlib-preload", daemon=True)
        _preloading.start()


def _open_figures() -> set[int]:
    """The numbers of pyplot's open figures (none before pyplot is imported)."""
    plt = sys.modules.get("matplotlib.pyplot")
    return set(plt.get_fignums()) if plt is not None else set()


def closes_its_figures(draw: Callable[P, R]) -> Callable[P, R]:
    """`draw`, closing the figures it opened when it raises: pyplot holds every figure until it is closed, so a plot
    that fails half-drawn would otherwise stay in memory for the rest of the process."""

    @functools.wraps(draw)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
        before = _open_figures()
        try:
            return draw(*args, **kwargs)
        except BaseException:
            opened = _open_figures() - before
            if opened:
                plt = sys.modules["matplotlib.pyplot"]
                for number in opened:
                    plt.close(number)
            raise

    return guarded
