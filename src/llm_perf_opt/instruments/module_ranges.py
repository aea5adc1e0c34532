"""Module ranges for the profiled pass: a `record_function("module:<path>")` around every submodule's forward.

Installed only around the profiled pass (the hooks cost host time, so never in a timed pass) and removed after it.
Each kernel is later given to the innermost module range around its launch (`instruments.module_attribution`). Inside
code that torch.compile compiles the hooks do nothing: those kernels are given modules by inductor's provenance
instead (`instruments.compiled_modules`). Dynamo does not guard on the hooks of a module that had none when it compiled,
but it does on the number of hooks of one that had some (the routing recorder's MoE gates): the modules in `skip`
get no range (their eager kernels go to their parent), so the compiled graphs are reused, not compiled again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import attrs
import torch
from torch import nn
from torch.profiler import record_function
from torch.utils.hooks import RemovableHandle

from llm_perf_opt.instruments.profiler_labels import MODULE_LABEL_PREFIX


@attrs.define
class ModuleRanges:
    """What was installed: the hooked modules, and any the hooks could not be put on (with the reason)."""

    hooked: int = 0
    refused: list[str] = attrs.Factory(list)  # "path: reason"
    kept: list[str] = attrs.Factory(list)  # paths of modules left with their own hooks only (`skip`)


def module_types(root: nn.Module) -> dict[str, str]:
    """Every module of `root`: path -> class name (the root's path is "")."""
    return {name: type(module).__name__ for name, module in root.named_modules()}


@contextlib.contextmanager
def module_ranges(root: nn.Module, *, skip: frozenset[str] = frozenset()) -> Iterator[ModuleRanges]:
    """Open a profiler range `module:<path>` for each forward call of `root` and every submodule, while inside (the
    root's path is ""), except the modules at the paths in `skip` (hooked modules a compiled graph traced: it guards
    on how many hooks they have)."""
    ranges = ModuleRanges()
    handles: list[RemovableHandle] = []
    open_ranges: dict[int, list[record_function]] = {}

    def enter(label: str) -> Callable[[nn.Module, tuple[object, ...]], None]:
        def pre_hook(module: nn.Module, args: tuple[object, ...]) -> None:
            if torch.compiler.is_compiling():  # traced by Dynamo: no range inside compiled code
                return
            rf = record_function(label)
            rf.__enter__()
            open_ranges.setdefault(id(module), []).append(rf)

        return pre_hook

    def leave(module: nn.Module, args: tuple[object, ...], output: object) -> None:
        if torch.compiler.is_compiling():
            return
        stack = open_ranges.get(id(module))
        if stack:
            stack.pop().__exit__(None, None, None)

    for name, module in root.named_modules():
        if name in skip:
            ranges.kept.append(name)
            continue
        try:
            handles.append(module.register_forward_pre_hook(enter(MODULE_LABEL_PREFIX + name)))
            handles.append(module.register_forward_hook(leave, always_call=True))
            ranges.hooked += 1
        except (RuntimeError, TypeError, AttributeError) as err:  # e.g. a TorchScript module takes no hooks
            ranges.refused.append(f"{name}: {type(err).__name__}: {err}")
    try:
        yield ranges
    finally:
        for handle in handles:
            handle.remove()
        for stack in open_ranges.values():  # ranges an exception left open
            while stack:
                stack.pop().__exit__(None, None, None)
