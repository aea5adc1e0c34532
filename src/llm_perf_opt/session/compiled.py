"""torch.compile of the decoder's step functions and of the vision modules' forwards, with the compilation cost
measured apart from the steps.

A call of a :class:`CompiledStep` during which TorchDynamo compiled frames (a shape's first call, or a recompile
after a guard failure) is a compile event, with its host time, frames and graph breaks. CUDA-graph capture happens
in the first calls of each shape: stage1-run gives a compiled runtime warm-up passes to absorb it
(`RuntimeSettings.warmup_needed`) and records any compile event still in a timed pass.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode
from torch.utils._pytree import tree_map_only

from llm_perf_opt.errors import UserError
from llm_perf_opt.records.stage1 import CUDA_GRAPH_MODES, MODE_KEYS, CompileEvent, CompileOption

log = logging.getLogger("llm_perf_opt.compile")


def compile_function(
    fn: Callable[..., Any], mode: str, options: tuple[CompileOption, ...] = (), dynamic: bool | None = None
) -> Callable[..., Any]:
    """`torch.compile(fn, mode=mode, dynamic=dynamic)`; with `options`, the mode's own inductor options with these
    on top (torch.compile takes a mode or options, not both). Tests replace this with a cheap backend."""
    warm_compile_workers()
    shapes: dict[str, Any] = {} if dynamic is None else {"dynamic": dynamic}
    if not options:
        return torch.compile(fn, mode=mode, **shapes)
    from torch._inductor import list_mode_options

    chosen: dict[str, Any] = {**list_mode_options(mode), **dict(options)}
    return torch.compile(fn, options=chosen, **shapes)


@functools.cache
def warm_compile_workers() -> None:
    """Start inductor's compile workers now (once per process): torch starts them only when the first graph reaches
    inductor, compiling its Triton kernels serially until they are up; started here, they come up during the untimed
    model build, FLOP count and first prefill."""
    try:
        from torch._inductor.async_compile import maybe_warm_pool
    except ImportError as exc:
        log.info("inductor's compile workers start with the first compile: %s", exc)
        return
    maybe_warm_pool()


def _dynamo_counts() -> tuple[int, int, int]:
    from torch._dynamo.utils import counters

    breaks = sum(counters["graph_break"].values())
    return int(counters["frames"]["ok"]), int(breaks), int(counters["inductor"]["cudagraph_skips"])


class CompiledStep:
    """A step function compiled with `mode`; calls it, marks CUDA-graph steps, records compile events."""

    def __init__(
        self,
        name: str,
        fn: Callable[..., Any],
        mode: str,
        setting: str,
        options: tuple[CompileOption, ...] = (),
        key: str = "runtime.compile",
        dynamic: bool | None = None,
    ) -> None:
        self.name = name
        self.mode = mode
        self.setting = setting  # the value of `key`, for error messages
        self.key = key
        self.cuda_graphs = mode in CUDA_GRAPH_MODES
        self._fn = compile_function(fn, mode, options, dynamic)
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
        mode_key = MODE_KEYS[self.key]
        return UserError(
            f"{self.key}={self.setting}: torch.compile (mode {self.mode}, torch {torch.__version__}) failed on "
            f"the {self.name} step: {type(cause).__name__}: {text}",
            f"Set {self.key}=none to run eagerly, or try another {mode_key} (default, max-autotune-no-cudagraphs)",
        )


class CompiledForward:
    """A module's forward replaced by its compiled form (`runtime.compile_vision`; the module's hooks stay outside).
    It runs the eager forward under a dispatch mode (the FLOP counter: compiled code would hide its operators) or
    while `eager` is set, and with CUDA graphs hands back copies (a later replay may overwrite its outputs)."""

    def __init__(self, module: nn.Module, stage: str, mode: str) -> None:
        self.module = module
        self.original = module.forward
        # whether the instance had a forward of its own (patched before): else restoring removes the attribute, so
        # the class's forward is found again as before
        self.own_forward = "forward" in vars(module)
        # one static graph per view shape (a page has two: tiles and the global view); a dynamic-shape recompile of
        # SAM took minutes on the H100
        self.step = CompiledStep(stage, self.original, mode, setting=mode, key="runtime.compile_vision", dynamic=False)
        self.eager = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.eager or _get_current_dispatch_mode() is not None:
            return self.original(*args, **kwargs)
        first = args[0] if args else None
        shape = tuple(first.shape) if isinstance(first, torch.Tensor) else ()
        out = self.step(shape, *args, **kwargs)
        return tree_map_only(torch.Tensor, torch.Tensor.clone, out) if self.step.cuda_graphs else out


def compile_forwards(modules: Mapping[str, nn.Module], mode: str) -> tuple[CompiledForward, ...]:
    """Each module's forward compiled in `mode` (stage name -> module), in place; `restore_forwards` undoes it."""
    out = []
    for stage, module in modules.items():
        forward = CompiledForward(module, stage, mode)
        module.forward = forward
        out.append(forward)
    return tuple(out)


def restore_forwards(forwards: Sequence[CompiledForward]) -> None:
    """The modules' own forwards back."""
    for forward in forwards:
        if forward.own_forward:
            forward.module.forward = forward.original
        else:
            del forward.module.forward


@contextmanager
def eager_forwards(forwards: Sequence[CompiledForward]) -> Iterator[None]:
    """Within the block, the compiled forwards run their eager originals."""
    for forward in forwards:
        forward.eager = True
    try:
        yield
    finally:
        for forward in forwards:
            forward.eager = False


def cudagraph_skips() -> int:
    """Times inductor declined to capture a CUDA graph in this process so far."""
    return _dynamo_counts()[2]
