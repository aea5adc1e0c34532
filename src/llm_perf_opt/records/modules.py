"""Module attribution: which module of the model owns each millisecond of a stage's kernel time, as the profiled
pass measured it (`ModuleTimes`, in `operators.json`) and beside each module's analytic floor, folded by type across
layers (`ModuleAttribution`, in `metrics.json`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

#: How compiled code's kernels are attributed (instruments.compiled_modules).
PROVENANCE_METHOD_NAME = "inductor provenance"

#: The row of the time no module could be given, in every table.
UNATTRIBUTED = "(unattributed)"
#: What a kernel table says where no Stage 1 profiled pass with module attribution was at hand (Stage 2).
NOT_KNOWN = "Launched by — module: not known (no Stage 1 profiled pass with module attribution)"


@attrs.frozen
class KernelSource:
    """One kernel (short name) inside a module, with the operator that launched it."""

    kernel: str
    operator: str  # the innermost host operator around its launch; "" where none (a CUDA-graph replay)
    calls: int
    ms: float  # summed kernel time (GPU) or operator self time (CPU), over the profiled forwards of the stage


@attrs.frozen
class ModuleTime:
    """The kernels one module launched itself (not those of its children) in one stage of the profiled pass."""

    module: str  # the module's path in the model (`named_modules()`), e.g. "model.layers.3.mlp.experts"
    calls: int  # forward calls of the module (0 where only compiled code ran it: no hook fires there)
    kernels: int
    ms: float
    top: tuple[KernelSource, ...] = ()  # its largest kernels


@attrs.frozen
class StageModuleTimes:
    """The kernel time of one stage (innermost stage range: vision sub-stages apart from prefill) by module."""

    stage: str
    forwards: int  # decode steps profiled for "decode/step"; 1 for any other stage (once per profiled pass)
    total_ms: float  # every kernel of the stage, attributed or not
    rows: tuple[ModuleTime, ...]
    unattributed_ms: float
    unattributed_kernels: int
    unattributed_reason: str | None  # why the rest could not be given a module; None when nothing is left
    methods: tuple[str, ...]  # how its kernels were given modules: "module ranges", "inductor provenance", ...


@attrs.frozen
class Launcher:
    """One (operator, module) pair that launched a kernel, over the profiled pass's stages."""

    operator: str  # "" where no operator was around the launch (a CUDA-graph replay, compiled code)
    module: str  # folded across layers ("model.layers.*.mlp"); UNATTRIBUTED where no module could be given
    calls: int
    ms: float


@attrs.frozen
class KernelSources:
    """What launched one kernel (by label: short name plus the functor a generic kernel applies)."""

    kernel: str  # the short name, as in operators.json's kernel table (`kernel_names.short_kernel_name`)
    calls: int
    ms: float  # all its launches inside the stages of the profiled pass
    launchers: tuple[Launcher, ...]  # the largest first (at most a few)

    def shares(self) -> list[tuple[Launcher, float]]:
        """Each launcher with its share of the kernel's time."""
        return [(s, s.ms / self.ms if self.ms > 0 else 0.0) for s in self.launchers]


def merged_sources(entries: Iterable[KernelSources], kernel: str, top: int = 4) -> KernelSources | None:
    """Several labels' sources as one kernel's (`kernel`: the name to give it): launchers summed by (operator,
    module), the largest `top` kept; None when there is none."""
    entries = list(entries)
    if not entries:
        return None
    by: dict[tuple[str, str], list[float]] = {}
    for entry in entries:
        for s in entry.launchers:
            total = by.setdefault((s.operator, s.module), [0, 0.0])
            total[0] += s.calls
            total[1] += s.ms
    ranked = sorted(by.items(), key=lambda kv: -kv[1][1])[:top]
    return KernelSources(
        kernel=kernel,
        calls=sum(e.calls for e in entries),
        ms=sum(e.ms for e in entries),
        launchers=tuple(Launcher(operator=op, module=m, calls=int(v[0]), ms=v[1]) for (op, m), v in ranked),
    )


@attrs.frozen
class ModuleTimes:
    """Kernel time by module and stage, as the profiled pass measured it (`operators.json`)."""

    time_kind: str  # "GPU kernel time" or "CPU operator self time"
    stages: tuple[StageModuleTimes, ...]
    module_types: Mapping[str, str]  # module path -> class name, every module of the model
    analytic_roots: Mapping[str, str]  # analytic module prefix ("sam", "decoder") -> the model's module path
    method_notes: tuple[str, ...] = ()  # the methods in words, and what could not be done
    # kernel label (`kernel_names.kernel_label`) -> its largest launchers; empty in records written before it
    kernel_sources: Mapping[str, KernelSources] = attrs.field(factory=dict)

    def sources_of_kernel(self, short_name: str) -> KernelSources | None:
        """Every label of one short name (`elementwise_kernel [add]`, `… [copy]`) merged."""
        return merged_sources((e for e in self.kernel_sources.values() if e.kernel == short_name), short_name)


@attrs.frozen
class ModuleFloorRow:
    """One module (or a group folded across layers) of one stage: its time beside its floor, per forward."""

    module: str  # path, or a folded pattern such as "model.layers.*.mlp.experts"
    module_type: str
    members: int  # modules folded into the row
    calls: int
    kernels: int
    ms: float  # per forward of the stage
    share: float  # of the stage's kernel time
    flops: float | None  # analytic, per forward; None where the analytic model prices nothing here
    bytes: float | None
    floor_ms: float | None  # speed of light: Σ max(FLOPs / peak, bytes / bandwidth) of its analytic parts
    top_kernel: str | None  # its largest kernel, "name (operator)"

    @property
    def above_floor_ms(self) -> float | None:
        return None if self.floor_ms is None else max(self.ms - self.floor_ms, 0.0)

    @property
    def ratio(self) -> float | None:
        return None if not self.floor_ms else self.ms / self.floor_ms


@attrs.frozen
class StageModules:
    """A stage's modules folded by type across layers, sorted by time above the floor."""

    stage: str
    forwards: int
    total_ms: float  # per forward
    floor_ms: float | None  # per forward, the modules' floors summed
    rows: tuple[ModuleFloorRow, ...]
    unattributed_ms: float  # per forward
    unattributed_reason: str | None
    methods: tuple[str, ...]

    @property
    def attributed_share(self) -> float:
        return 1.0 - self.unattributed_ms / self.total_ms if self.total_ms > 0 else 0.0


@attrs.frozen
class ModuleAttribution:
    """Module attribution of the profiled pass beside the analytic floors (`metrics.json`)."""

    time_kind: str
    stages: tuple[StageModules, ...]
    floors: str | None  # the peaks the floors use, in words; None without an analytic model or peaks
    method_notes: tuple[str, ...] = ()


@attrs.frozen
class ModuleChange:
    """How one folded module's time per forward moved from a baseline run to another (a what-if rung)."""

    module: str
    base_ms: float  # 0 where the module had no kernels in the baseline
    other_ms: float
    delta_ms: float


@attrs.frozen
class StageModuleChanges:
    """A stage's time per forward from a baseline to another run by module: the largest moves, the rest summed."""

    stage: str
    base_ms: float
    other_ms: float
    changes: tuple[ModuleChange, ...]  # the largest |delta| first
    rest_delta_ms: float  # the modules not listed, and the change of the unattributed time
