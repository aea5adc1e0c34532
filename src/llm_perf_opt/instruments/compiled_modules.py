"""Which nn.Module produced each kernel of a torch.compile'd (inductor) graph, CUDA-graph replays included.

Forward hooks do not fire inside compiled code and kernels replayed from a CUDA graph carry no host context, so the
mapping comes from inductor itself, in two parts:

1. **Recording while compiling** (:class:`InductorProvenance`). Installed once per process before the first compiled
   call, it wraps inductor's entry point `torch._inductor.compile_fx.compile_fx`, which TorchDynamo's inductor backend
   imports at each compile. For every graph it reads the Dynamo (pre-grad) FX graph's `node.meta["nn_module_stack"]`
   (node name -> innermost module, resolved to a `root.named_modules()` name) and, once inductor returns, the generated
   wrapper module that compile loaded into `PyCodeCache` (its `call()` lists the kernel launches in order, each after a
   `# Topologically Sorted Source Nodes: [...]` comment naming the pre-grad nodes it computes). Not
   `torch._inductor.config.pre_grad_custom_pass`: a custom pass is part of the FX-graph cache key (without `uuid()` it
   bypasses the cache) and, in torch 2.13's "late" pass timing, does not run on a cache hit. The wrapper sees every
   Dynamo graph before any cache and changes no config, cache key or generated code; a cache hit (FX-graph or
   AOTAutograd, this process or an earlier one) still loads the wrapper module, read the same way. Limits: graphs
   compiled before `install()` are not recorded; a graph whose identical code was already loaded in this process adds no
   new module and is recorded without launches (with the reason); inductor's CPU (C++) kernels carry no source comment
   in torch 2.11-2.13, so their launches have no module (only extern calls do on CPU).
2. **Matching** (:func:`match_kernels`, pure): the profiler's kernels of one execution of a graph, in start
   order, against the parsed launch order. Inductor-named kernels (`triton_…`, `cpp_…`) are anchors; the
   kernels between two anchors belong to the extern calls (cuBLAS, cutlass, aten) between them: one to one when
   the counts agree, else all to the externs' common module.

All access to torch internals is in `_inductor_entry` and `_loaded_code_modules`; any failure becomes a reason
string, never an exception.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs
import torch

log = logging.getLogger("llm_perf_opt.compiled_modules")


@attrs.frozen
class KernelLaunch:
    """One launch in a compiled graph's wrapper code: an inductor kernel (`kernel` its name) or an extern call
    (`kernel` None), what it computes (`op`), its source nodes and module (None when unknown)."""

    kernel: str | None
    op: str
    source_nodes: tuple[str, ...] = ()
    module: str | None = None
    spans_modules: bool = False  # its source nodes belong to more than one module


@attrs.frozen
class CompiledGraph:
    """One graph inductor compiled: its node -> module map and its launches in order (empty, with `note`, when
    the generated code could not be read)."""

    index: int
    node_modules: Mapping[str, str]
    launches: tuple[KernelLaunch, ...] = ()
    note: str = ""


@attrs.frozen
class KernelMatch:
    """The module of each profiled kernel (None where unknown), `matched` kernels with a module, `anchors` tied to
    an inductor launch, `launch` the index into the graph's launches per kernel, and a note when nothing matched."""

    modules: tuple[str | None, ...]
    launch: tuple[int | None, ...]
    matched: int
    anchors: int
    note: str = ""


# ---- module paths --------------------------------------------------------------------------------------------

_GETATTR = re.compile(r"getattr\(\s*([^()]*?)\s*,\s*['\"]([^'\"]+)['\"]\s*\)")
_SUBSCRIPT = re.compile(r"\[\s*['\"]?([^'\"\]]+?)['\"]?\s*\]")
_SKIPPED_PARTS = {"_modules", "_orig_mod", "__self__", "__closure__", "cell_contents", "__dict__"}


def normalise_module_path(path: str) -> str:
    """Dynamo's module path as a dotted path: `L['self'].model.layers[0]`, `L['self']._modules['model']`,
    `getattr(L['m'], 'x')`, `self.layers.0` -> `model.layers.0`, `model`, `x`, `layers.0`."""
    text = path.strip()
    previous = None
    while previous != text:  # getattr(getattr(a, 'b'), 'c') from the inside out
        previous = text
        text = _GETATTR.sub(lambda m: f"{m.group(1)}.{m.group(2)}", text)
    text = re.sub(r"^(?:L|G)\[\s*['\"][^'\"]*['\"]\s*\]", "", text)  # the frame's local or global it starts from
    text = _SUBSCRIPT.sub(lambda m: "." + m.group(1), text)
    parts = [p for p in text.split(".") if p and p not in _SKIPPED_PARTS]
    if parts and parts[0] in ("self", "L", "G"):
        parts = parts[1:]
    return ".".join(parts)


class ModuleNames:
    """Resolves normalised Dynamo paths to `root.named_modules()` names by suffix match (cached per path)."""

    def __init__(self, names: Sequence[str]) -> None:
        self._names = set(names)
        self._by_suffix: dict[str, list[str]] = {}
        for name in names:
            parts = name.split(".") if name else []
            for i in range(1, len(parts)):
                self._by_suffix.setdefault(".".join(parts[i:]), []).append(name)
        self._cache: dict[str, str] = {}

    def resolve(self, path: str) -> str:
        """The module name of Dynamo path `path`; the normalised path itself when no module matches."""
        if path in self._cache:
            return self._cache[path]
        found = normal = normalise_module_path(path)
        parts = normal.split(".") if normal and normal not in self._names else []
        for i in range(len(parts)):  # the longest suffix of the path that names a module, or one that ends one
            suffix = ".".join(parts[i:])
            longer = self._by_suffix.get(suffix, [])
            if suffix in self._names or len(longer) == 1:
                found = suffix if suffix in self._names else longer[0]
                break
        self._cache[path] = found
        return found


def common_module(paths: Sequence[str]) -> str:
    """The deepest module enclosing all of `paths` ("" = the root)."""
    common: list[str] = []
    for parts in zip(*(p.split(".") if p else [] for p in paths), strict=False):  # each depth: every path's part
        if len(set(parts)) > 1:
            break
        common.append(parts[0])
    return ".".join(common)


def node_modules(graph: torch.fx.Graph, names: ModuleNames) -> dict[str, str]:
    """FX node name -> module name, from each node's innermost `nn_module_stack` entry."""
    out: dict[str, str] = {}
    for node in graph.nodes:
        stack = node.meta.get("nn_module_stack") or {}
        if not stack:
            continue
        innermost = list(stack.values())[-1]
        path = innermost[0] if isinstance(innermost, tuple) else str(innermost)
        out[node.name] = names.resolve(str(path))
    return out


# ---- the generated wrapper code ---------------------------------------------------------------------------------

_KERNEL_DEF = re.compile(r"^(\w+) = async_compile\.\w+\(")
_SOURCE_NODES = re.compile(
    r"^\s*# (?:Topologically Sorted|Unsorted) Source Nodes: \[([^\]]*)\], Original ATen: \[([^\]]*)\]"
)
_DEF = re.compile(r"^(\s*)def (\w+)\(")
_PARTITION = re.compile(r"(?:self\.partitions\[(\d+)\]|\bpartition_(\d+))\(")
_EXTERN = re.compile(r"(?<![\w.])extern_kernels\.(\w+)\(")
_OP_CALL = re.compile(r"(?<![\w.])(?:torch\.ops\.(\w+)|(aten))\.(\w+)(?:\.\w+)?\(")
_CALLED = re.compile(r"(?<![\w.])(\w+)(?:\.run)?\(")
# aten ops the wrapper calls that launch no kernel (views and allocations)
_NO_KERNEL_OPS = {
    "view", "reshape", "_reshape_alias", "as_strided", "alias", "expand", "permute", "t", "squeeze", "unsqueeze",
    "select", "slice", "detach", "_unsafe_view", "empty", "empty_strided", "_alloc_from_pool", "resize_storage_bytes_",
}  # fmt: skip

_Item = tuple[str, str | None, str, tuple[str, ...]]  # ("launch"|"inline", kernel, op, source nodes)


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _launch_in(line: str, kernels: set[str]) -> tuple[str | None, str] | None:
    """(kernel, op) when `line` launches an inductor kernel or calls an extern kernel, else None."""
    if m := _EXTERN.search(line):
        return None, f"aten.{m.group(1)}"
    if (m := _OP_CALL.search(line)) and m.group(3) not in _NO_KERNEL_OPS:
        return None, f"{m.group(1) or m.group(2)}.{m.group(3)}"
    for m in _CALLED.finditer(line):
        if m.group(1) in kernels:
            return m.group(1), ""
    return None


def _scan(source: str) -> tuple[dict[str, list[_Item]], set[str], dict[str, tuple[tuple[str, ...], str]]]:
    """Per function: its launches and partition calls in order; the kernel names; each kernel's definition
    comment (source nodes, ATen ops)."""
    functions: dict[str, list[_Item]] = {}
    kernels: set[str] = set()
    defined: dict[str, tuple[tuple[str, ...], str]] = {}
    stack: list[tuple[int, str]] = []
    pending: tuple[tuple[str, ...], str] | None = None
    in_string = False
    for line in source.splitlines():
        quotes = line.count("'''") + line.count('"""')
        if in_string or not line.strip():
            in_string = in_string != (quotes % 2 == 1)
            continue
        in_string = quotes % 2 == 1
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if m := _SOURCE_NODES.match(line):
            pending = (_names(m.group(1)), ", ".join(_names(m.group(2))))
        elif m := _DEF.match(line):
            stack.append((indent, m.group(2)))
            functions[m.group(2)] = []
        elif indent == 0 and (m := _KERNEL_DEF.match(line)):
            kernels.add(m.group(1))
            if pending is not None:
                defined[m.group(1)] = pending
            pending = None
        elif stack:
            pending = _function_line(line, functions[stack[-1][1]], kernels, pending)
    return functions, kernels, defined


def _function_line(
    line: str, items: list[_Item], kernels: set[str], pending: tuple[tuple[str, ...], str] | None
) -> tuple[tuple[str, ...], str] | None:
    """Adds the launch or partition call on `line` to `items`; returns the source-node comment still pending."""
    if m := _PARTITION.search(line):
        items.append(("inline", None, f"partition_{m.group(1) or m.group(2)}", ()))
        return pending
    found = _launch_in(line, kernels)
    if found is None:
        return pending
    kernel, op = found
    nodes, aten = pending if pending is not None else ((), "")
    items.append(("launch", kernel, op or aten, nodes))
    return None


def _expand(functions: Mapping[str, list[_Item]], name: str, depth: int = 0) -> list[_Item]:
    """The launches of function `name` in order, partition calls replaced by the partitions' launches."""
    out: list[_Item] = []
    for item in functions.get(name, []):
        if item[0] == "inline":
            if depth < 4 and item[2] != name:
                out.extend(_expand(functions, item[2], depth + 1))
        else:
            out.append(item)
    return out


def _launch(kernel: str | None, op: str, nodes: tuple[str, ...], modules: Mapping[str, str]) -> KernelLaunch:
    """A launch with its module: an extern call's is its last source node's (the node it computes; the earlier
    ones are inputs inductor folded into it), a fused kernel's the deepest module enclosing all its nodes."""
    known = [modules[n] for n in nodes if n in modules]
    module = (known[-1] if kernel is None else common_module(known)) if known else None
    spans = len(set(known)) > 1
    return KernelLaunch(kernel=kernel, op=op or (kernel or ""), source_nodes=nodes, module=module, spans_modules=spans)


def parse_wrapper(source: str, modules: Mapping[str, str]) -> tuple[KernelLaunch, ...] | str:
    """The kernel launches of inductor's generated wrapper code `source`, in the order `call()` makes them, each
    with its module from `modules` (node name -> module); a reason string when the code has no `call()`."""
    functions, kernels, defined = _scan(source)
    if "call" not in functions:
        return "inductor's generated code has no call() function"
    launches = []
    for _, kernel, op, nodes in _expand(functions, "call"):
        if kernel is not None and not nodes and kernel in defined:
            nodes, op = defined[kernel][0], op or defined[kernel][1]  # no comment at the launch: the definition's
        launches.append(_launch(kernel, op, nodes, modules))
    if not launches and kernels:
        return f"inductor's generated code defines {len(kernels)} kernels but call() launches none that were recognised"
    return tuple(launches)


# ---- recording while compiling ----------------------------------------------------------------------------------


def _inductor_entry() -> tuple[ModuleType, Callable[..., Any]] | str:
    """`torch._inductor.compile_fx` and its `compile_fx` (what torch.compile's inductor backend calls)."""
    try:
        import torch._inductor.compile_fx as entry
    except Exception as exc:  # noqa: BLE001 - any import failure means no mapping, with its reason
        return f"torch._inductor.compile_fx could not be imported ({type(exc).__name__}: {exc})"
    function = getattr(entry, "compile_fx", None)
    if not callable(function):
        return f"torch {torch.__version__} has no torch._inductor.compile_fx.compile_fx"
    return entry, function


def _loaded_code_modules() -> list[ModuleType] | str:
    """The Python modules inductor has loaded in this process (generated wrappers among them), oldest first."""
    try:
        from torch._inductor.codecache import PyCodeCache
    except Exception as exc:  # noqa: BLE001 - any import failure means no mapping, with its reason
        return f"torch._inductor.codecache.PyCodeCache could not be imported ({type(exc).__name__}: {exc})"
    modules = getattr(PyCodeCache, "modules", None)
    if not isinstance(modules, list):
        return f"torch {torch.__version__}'s PyCodeCache keeps no list of loaded modules"
    return list(modules)


def _wrapper_source(new: Sequence[ModuleType]) -> tuple[str, str] | str:
    """(path, source) of the generated wrapper among the newly loaded modules `new`, else the reason."""
    reasons = []
    for module in reversed(new):
        path = getattr(module, "__file__", None)
        if not path or not callable(getattr(module, "call", None)):
            continue
        try:
            return str(path), Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            reasons.append(f"{path}: {exc}")
    if reasons:
        return "inductor's generated code could not be read: " + "; ".join(reasons)
    return (
        "inductor's generated code could not be read: the compile loaded no new wrapper module "
        "(the same code was loaded earlier in this process)"
    )


class InductorProvenance:
    """Records, for every graph inductor compiles while installed, its node -> module map and its kernel launches
    (`graphs`); `notes` holds any reason something could not be recorded. Install once per process before the
    first compiled call: `with InductorProvenance(model) as provenance: ...` or `install()` / `uninstall()`."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.names = ModuleNames([name for name, _ in root.named_modules()])
        self.graphs: list[CompiledGraph] = []
        self.notes: list[str] = []
        self._entry: Any = None  # torch._inductor.compile_fx, once installed
        self._original: Callable[..., Any] | None = None
        self._depth = 0

    def install(self) -> str | None:
        """Wraps inductor's entry point; None when installed, else why not (nothing is then recorded)."""
        if self._original is not None:
            return None
        found = _inductor_entry()
        if isinstance(found, str):
            self.notes.append(found)
            return found
        self._entry, self._original = found
        self._entry.compile_fx = self._compile_fx
        return None

    def uninstall(self) -> None:
        """Puts inductor's own entry point back (only if nobody wrapped it after us)."""
        if self._entry is not None and self._original is not None:
            if getattr(self._entry, "compile_fx", None) == self._compile_fx:
                self._entry.compile_fx = self._original
            else:
                self.notes.append("torch._inductor.compile_fx.compile_fx was wrapped again after install(); left")
        self._entry, self._original = None, None

    def __enter__(self) -> InductorProvenance:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def _compile_fx(self, model: Any, example_inputs: Any, *args: Any, **kwargs: Any) -> Any:
        original = self._original
        assert original is not None, "called only while installed"
        if self._depth:  # compile_fx calls itself (config patches, subgraphs): the outermost call records
            return original(model, example_inputs, *args, **kwargs)
        try:
            modules = self._node_modules(model)  # read first: compile_fx takes ownership of the graph
        except Exception as exc:  # noqa: BLE001 - recording never breaks a compile; the reason is kept
            self.notes.append(f"graph {len(self.graphs)}: its nodes' modules could not be read ({exc!r})")
            modules = {}
        before = _loaded_code_modules()
        self._depth += 1
        try:
            out = original(model, example_inputs, *args, **kwargs)
        finally:
            self._depth -= 1
        try:
            self._record(modules, before)
        except Exception as exc:  # noqa: BLE001 - recording never breaks a compile; the reason is kept
            self.notes.append(f"graph {len(self.graphs)}: inductor's generated code could not be parsed ({exc!r})")
        return out

    def _node_modules(self, model: object) -> dict[str, str]:
        graph = getattr(model, "graph", None)
        if graph is None:
            self.notes.append(f"graph {len(self.graphs)}: inductor was given no FX graph ({type(model).__name__})")
            return {}
        return node_modules(graph, self.names)

    def _record(self, modules: dict[str, str], before: list[ModuleType] | str) -> None:
        index = len(self.graphs)
        after = _loaded_code_modules()
        if isinstance(before, str) or isinstance(after, str):
            code: tuple[str, str] | str = "inductor's generated code could not be read: " + str(
                before if isinstance(before, str) else after
            )
        else:
            seen = {id(m) for m in before}
            code = _wrapper_source([m for m in after if id(m) not in seen])
        launches = code if isinstance(code, str) else parse_wrapper(code[1], modules)
        if isinstance(launches, str):
            self.graphs.append(CompiledGraph(index=index, node_modules=modules, note=launches))
            self.notes.append(f"graph {index}: {launches}")
        else:
            self.graphs.append(CompiledGraph(index=index, node_modules=modules, launches=launches))


# ---- matching the profiler's kernels --------------------------------------------------------------------------


def kernel_of(name: str, kernels: Sequence[str]) -> str | None:
    """The inductor kernel a profiled kernel name is, if any: the name itself, or the longest of `kernels` inside
    it between word boundaries (`graph_0_cpp_fused_add_0` -> `cpp_fused_add_0`; `…_add_1` is not in `…_add_10`)."""
    if name in kernels:
        return name
    best = None
    for kernel in kernels:
        at = name.find(kernel)
        while at >= 0:
            end = at + len(kernel)
            left_ok = at == 0 or not name[at - 1].isalnum()
            right_ok = end == len(name) or not name[end].isalnum()
            if left_ok and right_ok and (best is None or len(kernel) > len(best)):
                best = kernel
                break
            at = name.find(kernel, at + 1)
    return best


def _anchors(launches: Sequence[KernelLaunch], observed: Sequence[str]) -> list[tuple[int, int]]:
    """(observed index, launch index) of each profiled kernel tied to an inductor launch, in order: each anchor
    takes the next launch of its kernel after the previous anchor's."""
    names = sorted({launch.kernel for launch in launches if launch.kernel is not None})
    pairs: list[tuple[int, int]] = []
    next_launch = 0
    for i, name in enumerate(observed):
        kernel = kernel_of(name, names)
        if kernel is None:
            continue
        for j in range(next_launch, len(launches)):
            if launches[j].kernel == kernel:
                pairs.append((i, j))
                next_launch = j + 1
                break
    return pairs


def _between(
    launches: Sequence[KernelLaunch], unknown: range, externs: range
) -> list[tuple[int, str | None, int | None]]:
    """(observed index, module, launch index) for the kernels `unknown` between two anchors, given the launches
    `externs` between the same anchors: one to one when as many externs, else all to the externs' common module."""
    calls = [j for j in externs if launches[j].kernel is None]
    if not calls or not unknown:
        return [(i, None, None) for i in unknown]
    if len(calls) == len(unknown):
        return [(i, launches[j].module, j) for i, j in zip(unknown, calls, strict=True)]
    known = [m for m in (launches[j].module for j in calls) if m is not None]
    module = common_module(known) if known else None
    return [(i, module, None) for i in unknown]


def match_kernels(launches: Sequence[KernelLaunch], observed: Sequence[str]) -> KernelMatch:
    """The module of each kernel in `observed` (the profiler's kernels of one execution of the graph whose wrapper
    made `launches`, in start order); inductor-named kernels anchor the alignment, the others go to the extern
    calls between the same anchors."""
    modules: list[str | None] = [None] * len(observed)
    at: list[int | None] = [None] * len(observed)
    if not launches or not observed:
        why = "no launches were parsed for this graph" if not launches else "no kernels were profiled"
        return KernelMatch(modules=tuple(modules), launch=tuple(at), matched=0, anchors=0, note=why)
    pairs = _anchors(launches, observed)
    if not pairs:  # nothing ties this execution to the graph: the externs' common module would be a guess
        why = "no profiled kernel matched an inductor kernel of this graph (no anchor)"
        return KernelMatch(modules=tuple(modules), launch=tuple(at), matched=0, anchors=0, note=why)
    bounds = [(-1, -1), *pairs, (len(observed), len(launches))]
    for (i0, j0), (i1, j1) in itertools.pairwise(bounds):
        for i, module, j in _between(launches, range(i0 + 1, i1), range(j0 + 1, j1)):
            modules[i], at[i] = module, j
    for i, j in pairs:
        modules[i], at[i] = launches[j].module, j
    matched = sum(m is not None for m in modules)
    note = "" if matched else "no profiled kernel could be tied to a launch of this graph"
    return KernelMatch(modules=tuple(modules), launch=tuple(at), matched=matched, anchors=len(pairs), note=note)


def match_best(graphs: Sequence[CompiledGraph], observed: Sequence[str]) -> tuple[int | None, KernelMatch]:
    """The recorded graph whose launches `observed` fits best (most anchors, then most matched) and the match;
    (None, an empty match with the reason) when no graph has launches."""
    best: tuple[int | None, KernelMatch] | None = None
    for graph in graphs:
        if not graph.launches:
            continue
        match = match_kernels(graph.launches, observed)
        if best is None or (match.anchors, match.matched) > (best[1].anchors, best[1].matched):
            best = (graph.index, match)
    if best is None:
        empty = (None,) * len(observed)
        why = "no compiled graph with parsed launches was recorded"
        return None, KernelMatch(modules=empty, launch=empty, matched=0, anchors=0, note=why)
    return best


def compiled_resolver(provenance: InductorProvenance) -> Callable[[Sequence[str]], Sequence[str | None]]:
    """A resolver for `instruments.module_attribution`: the kernels compiled code launched in one stage forward, in
    launch order, aligned with the recorded graph that fits them best — or with every recorded graph's launches
    in compile order, for a forward that runs several graphs (graph breaks, partitions)."""

    def resolve(observed: Sequence[str]) -> Sequence[str | None]:
        graphs = list(provenance.graphs)
        every = tuple(launch for graph in graphs for launch in graph.launches)
        candidates = [*graphs, CompiledGraph(index=-1, node_modules={}, launches=every)] if len(graphs) > 1 else graphs
        index, match = match_best(candidates, observed)
        log.info(
            "inductor provenance: %d kernels against %d recorded graph(s) (%s launches); graph %s: %d anchors, "
            "%d placed%s",
            len(observed), len(graphs), ", ".join(str(len(g.launches)) for g in graphs) or "no", index,
            match.anchors, match.matched, f" ({match.note})" if match.note else "",
        )  # fmt: skip
        return match.modules

    return resolve
