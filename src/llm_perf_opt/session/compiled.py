"""torch.compile of the decoder's step functions, with the compilation cost measured apart from the steps.

Each call of a :class:`CompiledStep` is timed on the host; a call during which TorchDynamo compiled frames is a
compile event (the first call of a shape, or a recompile after a guard failure), recorded with its host time,
frames compiled and graph breaks. CUDA-graph capture (``mode="reduce-overhead"``) happens in the first calls of
each shape; stage1-run gives a compiled runtime the warm-up passes that absorb it (`RuntimeSettings.warmup_needed`)
and records any compile event that still falls in a timed pass. Graph skips are counted from inductor's counters.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from llm_perf_opt.errors import UserError
from llm_perf_opt.records.stage1 import CUDA_GRAPH_MODES, CompileEvent, CompileOption


def compile_function(fn: Callable[..., Any], mode: str, options: tuple[CompileOption, ...] = ()) -> Callable[..., Any]:
    """`torch.compile(fn, mode=mode)`; with `options`, the mode's own inductor options with these set on top
    (torch.compile takes a mode or options, not both). Tests replace this to trace with a cheap backend."""
    if not options:
        return torch.compile(fn, mode=mode)
    from torch._inductor import list_mode_options

    chosen: dict[str, Any] = {**list_mode_options(mode), **dict(options)}
    return torch.compile(fn, options=chosen)


def _dynamo_counts() -> tuple[int, int, int]:
    from torch._dynamo.utils import counters

    breaks = sum(counters["graph_break"].values())
    return int(counters["frames"]["ok"]), int(breaks), int(counters["inductor"]["cudagraph_skips"])


class CompiledStep:
    """A step function compiled with `mode`; calls it, marks CUDA-graph steps, records compile events."""

    def __init__(
        self, name: str, fn: Callable[..., Any], mode: str, setting: str, options: tuple[CompileOption, ...] = ()
    ) -> None:
        self.name = name
        self.mode = mode
        self.setting = setting  # the runtime.compile value, for error messages
        self.cuda_graphs = mode in CUDA_GRAPH_MODES
        self._fn = compile_function(fn, mode, options)
        self._calls = 0
        self._compiled_before = False
        self.events: list[CompileEvent] = []

    def __call__(self, shape: tuple[int, ...], *args: Any, **kwargs: Any) -> Any:
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()  # outputs of the previous replay may be overwritten now
        frames0, breaks0, _ = _dynamo_counts()
        self._calls += 1
        start = time.perf_counter()
        try:
            out = self._fn(*args, **kwargs)
        except torch._dynamo.exc.TorchDynamoException as exc:
            raise self._failure(exc) from exc
        frames1, breaks1, _ = _dynamo_counts()
        if frames1 > frames0:
            self.events.append(
                CompileEvent(
                    function=self.name,
                    shape=shape,
                    call=self._calls,
                    host_ms=(time.perf_counter() - start) * 1e3,
                    frames=frames1 - frames0,
                    graph_breaks=breaks1 - breaks0,
                    recompile=self._compiled_before,
                )
            )
            self._compiled_before = True
        return out

    def _failure(self, exc: Exception) -> UserError:
        cause = getattr(exc, "inner_exception", None) or exc  # a backend's own error, when it raised one
        lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
        text = " ".join(lines)[:400]
        return UserError(
            f"runtime.compile={self.setting}: torch.compile (mode {self.mode}, torch {torch.__version__}) failed on "
            f"the {self.name} step: {type(cause).__name__}: {text}",
            "Set runtime.compile=none to run eagerly, or try another runtime.compile_mode "
            "(default, max-autotune-no-cudagraphs)",
        )


def cudagraph_skips() -> int:
    """Times inductor declined to capture a CUDA graph in this process so far."""
    return _dynamo_counts()[2]
