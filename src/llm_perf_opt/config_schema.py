"""The typed schema of the commands' own config nodes (`stage1-run`'s `run`, `infer`, `outputs`, `runtime`, `report`,
`hardware`; `perf-whatif`'s `whatif`, `whatif_run`; `stage2-profile`'s `stage2`) and of the config groups typed so far
(`model`, one schema per family; `dataset`, `analytic`, `pipeline/torch_profiler`, `pipeline/memory`,
`pipeline/energy`, `pipeline/nsys`, `pipeline/ncu`): each setting's type, default, range and doc, in one place.

Plain dataclasses, torch-free and free of the config libraries, so any layer may read a typed node. `conf/` registers
them in Hydra's ConfigStore (`SCHEMAS`): `stage1_schema` is the first entry of `conf/stage1.yaml`'s defaults list, so
Hydra composes every command built on `stage1` (stage2-profile and perf-whatif include it) onto these nodes, and
`whatif_schema` follows `stage1` in `conf/whatif.yaml`'s; a key they lack or a value of the wrong type is refused when
the config is composed, and the YAML holds none of their defaults (a what-if preset sets only what it selects).
A field's range (a `setting_kinds` kind: a whole number ≥ 1, one of some words, ...) is declared with its default,
`setting(default, kind)`; `settings_schema.SCHEMA` takes them (`typed_kinds`) and checks them first, for a
one-paragraph error. A field without one is free-form, checked by its reader. OmegaConf takes these field types:
bool, int, float, str, Optional of one of them, nested dataclasses, `dict[str, Any]`, and `Any` where a value may be
a word or a number.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import Field, dataclass, field, fields, is_dataclass
from typing import Any, Final, Optional

from llm_perf_opt.errors import UserError
from llm_perf_opt.records.vocabulary import QUANTIZE_LABELS
from llm_perf_opt.setting_kinds import (
    Choice,
    Flag,
    InductorOptions,
    InsideRun,
    Kind,
    Names,
    Number,
    OutputFolder,
    Whole,
)

# OmegaConf 2.3 reads these annotations at runtime and takes `Optional[int]`, not `int | None`.
# ruff: noqa: UP045

KV_CACHES: Final = ("dynamic", "static")
COMPILE_TARGETS: Final = ("none", "decode", "prefill_decode")
COMPILE_MODES: Final = ("reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs", "default")
OUTPUT_CHECKS: Final = ("auto", "always", "never")
QUANTIZE_MODES: Final = tuple(QUANTIZE_LABELS)  # runtime.quantize: none, then torchao's weight quantizations
#: Decode length a run may ask for when the model's config states no max_position_embeddings.
MAX_NEW_TOKENS: Final = 1 << 20
KIND: Final = "kind"  # a field's metadata key for its range


def setting(default: Any, kind: Kind) -> Any:
    """A typed field with its default (a list or dict is copied for each node) and its range."""
    if isinstance(default, list | dict):
        return field(default_factory=default.copy, metadata={KIND: kind})
    return field(default=default, metadata={KIND: kind})


@dataclass
class DeviceCounts:
    """The counts a run takes on one kind of device when `run.*`/`infer.*`/`dataset.*` leave them unset (null).
    No defaults here (`DeviceDefaults` gives each device's), so the ranges are the fields' metadata."""

    repeats: int = field(metadata={KIND: Whole(1)})
    warmup: int = field(metadata={KIND: Whole(0)})
    max_new_tokens: int = field(metadata={KIND: Whole(1, MAX_NEW_TOKENS)})
    #: A number of inputs, `all`, or null (all).
    max_images: Any = field(metadata={KIND: Whole(1, nullable=True, words=("all",))})
    sampling: str  # dataset.sampling: which inputs max_images keeps
    #: With run.repeats unset: the timed passes of each input stop at about this many seconds (at least 3 passes,
    #: at most `repeats`), the count fixed from the run's first timed pass, so that very long passes (thousands of
    #: tokens, large batches) keep a run within minutes. Generous on purpose: fewer passes widen every interval (a
    #: what-if rung of 3 passes on an H200 called 8.6x "6.6-11.2x"). null: always `repeats`.
    timed_seconds: Optional[float] = setting(None, Number(0.0, "seconds", above=True, nullable=True))


@dataclass
class DeviceDefaults:
    """Device defaults for unset keys. The CPU defaults keep a full-size run within minutes on 2 cores. One warm-up
    pass on a GPU: an eager pass has run every kernel once after it (a compiled runtime raises it to what it needs:
    `session.runtime.RuntimeSettings.warmup_needed`)."""

    cuda: DeviceCounts = field(default_factory=lambda: DeviceCounts(5, 1, 32, "all", "sorted", 30.0))
    cpu: DeviceCounts = field(default_factory=lambda: DeviceCounts(1, 0, 8, 1, "smallest"))


@dataclass
class RunSchema:
    """`run:` how many passes, of what batch, on which cores, with which extra outputs."""

    #: Timed passes per input. null: the device default (`device_defaults`).
    repeats: Optional[int] = setting(None, Whole(1, nullable=True))
    #: Untimed warm-up passes per input before the timed ones. null: the device default.
    warmup: Optional[int] = setting(None, Whole(0, nullable=True))
    #: Pages (or prompts) per forward: vision runs per page (or batched: runtime.batch_vision), the decoder on the
    #: whole batch (left padding).
    batch_size: int = setting(1, Whole(1))
    #: Fill every batch to run.batch_size with copies of its own inputs (one page: that page B times), e.g. to
    #: measure batch 8 on a single document.
    fill_batches: bool = setting(False, Flag())
    #: CUDA, run.batch_size > 1: before the first pass, refuse a batch whose estimate (weights + KV cache at the batch
    #: and full length + activations from the analytic model, x2) exceeds the memory free beside the weights, naming
    #: the largest batch that fits. false: run it anyway.
    check_batch_fit: bool = setting(True, Flag())
    device_defaults: DeviceDefaults = field(default_factory=DeviceDefaults)
    #: Warn when a stage's coefficient of variation over the timed passes exceeds this.
    cv_warn: float = setting(0.10, Number(0.0, "(coefficient of variation)"))
    #: Pin the process to CPU cores, for host-paced timings that may be steadier (measured both ways on the H100s:
    #: docs/benchmarks-history.md): none, auto (a CUDA run takes 4 cores near its GPU; a CPU run is not pinned), or
    #: cores such as '2-5'. torch's intra-op threads follow.
    cpu_affinity: str = "none"
    #: Keep each input's prefill logits (last prompt position, first timed pass) in prefill_logits.pt, so that runs
    #: in separate processes can compare their outputs (perf-whatif sets it).
    save_prefill_logits: bool = setting(False, Flag())
    #: After the timed passes, one untimed eager pass per input (dynamic cache) that keeps the two highest logits
    #: behind each generated token in top2_logits.json: how near a tie each greedy choice was (perf-whatif sets it for
    #: its baseline and judges the other rungs' output departures by it).
    save_top2_logits: bool = setting(False, Flag())
    #: Open the CUDA profiler (cudaProfilerStart/Stop) around the first timed prefill and the middle decode step of
    #: that pass only, for `ncu --profile-from-start off` (stage2-profile sets it for its Nsight Compute workloads).
    #: CUDA only.
    profiler_window: bool = setting(False, Flag())
    #: Data parallel over the GPUs of a host: N processes, each on its own GPU timing every N-th input (all of them
    #: when there are fewer inputs than processes), at once; data_parallel.{md,json} gives each GPU's pages/s, their
    #: sum and the scaling efficiency (docs/guide/compare-and-sweeps.md). `stage1-run run.data_parallel=N` starts the
    #: N processes itself (cuda:0 to cuda:N-1; device=cpu: N processes on the CPU), each in <run>/shard-K/.
    data_parallel: int = setting(1, Whole(1))
    #: Which of the N shards this process times (0 to N-1): set by run.data_parallel=N for its processes, or swept
    #: in a Hydra multirun (`-m hydra/launcher=joblib ... run.data_parallel=N run.shard=0,...,N-1`).
    shard: Optional[int] = setting(None, Whole(0, nullable=True))
    #: The single-GPU pages/s of the same workload that the scaling efficiency is against: a stage1-run folder (its
    #: pages over the span of its timed passes) or a number. null: no efficiency.
    data_parallel_baseline: Any = None


@dataclass
class InferSchema:
    """`infer:` decoding."""

    #: Tokens generated per pass (fixed: min_new_tokens = max_new_tokens, EOS ignored). null: the device default.
    max_new_tokens: Optional[int] = setting(None, Whole(1, MAX_NEW_TOKENS, nullable=True))


@dataclass
class LegacyPredictions:
    #: -> pipeline.torch_profiler.output.extra.deepseek_ocr.prediction
    strip_special_tokens: Optional[bool] = setting(None, Flag(nullable=True))


@dataclass
class LegacyVisualization:
    #: -> pipeline.torch_profiler.output.visualization.enable
    enable: Optional[bool] = setting(None, Flag(nullable=True))
    #: -> pipeline.torch_profiler.output.extra.deepseek_ocr.visualization
    max_images: Optional[int] = setting(None, Whole(1, nullable=True))
    #: -> pipeline.torch_profiler.output.extra.deepseek_ocr.visualization
    thumbnail_width: Optional[int] = setting(None, Whole(16, nullable=True))


@dataclass
class OutputsSchema:
    """`outputs:` legacy output keys, read until their removal on 2027-03-01; each one set logs its new key
    (output_settings.py). null: not set."""

    #: -> pipeline.torch_profiler.output.prediction.enable
    save_predictions: Optional[bool] = setting(None, Flag(nullable=True))
    predictions: LegacyPredictions = field(default_factory=LegacyPredictions)
    visualization: LegacyVisualization = field(default_factory=LegacyVisualization)


@dataclass
class RuntimeSchema:
    """`runtime:` how the decoder runs (`session.runtime.RuntimeSettings` reads it)."""

    #: dynamic: transformers' DynamicCache (grows every step) | static: StaticCache sized for the prompt + new tokens.
    kv_cache: str = setting("dynamic", Choice(KV_CACHES))
    #: none | decode (torch.compile of the decode step; needs kv_cache=static) | prefill_decode (also the decoder's
    #: prefill; vision stays eager so that its sub-stages are still timed).
    compile: str = setting("none", Choice(COMPILE_TARGETS))
    #: reduce-overhead (CUDA graphs; CUDA only) | max-autotune (autotuned kernels and coordinate-descent tuning, in
    #: CUDA graphs; CUDA only) | max-autotune-no-cudagraphs | default
    compile_mode: str = setting("reduce-overhead", Choice(COMPILE_MODES))
    #: Inductor options set on top of compile_mode's own (torch._inductor.config names), e.g.
    #: +runtime.compile_options.coordinate_descent_tuning=true. Empty: the mode as torch defines it.
    compile_options: dict[str, Any] = setting({}, InductorOptions())
    #: none | a compile mode (as compile_mode) for the vision stage modules (SAM, CLIP, projector): each one's forward
    #: is compiled apart, so its stage is still timed; the FLOP count and the eager reference run them eagerly.
    compile_vision: str = setting("none", Choice(("none", *COMPILE_MODES)))
    #: true: the views of every input of a batch go through the vision stages together, one call per view shape
    #: (global views together, tiles together), then split back per input (needs run.batch_size > 1; DeepSeek-OCR v1
    #: and OCR-2). The vision sub-stage times are then the batch's. false: each input's vision on its own, in turn.
    batch_vision: bool = setting(False, Flag())
    #: Threads that preprocess the inputs of a batch together (0 or 1: one after the other, in the pass's thread).
    #: Decoding and resizing a page mostly releases the GIL, so on a host with cores to spare a batch's preprocessing
    #: takes about its longest page instead of the sum (each input's preprocess time is then its share of the batch's).
    preprocess_workers: int = setting(0, Whole(0))
    #: Decode the next pass's page files (open, upright, load: the host part of preprocessing) on threads
    #: (max(1, preprocess_workers) of them) while a pass runs on the device, so the next pass prepares from decoded
    #: images; its preprocess time is then the wait for them plus the rest of preprocessing, as in a steady stream of
    #: batches (the run's first pass decodes its own). Text prompts have nothing to decode ahead.
    prefetch_pages: bool = setting(False, Flag())
    #: Static cache length for every input (null: each batch's prompt + infer.max_new_tokens). One length for all
    #: inputs gives one compiled decode graph instead of one per prompt length.
    static_cache_len: Optional[int] = setting(None, Whole(2, nullable=True))
    #: Record which experts each decode step's MoE router picked (MoE decoders only).
    record_routing: bool = setting(True, Flag())
    #: Compare each run's tokens and prefill logits with an eager dynamic-cache run of the same input:
    #: auto (when the runtime or batch differs from eager, dynamic, batch 1) | always | never.
    output_check: str = setting("auto", Choice(OUTPUT_CHECKS))
    #: Weight quantization through torchao (optional: not installed with the toolkit; pip install torchao) of every
    #: nn.Linear outside the vision stages (the language model's attention projections, dense MLPs, shared experts,
    #: lm_head; fused routed experts are no Linear and keep the model's dtype), applied once the model is built and
    #: before anything compiles: none | int8_weight_only | float8_weight_only | float8_dynamic (float8 weights and
    #: activations). float8 needs a CUDA GPU of compute capability 8.9 or newer. Changes numerics: the eager
    #: reference of output_check runs the quantized model too, so judge the outputs with perf-whatif
    #: (whatif=quantize) against an unquantized baseline.
    quantize: str = setting("none", Choice(QUANTIZE_MODES))


@dataclass
class ReportSchema:
    """`report:` what the reports cite, and whether they are rendered."""

    #: A perf-whatif folder whose measured levers the reports' "What to try" cites. null: the what-if folder this run
    #: folder lies in (its parent or grandparent holds whatif.json), if any.
    whatif_dir: Optional[str] = None
    #: false: write the records only (metrics.json, operators.json, ...), no Markdown or plots; `stage1-report <folder>`
    #: renders them later (perf-whatif's rungs do this: it renders every rung once, in parallel, when it ends).
    render: bool = setting(True, Flag())


@dataclass
class Stage2ReportSchema(ReportSchema):
    """`report:` of stage2-profile: stage1-run's, and the Stage 1 folder that names the kernels."""

    #: A Stage 1 run folder of the same workload whose profiled pass (module attribution) names kernels.md's kernels
    #: by the operator and module that launched them. null: the workload's own folder, when it ran the torch profiler.
    stage1_dir: Optional[str] = None


@dataclass
class HardwareSchema:
    """`hardware:` the peaks that MFU and MBU are against."""

    #: Overrides for the MFU denominator (dense TFLOP/s for the compute dtype), for GPUs missing from the table or
    #: for the CPU. null: the table's.
    peak_tflops: Optional[float] = setting(None, Number(0.0, "TFLOP/s", above=True, nullable=True))
    #: Override for the MBU denominator (memory bandwidth, GB/s). null: the table's.
    peak_bandwidth_gbps: Optional[float] = setting(None, Number(0.0, "GB/s", above=True, nullable=True))
    #: MFU/MBU denominators: datasheet peaks only, or also the achievable peaks of this GPU ("measured": a large GEMM
    #: and copy timed once per device, dtype and torch version, cached in ~/.cache/llm_perf_opt/).
    peaks: str = "datasheet"


@dataclass
class Stage1Nodes:
    """`stage1-run`'s own nodes, typed: what `conf/` registers as `stage1_schema` (each a node of the composed config,
    beside the config groups' nodes, which are not typed yet)."""

    run: RunSchema = field(default_factory=RunSchema)
    infer: InferSchema = field(default_factory=InferSchema)
    outputs: OutputsSchema = field(default_factory=OutputsSchema)
    runtime: RuntimeSchema = field(default_factory=RuntimeSchema)
    report: ReportSchema = field(default_factory=ReportSchema)
    hardware: HardwareSchema = field(default_factory=HardwareSchema)


@dataclass
class LatencyTargetSchema:
    """`whatif.latency_target:` the per-page p90 latencies a rung must meet for goodput (ms; each one set must be
    met; null: not asked)."""

    #: Time to last token of a page (its pass end to end, at the measured decode length).
    ttlt_p90_ms: Optional[float] = setting(None, Number(0.0, "ms", above=True, nullable=True))
    #: Time to first token of a page (its pass's preprocessing and prefill).
    ttft_p90_ms: Optional[float] = setting(None, Number(0.0, "ms", above=True, nullable=True))


@dataclass
class WhatIfSchema:
    """`whatif:` the preset (`conf/whatif/<name>.yaml`, `whatif=<name>`) and the keys every preset shares. A preset
    sets `name`, `objective` and `levers`; the command line may set any of them."""

    #: whatif=advised: the stage1-run folder whose advice names the levers and whose workload the rungs run (required
    #: there: its model, named workload, decode length, runtime settings off their defaults and inputs make the
    #: baseline, the command line's overrides after them; any other preset refuses it).
    from_run: Optional[str] = None
    #: Goodput: the most pages/s among the rungs whose per-page p90 latency meets this target, beside the frontier
    #: of pages/s against per-page latency, e.g. `perf-whatif whatif=batch whatif.latency_target.ttlt_p90_ms=5000`.
    latency_target: Optional[LatencyTargetSchema] = field(default_factory=LatencyTargetSchema)
    #: The preset's name, recorded in whatif.json (null: custom).
    name: Optional[str] = None
    #: The goal the ladder ranks by and the headline verdict names: page_latency | first_token | throughput | memory
    #: (or a figure: decode_ms_per_token, ttft_ms, pages_per_s, aggregate_decode_tokens_per_s, page_latency_ms,
    #: peak_memory_gib). null: page_latency; whatif=advised: the objective of the best advice.
    objective: Optional[str] = None
    #: Flag rungs whose peak GPU memory exceeds this many GiB (null: no budget; > 1.5x the baseline's is always
    #: flagged).
    memory_budget_gib: Optional[float] = setting(None, Number(0.0, "GiB", above=True, nullable=True))
    #: The levers, free-form (checked by `pipeline.whatif.read_levers`): name -> {overrides: [key=value, ...],
    #: about: text, changes: latency | workload, needs: cuda}; `+whatif.levers.<name>={...}` adds one.
    #: whatif=advised builds them from the folder's advice and takes none here.
    levers: dict[str, Any] = field(default_factory=dict)


@dataclass
class WhatIfRunSchema:
    """`whatif_run:` how perf-whatif runs its rungs and builds its ladder."""

    #: Levers to leave out of the preset (names), e.g. [attn_eager].
    exclude: Optional[list[str]] = setting([], Names("static_cache,attn_eager"))
    #: launcher=local: devices the rungs run on, one rung per device at a time (each its own process), e.g.
    #: [cuda:0, cuda:1]. null: the `device` setting, one rung after another.
    devices: Optional[list[str]] = setting(None, Names("cuda:0,cuda:1"))
    #: How the rungs run: local (perf-whatif starts each rung as its own stage1-run process, one per device at a
    #: time) or hydra (each phase, i.e. the baseline, the levers alone, the ladder, one `stage1-run -m` multirun
    #: through the Hydra launcher that hydra_launcher picks; each rung's levers become a config in rung_configs/).
    launcher: str = setting("local", Choice(("local", "hydra")))
    #: launcher=hydra: the overrides that choose and configure Hydra's launcher; []: the basic one, one rung after
    #: another. On the command line each one quoted (it holds an =), e.g.
    #: 'whatif_run.hydra_launcher=["hydra/launcher=joblib","hydra.launcher.n_jobs=2"]' (each job claims a free GPU)
    #: or 'whatif_run.hydra_launcher=["hydra/launcher=submitit_slurm","hydra.launcher.gpus_per_node=1"]' (a cluster).
    hydra_launcher: Optional[list[str]] = setting([], Names('"hydra/launcher=joblib","hydra.launcher.n_jobs=2"'))
    #: Seconds one rung may take (model build, compilation and passes); null: no limit. launcher=hydra: a phase
    #: may take this times its rungs.
    rung_timeout_s: Optional[float] = setting(None, Number(0.0, "seconds", above=True, nullable=True))
    #: Build once, reuse: true: with random weights, the first rung saves the built model in <run>/model_cache/ and
    #: the others load it instead of building it (model.cache_dir; removed when the run ends). Off by default: on the
    #: H100 (2026-11-25) building v1's random weights on the GPU takes 0.2 s, saving them 12.1 s and loading them 1.9 s.
    reuse_model: bool = setting(False, Flag())
    #: launcher=local: fork each rung from one process that imported torch, transformers and the pipeline once, instead
    #: of starting a fresh interpreter per rung (each rung is still a process of its own, with its own CUDA context and
    #: compiled state). On the project's H100 machines the imports take ~13 s a rung (2026-11-26); false: fresh ones.
    fork_rungs: bool = setting(True, Flag())
    #: launcher=local: start the next rung on a device while the previous one finishes without it (the profiler's
    #: post-processing, writing its records, its exit: 4-6 s a rung on the H100), where no energy pass needs that
    #: time as its idle window and a second rung fits in the device's memory. The next rung builds the model and
    #: counts FLOPs meanwhile; its compilation, warm-up and timed passes wait for the previous process to end.
    overlap_rungs: bool = setting(True, Flag())
    #: Inductor's cache the rungs share (TORCHINDUCTOR_CACHE_DIR for each rung's process), so later rungs reuse the
    #: FX graphs, kernels and autotuning of earlier ones: user (${XDG_CACHE_HOME:-~/.cache}/llm_perf_opt/inductor,
    #: kept: later what-if runs start warm), run (<run>/inductor_cache/, removed when the run ends: every what-if run
    #: compiles from cold), a folder of your own (kept), or null (the environment's TORCHINDUCTOR_CACHE_DIR, else
    #: inductor's default /tmp/torchinductor_<user>).
    inductor_cache: Optional[str] = setting("user", OutputFolder(nullable=True, words=("user", "run")))
    #: Build the cumulative ladder of the levers that helped (false: baseline and each lever alone only).
    ladder: bool = setting(True, Flag())
    #: The levers a ladder may take: those that changed only latency (false: workload-changing levers too).
    ladder_latency_only: bool = setting(True, Flag())
    #: The ladder stacks only levers whose generated tokens equal the baseline's (the others stay in the table, left off
    #: the ladder with the reason); with ladder_max_logit_diff, also the prefill logits within it. false: any. Where a
    #: rung that changed nothing (its levers set what the baseline already ran) departs from the baseline at token k,
    #: the baseline's own outputs do not repeat from run to run from k on, and only tokens before k are compared.
    ladder_identical_outputs: bool = setting(True, Flag())
    #: The largest max |Δ| of the prefill logits against the baseline's a ladder lever may have (null: any).
    ladder_max_logit_diff: Optional[float] = setting(None, Number(0.0, "logits", nullable=True))
    #: A rung's tokens that depart from the baseline's where the baseline's own top two candidates were nearly tied
    #: count as the same output (for the outputs verdict and the ladder): the departing token is the baseline's
    #: runner-up there, and its logit is within this fraction of the baseline's top logit (0.01: 1.3 to 2.6 units in
    #: the last place of a bf16 logit; a fraction in [0, 1)). The baseline keeps its top two logits per token from
    #: one untimed eager pass per input (run.save_top2_logits). null: every departure counts; later tokens are never
    #: compared.
    near_tie_tolerance: Optional[float] = setting(
        0.01, Number(0.0, "(a fraction of the top logit, below 1)", nullable=True)
    )


@dataclass
class WhatIfNodes:
    """`perf-whatif`'s own nodes, typed: what `conf/` registers as `whatif_schema` (beside stage1-run's)."""

    whatif: WhatIfSchema = field(default_factory=WhatIfSchema)
    whatif_run: WhatIfRunSchema = field(default_factory=WhatIfRunSchema)


@dataclass
class SavedOutput:
    """What a run writes of one kind (its predictions, or its gallery) and where."""

    enable: bool = setting(True, Flag())
    #: A folder inside the run folder (a relative path), or an absolute one, used as it is.
    save_dir: str = setting("predictions", InsideRun())


@dataclass
class DeepSeekOcrPredictionSchema:
    #: Drop special tokens (<|ref|>, <|det|>, end of sentence) from the decoded text.
    strip_special_tokens: bool = setting(False, Flag())


@dataclass
class DeepSeekOcrVisualizationSchema:
    #: Pages shown in the gallery (the first ones in run order).
    max_images: int = setting(16, Whole(1))
    #: Their thumbnails' width in pixels.
    thumbnail_width: int = setting(480, Whole(16))


@dataclass
class DeepSeekOcrOutputSchema:
    prediction: DeepSeekOcrPredictionSchema = field(default_factory=DeepSeekOcrPredictionSchema)
    visualization: DeepSeekOcrVisualizationSchema = field(default_factory=DeepSeekOcrVisualizationSchema)


@dataclass
class OutputExtraSchema:
    """Model-specific knobs of the outputs."""

    deepseek_ocr: DeepSeekOcrOutputSchema = field(default_factory=DeepSeekOcrOutputSchema)


@dataclass
class OutputSchema:
    """`pipeline.torch_profiler.output:` what a run writes besides its measurements (read by `output_settings`,
    with the legacy `outputs.*` keys): each input's generated text (predictions.jsonl) and the gallery (predictions.md
    with page thumbnails). The presets of pipeline/torch_profiler leave it as it is."""

    prediction: SavedOutput = field(default_factory=SavedOutput)
    visualization: SavedOutput = field(default_factory=lambda: SavedOutput(save_dir="viz"))
    extra: OutputExtraSchema = field(default_factory=OutputExtraSchema)


@dataclass
class TorchProfilerSchema:
    """`pipeline.torch_profiler:` the profiled pass, a separate pass on the first input or batch (never a timed
    pass), bounded to prefill and the first `decode_steps` decode steps. These are the `default` preset's values;
    `pipeline/torch_profiler=min` and `=max` set what they change (conf/pipeline/torch_profiler/)."""

    #: false: no profiled pass (no operator table, no kernel time by module).
    enable: bool = setting(True, Flag())
    #: Decode steps profiled after the prefill.
    decode_steps: int = setting(4, Whole(0))
    #: A batched run profiles its first batch: prefill and decode on the whole batch, the vision of its first
    #: `max_vision_inputs` inputs only (the others' vision runs before the profiler starts), so its events, and the
    #: time to read them, stop growing with the batch; the report says so. 0: every input's vision (also with
    #: compiled vision, whose view shapes are the timed passes').
    max_vision_inputs: int = setting(4, Whole(0))
    #: Each operator's input shapes (operators.json).
    record_shapes: bool = setting(False, Flag())
    #: Each operator's memory.
    profile_memory: bool = setting(False, Flag())
    #: Each operator's call site.
    with_stack: bool = setting(False, Flag())
    #: Kernel time by module (a profiler range around every module's forward, in this pass only).
    modules: bool = setting(True, Flag())
    #: torch's own FLOP estimate per operator (operators.json's `flops`; the run counts its FLOPs itself): off, since
    #: it records every operator's input shapes and lengthens the pass's post-processing (full-size v1 on the CPU,
    #: 107,540 events: 15.9 -> 11.0 s, medians of 3; docs/benchmarks-history.md).
    with_flops: bool = setting(False, Flag())
    #: A gzipped Chrome/Perfetto trace (torch_profiler/trace.json.gz).
    chrome_trace: bool = setting(False, Flag())
    #: Operators listed in the report.
    top_k: int = setting(25, Whole(1))
    #: Predictions and gallery.
    output: OutputSchema = field(default_factory=OutputSchema)


@dataclass
class MemorySchema:
    """`pipeline.memory:` the memory pass (CUDA only): one untimed pass over the first input (or batch) after the
    timed passes, with the allocator's peaks per stage, the KV cache at each stage boundary and the allocator's
    history (memory/snapshot.pickle, for https://pytorch.org/memory_viz)."""

    #: false: no memory pass (the report says why not).
    enable: bool = setting(True, Flag())
    #: Allocator events the history keeps (torch.cuda.memory._record_memory_history max_entries).
    max_entries: int = setting(100_000, Whole(1))
    #: The snapshot is not saved when larger than this (MiB); 0: never saved.
    snapshot_max_mib: float = setting(256.0, Number(0.0, "MiB"))


@dataclass
class EnergySchema:
    """`pipeline.energy:` the energy pass (CUDA with nvidia-ml-py's pynvml; elsewhere the report says why not): the
    NVML energy counter over a prefill-only loop and a decode-only loop (the pass's decode steps repeated over the
    same prompt, the KV cache rewound each time; a whole-pass loop where either cannot run) of the first input (or
    batch), then idle power over the profiler's CPU-only post-processing (a sleep when the profiler is off). The
    counter moves about every 100 ms, so no window is shorter than 1 s."""

    #: false: no energy pass.
    enable: bool = setting(True, Flag())
    #: The decode-only loop (or the whole-pass loop) lasts about this long.
    loop_seconds: float = setting(2.0, Number(0.0, "seconds"))
    #: The prefill-only loop lasts about this long.
    prefill_seconds: float = setting(1.0, Number(0.0, "seconds"))
    #: The idle window lasts at least this long (padded where the profiler's post-processing is shorter).
    idle_seconds: float = setting(1.0, Number(0.0, "seconds"))


#: The Hopper names of the tensor-core FLOP counters; on other architectures adjust or remove them.
NCU_METRICS: Final = (
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__sass_thread_inst_executed_op_ffma_pred_on.sum",
    "sm__sass_thread_inst_executed_op_fadd_pred_on.sum",
    "sm__sass_thread_inst_executed_op_fmul_pred_on.sum",
    "sm__sass_thread_inst_executed_op_hfma_pred_on.sum",
    "sm__sass_thread_inst_executed_op_hadd_pred_on.sum",
    "sm__sass_thread_inst_executed_op_hmul_pred_on.sum",
    "sm__inst_executed_pipe_tensor.sum",
    "sm__ops_path_tensor_src_bf16_dst_fp32.sum",
    "sm__ops_path_tensor_src_fp16_dst_fp32.sum",
)
NSYS_REPORTS: Final = (
    "cuda_gpu_kern_sum",
    "nvtx_sum",
    "nvtx_gpu_proj_sum",
    "nvtx_kern_sum",
    "cuda_api_sum",
    "cuda_gpu_mem_time_sum",
)


@dataclass
class NsysSchema:
    """`pipeline.nsys:` how stage2-profile's Nsight Systems profiles the workload."""

    #: false: no Nsight Systems profile (and then no Nsight Compute: its targets come from it).
    enable: bool = setting(True, Flag())
    #: A path to nsys (the file or its folder). null: PATH, then the usual install folders.
    binary: Optional[str] = None
    #: nsys --trace.
    trace: list[str] = setting(["cuda", "nvtx", "osrt"], Names("cuda,nvtx", nullable=False))
    #: CPU sampling and context switches (nsys --sample, --cpuctxsw): off, since with them a 3-second run wrote a
    #: 2 GB .qdstrm.
    sample: str = "none"
    cpuctxsw: str = "none"
    #: nsys --cuda-graph-trace: node (each kernel of a CUDA graph) or graph (the graph as one).
    cuda_graph_trace: Optional[str] = "node"
    #: Sample the GPU's metrics this often (Hz, 10 to 200000; null: not at all): report.md then gives each stage's
    #: DRAM bytes per instance from the samples (DRAM read/write throughput integrated over its kernels' busy time),
    #: without profiling a kernel. A supplement to the bytes pass, not a replacement: nsys drops samples in gaps of
    #: about 1 s (instances there are left out), and at 100000 it added ~50 s to an H100 run of the A4 page.
    gpu_metrics_hz: Optional[int] = setting(None, Whole(10, 200_000, nullable=True))
    #: Which GPUs nsys samples (all, or ids as nsys numbers them); the figures take the first sampled GPU's.
    gpu_metrics_devices: str = "all"
    #: An NVTX capture range (a stage name, e.g. decode). null: the whole workload.
    capture_range: Optional[str] = None
    #: The `nsys stats` reports exported beside the profile.
    reports: list[str] = setting(list(NSYS_REPORTS), Names("cuda_gpu_kern_sum,nvtx_sum", nullable=False))
    timeout_s: float = setting(900.0, Number(0.0, "seconds", above=True))


@dataclass
class NcuSchema:
    """`pipeline.ncu:` how stage2-profile's Nsight Compute profiles the hottest kernels that nsys found, and its
    bytes pass."""

    #: false: no Nsight Compute.
    enable: bool = setting(True, Flag())
    #: A path to ncu (the file or its folder). null: PATH, then the usual install folders.
    binary: Optional[str] = None
    #: none: clocks not locked (ncu locks them to base by default); recorded in the report.
    clock_control: str = setting("none", Choice(("none", "base", "reset")))
    target_processes: str = setting("all", Choice(("all", "application-only")))
    #: Metrics collected beside the sections, for the roofline: duration, DRAM bytes, FP32/FP16 instruction counts,
    #: tensor-pipe work, and tensor-core FLOPs under their Hopper names (on other architectures adjust or remove the
    #: last two).
    metrics: list[str] = setting(list(NCU_METRICS), Names("gpu__time_duration.sum", nullable=False))
    timeout_s: float = setting(900.0, Number(0.0, "seconds", above=True))
    #: The bytes pass: one more ncu run over every kernel of the profiler window (the prefill of one image with its
    #: vision sub-stages, and the middle decode step) collecting only duration and DRAM read/write bytes (one counter
    #: pass, no replay), so report.md can set measured bytes beside the analytic ones. null: the mode's choice (deep
    #: runs it, light does not).
    bytes_pass: Optional[bool] = setting(None, Flag(nullable=True))
    #: ncu's default `all` flushes L1/L2 before each profiled kernel, so every kernel would fetch its inputs from DRAM
    #: again; `none` leaves the caches as the previous kernel left them, as in the real run.
    bytes_cache_control: str = setting("none", Choice(("none", "all")))


@dataclass
class Stage2ModeSchema:
    """One of `stage2.modes`: which kernels Nsight Compute targets, with which sections."""

    #: The hottest kernels of each stage (by nsys GPU time) that ncu profiles.
    top_kernels: int = setting(5, Whole(1))
    #: ncu --section names.
    sections: list[str] = setting(["SpeedOfLight"], Names("SpeedOfLight", nullable=False))
    #: The NVTX stages whose kernels are targeted.
    stages: list[str] = setting(["prefill", "decode"], Names("prefill,decode", nullable=False))
    #: Launches of each launch configuration profiled.
    launches_per_kernel: int = setting(1, Whole(1))
    #: Run the bytes pass (`pipeline.ncu.bytes_pass`, when null, takes this).
    bytes_pass: bool = setting(False, Flag())


DEEP_SECTIONS: Final = (
    "SpeedOfLight",
    "SpeedOfLight_RooflineChart",
    "SpeedOfLight_HierarchicalTensorRooflineChart",
    "MemoryWorkloadAnalysis",
    "ComputeWorkloadAnalysis",
    "LaunchStats",
    "Occupancy",
)


def _stage2_modes() -> dict[str, Stage2ModeSchema]:
    return {
        "light": Stage2ModeSchema(),
        "deep": Stage2ModeSchema(top_kernels=20, sections=list(DEEP_SECTIONS), bytes_pass=True),
    }


@dataclass
class Stage2WorkloadSchema:
    """`stage2.workload:` the nsys workload's passes: one timed pass per image after the warm-up (warm-up passes emit
    no NVTX stage ranges, so they fall outside every analysed stage). null: Stage 1's device default."""

    repeats: Optional[int] = setting(1, Whole(1, nullable=True))
    warmup: Optional[int] = setting(1, Whole(0, nullable=True))


@dataclass
class NcuWorkloadSchema:
    """`stage2.ncu_workload:` Nsight Compute replays kernels of one image with a short decode (counters do not depend
    on how many), in one timed pass whose prefill and middle decode step open the CUDA profiler
    (run.profiler_window): two ncu processes in all, one for the targeted kernels of every stage (each launch
    configuration once), one for the bytes pass. These win over the command line's."""

    max_images: int = setting(1, Whole(1))
    max_new_tokens: int = setting(4, Whole(1, MAX_NEW_TOKENS))
    repeats: Optional[int] = setting(1, Whole(1, nullable=True))


@dataclass
class Stage2Schema:
    """`stage2:` what stage2-profile profiles."""

    #: light: nsys + ncu on the top 5 kernels with a small section set, about two minutes for the A4 page on an
    #: H100; deep: top 20, full roofline sections, and the bytes pass (pipeline.ncu.bytes_pass): the DRAM bytes of
    #: every kernel of one instance of each of `stages`, one more Nsight Compute process (about 75-90 s for the A4
    #: page on an H100). Or a mode of your own: `+stage2.modes.<name>={top_kernels: 10}`.
    mode: str = "light"
    #: The modes by name (each a Stage2ModeSchema; one of your own is typed when it is read).
    modes: dict[str, Any] = field(default_factory=_stage2_modes)
    workload: Stage2WorkloadSchema = field(default_factory=Stage2WorkloadSchema)
    ncu_workload: NcuWorkloadSchema = field(default_factory=NcuWorkloadSchema)
    #: Build once, reuse: true: with random weights, the first workload process (nsys) saves the built model in
    #: <run>/model_cache/ and every later one (each ncu round, the bytes passes) loads it instead of building it
    #: (model.cache_dir; the folder is removed when the run ends). Off by default: on the H100 (2026-11-25) building
    #: v1's random weights on the GPU takes 0.2 s, saving them 12.1 s and loading them 1.9 s.
    reuse_model: bool = setting(False, Flag())
    #: A Stage 2 folder whose every artifact is rebuilt from its exports (no GPU, no Nsight needed). null: a run.
    rerender: Optional[str] = None


@dataclass
class PromptSchema:
    """`model.prompt:` the text sent after the image (or the text prompt's stand-in)."""

    #: The text after the image placeholder. With a tokenizer it is tokenized; without one, `text_tokens` fixed ids
    #: stand in for it.
    text: str = ""
    text_tokens: Optional[int] = setting(None, Whole(0, nullable=True))


@dataclass
class ModelSchema:
    """`model:` which model a run builds or loads, and how: the keys every family takes. Each family has its schema
    (`MODEL_SCHEMAS`: DeepSeek-OCR v1, OCR-2, any HF model), which its config (`conf/model/<name>.yaml`,
    `model=<name>`) names first, so a key of another family (`model.config` with model=deepseek_ocr) is refused; the
    family's own tables (`modes`, `preprocess`, `architecture`) are mappings its adapter reads once
    (`session.adapters`)."""

    name: str = ""
    #: The family's adapter: deepseek_ocr | deepseek_ocr2 | hf.
    adapter: str = ""
    #: null: bfloat16 on CUDA, float32 on the CPU.
    dtype: Optional[str] = None
    #: The attention backend passed to transformers (sdpa | eager | flash_attention_2 ...). null: transformers' default.
    attn_implementation: Optional[str] = "sdpa"
    #: The MoE experts backend for models that have one (eager | grouped_mm | batched_mm). null: transformers' default.
    experts_implementation: Optional[str] = None
    #: The seed of the random weights (reproducible FLOPs, routing and timings across runs).
    seed: int = setting(0, Whole(0))
    #: Random weights: a folder where the first process saves the built model (model.safetensors + manifest.json)
    #: and later ones load it instead of building it (checked against the config, dtype, seed and versions; rebuilt
    #: when stale). null: built every time. stage2-profile and perf-whatif set it for their child processes (a folder
    #: in the run folder, removed at the end) unless set here; ignored when checkpoint weights are loaded.
    cache_dir: Optional[str] = setting(None, OutputFolder(nullable=True))
    #: The family's preprocessing (tiling, view sizes, `device`: cpu or cuda; hf: `chat_template`, `max_prompt_tokens`).
    preprocess: dict[str, Any] = field(default_factory=dict)
    prompt: PromptSchema = field(default_factory=PromptSchema)


@dataclass
class DeepseekOcr2ModelSchema(ModelSchema):
    """`model:` DeepSeek-OCR-2 (`model=deepseek_ocr2`, `deepseek_ocr2_tiny`)."""

    #: A local checkpoint folder in the official layout (config.json + *.safetensors [+ tokenizer files]). null:
    #: random weights at the real size, built from `architecture`.
    path: Optional[str] = None
    #: SAM's attention: sdpa (the relative-position bias as a materialised mask) | flex (the bias added inside
    #: FlexAttention, never materialised; compiled on a GPU).
    sam_attention: str = setting("sdpa", Choice(("sdpa", "flex")))
    #: The published checkpoint's shape: with no `path`, the model is built from it.
    architecture: dict[str, Any] = field(default_factory=dict)


@dataclass
class DeepseekOcrModelSchema(DeepseekOcr2ModelSchema):
    """`model:` DeepSeek-OCR v1 (`model=deepseek_ocr`, `deepseek_ocr_tiny`); `path`'s official tensor names are mapped
    onto this implementation (strict: every tensor, every shape)."""

    #: Load the vendor's own modeling code from `path` (AutoModel, trust_remote_code) instead of this implementation;
    #: needs a transformers version the vendor code supports (it was written for 4.46).
    trust_remote_code: bool = setting(False, Flag())
    #: The resolution mode, one of `modes` (the vendor README's names).
    mode: Optional[str] = None
    #: The resolution modes: name -> {base_size, image_size, crop_mode}.
    modes: dict[str, Any] = field(default_factory=dict)


@dataclass
class HfModelSchema(ModelSchema):
    """`model:` any Hugging Face causal LM or image-text-to-text model (`model=hf`): exactly one of `name_or_path`
    and `config`."""

    #: A local folder in the transformers layout (config.json, *.safetensors, tokenizer or processor files). Local
    #: files only: nothing is downloaded.
    name_or_path: Optional[str] = None
    #: Random weights: a preset name (conf/model_presets/) or a config.json (or a folder holding one).
    config: Optional[str] = None
    #: A folder of tokenizer files for a random-weight model. Without any tokenizer, each word and punctuation mark of
    #: a prompt becomes one stand-in token id.
    tokenizer: Optional[str] = None
    #: Image-text-to-text models: vision sub-stage -> submodule path (e.g. {vision: model.vision_tower}), checked
    #: against the model when it is built. null: detected.
    vision_stage_modules: Any = None


@dataclass(frozen=True)
class WorkloadProfile:
    """A named workload (`conf/workload/*.yaml`, the root `workload_profile` node): its name, the document it prices,
    the model configs it is for."""

    name: str
    document: str = ""
    models: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, node: Mapping[str, Any] | None) -> WorkloadProfile | None:
        """From the `workload_profile` node (None when no named workload is selected)."""
        if not node:
            return None
        if not node.get("name"):
            raise UserError(
                f"workload_profile has no name ({dict(node)}): a named workload's profile names it",
                "Select a workload of conf/workload/ with workload=<name>, or give workload_profile.name=<name>",
            )
        return cls(
            name=str(node["name"]),
            document=str(node.get("document") or ""),
            models=tuple(str(m) for m in node.get("models") or ()),
        )

    def check_model(self, model: str) -> None:
        """Refuse a model this workload is not written for: `model=` on the command line wins over the workload's own
        and must be one of `workload_profile.models` (the full-size model and its tiny variant)."""
        if not self.models or model in self.models:
            return
        raise UserError(
            f"workload={self.name} is written for model={' or model='.join(self.models)} (its page, views and decode "
            f"length are that model's), but this command runs model={model}",
            f"Leave model= out to run the workload's own model ({self.models[0]}), or choose a workload of "
            f"conf/workload/ whose workload_profile.models lists {model}",
        )

    def as_dict(self) -> dict[str, Any]:
        """The profile as the records keep it (`workload_profile` of metrics.json and report.json)."""
        return {"name": self.name, "document": self.document, "models": list(self.models)}


#: Each model family's schema, as its config's defaults list names it (registered in the `model` group).
MODEL_SCHEMAS: dict[str, type[ModelSchema]] = {
    "deepseek_ocr_schema": DeepseekOcrModelSchema,
    "deepseek_ocr2_schema": DeepseekOcr2ModelSchema,
    "hf_schema": HfModelSchema,
}


@dataclass
class DatasetSchema:
    """`dataset:` the inputs a run takes: the bundled sample pages (`dataset=samples`), the bundled text prompts
    (`dataset=prompts`, for text-only models), or a folder of your own (`dataset.root=<dir>`: .png/.jpg/.jpeg/.webp
    images, or UTF-8 .txt files, one prompt each)."""

    #: image | text: what the files are.
    kind: str = setting("image", Choice(("image", "text")))
    #: The folder the inputs are read from (the bundled sample pages by default).
    root: str = "${llo_samples_dir:}"
    #: A text file listing the files to run (one per line, relative to root or absolute), run in its order unless
    #: sampling is set; a listed file that does not exist is an error, a repeated line runs once.
    subset_filelist: Optional[str] = None
    #: Run at most this many inputs; all: every one, on every device. null: the device default
    #: (`run.device_defaults`: all on a GPU, 1 on the CPU).
    max_images: Any = setting(None, Whole(1, nullable=True, words=("all",)))
    #: sorted | random (uses `seed`) | smallest (fewest pixels or characters first). null: the device default
    #: (sorted on a GPU, smallest on the CPU).
    sampling: Optional[str] = None
    seed: int = setting(0, Whole(0))
    #: skip | fail: what a corrupt, truncated, empty or unreadable file does (skip: the next file takes its place).
    on_error: str = setting("skip", Choice(("skip", "fail")))


@dataclass
class AnalyticSchema:
    """`analytic:` the page that analytic-report (and stage1-run's static_analysis/ step) prices, the GPUs it prices
    on, and the what-if over the page's views (priced on `reference_gpu`). A named workload (`workload=<name>`) sets
    the page's."""

    #: DeepSeek-OCR-2: local 768-px tiles (an A4 page gives 6).
    tiles: int = setting(6, Whole(0))
    #: DeepSeek-OCR v1 in a crop mode (model.mode=gundam): tiles [across, down]; an A4 page gives [2, 3], [1, 1] is
    #: no tiles. The other modes (model.mode=tiny|small|base|large) run one view, no tiles.
    crop_grid: list[int] = field(default_factory=lambda: [2, 3])
    #: The prompt's text tokens. null: model.prompt.text_tokens.
    text_tokens: Optional[int] = setting(None, Whole(0, nullable=True))
    new_tokens: int = setting(32, Whole(1, MAX_NEW_TOKENS))
    #: bfloat16, float16 or float32.
    dtype: str = "bfloat16"
    #: The GPUs priced: keys of the hardware table (`hardware/gpus.yaml`).
    gpus: list[str] = setting(
        ["h100_sxm", "h200_sxm", "a100_sxm4_80gb", "l4", "rtx_4090", "l40s", "b200"],
        Names("h100_sxm,h200_sxm", nullable=False),
    )
    reference_gpu: str = "h100_sxm"
    #: DeepSeek-OCR-2: the tile counts of the view what-if.
    tile_sweep: list[int] = field(default_factory=lambda: [0, 2, 3, 4, 5, 6])
    #: DeepSeek-OCR v1: the modes of the view what-if (of model.modes; a crop mode once per grid_sweep grid).
    mode_sweep: list[str] = setting(["tiny", "small", "base", "large", "gundam"], Names("tiny,gundam", nullable=False))
    #: DeepSeek-OCR v1: the crop grids [across, down] of the view what-if.
    grid_sweep: list[list[int]] = field(default_factory=lambda: [[1, 1], [2, 1], [2, 2], [2, 3], [3, 3]])


def node_types(nodes: type) -> dict[str, type]:
    """A dataclass of typed nodes (`Stage1Nodes`) as node name -> the dataclass of that node."""
    return {node.name: node.default_factory for node in fields(nodes)}  # type: ignore[misc]


#: Each schema `conf/` registers (the name a defaults list uses) -> its nodes: node name -> dataclass.
SCHEMAS: dict[str, dict[str, type]] = {
    "stage1_schema": node_types(Stage1Nodes),
    # `report` merged over stage1's report node (a subclass of its type)
    "stage2_schema": {"report": Stage2ReportSchema, "stage2": Stage2Schema},
    "whatif_schema": node_types(WhatIfNodes),
}

#: Config groups typed by a schema: group -> (the name its configs' defaults lists use, the schema). `conf/`
#: registers each in the group, so `conf/<group>/<choice>.yaml` composes onto it.
GROUP_SCHEMAS: dict[str, tuple[str, type]] = {
    "pipeline/torch_profiler": ("torch_profiler_schema", TorchProfilerSchema),
    "pipeline/memory": ("memory_schema", MemorySchema),
    "pipeline/energy": ("energy_schema", EnergySchema),
    "pipeline/nsys": ("nsys_schema", NsysSchema),
    "pipeline/ncu": ("ncu_schema", NcuSchema),
    "dataset": ("dataset_schema", DatasetSchema),
    "analytic": ("analytic_schema", AnalyticSchema),
}


def group_schemas() -> Iterator[tuple[str, str, type]]:
    """Every schema registered in a config group, as (group, name, schema): `GROUP_SCHEMAS`' and each model
    family's (`MODEL_SCHEMAS`, in the `model` group)."""
    yield from ((group, name, schema) for group, (name, schema) in GROUP_SCHEMAS.items())
    yield from (("model", name, model) for name, model in MODEL_SCHEMAS.items())


def _fields(node: type, prefix: str) -> Iterator[tuple[str, Field[Any]]]:
    """Each field of a typed node, the fields of the nodes nested in it included, with its dotted key."""
    for f in fields(node):
        yield f"{prefix}.{f.name}", f
        value = f.default_factory() if callable(f.default_factory) else f.default
        if is_dataclass(value):
            yield from _fields(type(value), f"{prefix}.{f.name}")
        elif isinstance(value, dict):  # a map of typed nodes (stage2.modes): each default entry's fields
            for name, entry in value.items():
                if is_dataclass(entry):
                    yield from _fields(type(entry), f"{prefix}.{f.name}.{name}")


def _typed_fields() -> Iterator[tuple[str, Field[Any]]]:
    yield from (item for nodes in SCHEMAS.values() for name, node in nodes.items() for item in _fields(node, name))
    for group, _, schema in group_schemas():  # a model key of several families: the same field, inherited
        yield from _fields(schema, group.replace("/", "."))


def typed_key(key: str) -> bool:
    """Whether a dotted key (`run.cv_warn`) is a typed node or a field of one: it cannot be deleted (`~key`)."""
    return any(key in nodes for nodes in SCHEMAS.values()) or any(key == typed for typed, _ in _typed_fields())


def typed_kinds() -> dict[str, Kind]:
    """Each typed field's range (`settings_schema.SCHEMA` holds them): dotted key -> kind. A field without one is
    free-form, checked by its reader."""
    return {key: f.metadata[KIND] for key, f in _typed_fields() if KIND in f.metadata}
