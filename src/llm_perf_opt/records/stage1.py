"""Stage 1 records: what `stage1-run` measured (`metrics.json`), its inputs (`inputs.yaml`), its predictions
(`predictions/predictions.jsonl`) and the profiled pass's operators (`operators.json`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from llm_perf_opt.records.common import PeakFigure, Summary, TimeBudget
from llm_perf_opt.records.memory import EnergyReport, MemoryReport
from llm_perf_opt.records.modules import ModuleAttribution, ModuleTimes
from llm_perf_opt.records.shard import PassWindow, ShardInfo
from llm_perf_opt.records.vocabulary import E2E, QUANTIZE_LABELS

PerInput = TypeVar("PerInput")
PerBatch = TypeVar("PerBatch")

NOT_PINNED = "not pinned"  # how CpuPin.describe opens for a process left on every core
BYTES_SOURCE = "analytic model (llm_perf_opt.analytic): weights read + activations + KV cache"


@attrs.frozen
class ModelFamily:
    """What the reports' advice needs to know of a model family, as its adapter describes it (`describe()`)."""

    name: str  # the family: "deepseek_ocr" (v1), "deepseek_ocr2", "hf", ...
    tiled_views: bool = False  # an image becomes a global view plus local tiles, each another vision pass
    tiling: bool = False  # this run's settings let it cut tiles (v1 crop_mode, v2 crop_to_patches)
    tile_px: int | None = None  # a tile's side
    has_modes: bool = False  # the family has named modes (v1: tiny, small, base, large, gundam)
    mode: str | None = None  # the mode this run used
    encoder: str = "encoder"  # how the advice names the vision encoder beside SAM

    @classmethod
    def probed(cls, adapter: str, preprocess: Mapping[str, Any]) -> ModelFamily:
        """The family of a folder written before adapters described it, guessed from the adapter's name and the
        recorded preprocessing keys exactly as the reports guessed it then; the one place that guesses."""
        if not adapter.startswith("deepseek"):
            return cls(name=adapter)
        v1 = "mode" in preprocess  # only v1 records a mode
        return cls(
            name="deepseek_ocr" if v1 else "deepseek_ocr2",
            tiled_views=True,
            tiling=bool(preprocess.get("crop_mode", True)),
            tile_px=preprocess.get("image_size" if v1 else "tile_size"),
            has_modes=v1,
            mode=preprocess.get("mode"),
            encoder="CLIP" if v1 else "encoder",
        )


@attrs.frozen
class QuantizedLayers:
    """The layers `runtime.quantize` quantized: the model's nn.Linear layers outside its vision stages (the language
    model's attention projections, dense MLPs, shared experts, lm_head); fused routed-expert tensors are no Linear."""

    setting: str  # the runtime.quantize value, e.g. "int8_weight_only"
    layers: int  # Linear layers quantized
    parameters: int  # their weights' elements
    linear_layers: int  # every nn.Linear of the model (the vision stages' too)

    @property
    def text(self) -> str:
        """In words, e.g. "int8 weight-only (torchao): 22 of 43 Linear layers (...), 8,359,936 weights"."""
        return (
            f"{QUANTIZE_LABELS.get(self.setting, self.setting)}: {self.layers} of {self.linear_layers} Linear layers "
            f"(those outside the vision stages), {self.parameters:,} weights"
        )


@attrs.frozen
class ModelInfo:
    name: str
    adapter: str
    class_name: str
    parameters: int
    dtype: str
    attn_implementation: str | None
    experts_implementation: str | None
    weights: str  # "random" | "checkpoint"
    weights_detail: str
    config_source: str
    preprocess: Mapping[str, Any]
    # The model's shape as its config gives it (model_type, layers, hidden size, heads, vocabulary, input kind,
    # vision stages); empty for adapters that do not describe it.
    architecture: Mapping[str, Any] = attrs.field(factory=dict)
    # The family as the adapter describes it; None in folders written before it was recorded (`family_facts`).
    family: ModelFamily | None = None
    # What `runtime.quantize` quantized; None: nothing (the setting was none, or the folder predates it).
    quantized: QuantizedLayers | None = None

    def family_facts(self) -> ModelFamily:
        """The family as described, or as probed from the preprocessing keys for an older folder."""
        return self.family if self.family is not None else ModelFamily.probed(self.adapter, self.preprocess or {})


@attrs.frozen
class DeviceInfo:
    type: str  # "cuda" | "cpu"
    name: str
    index: int | None
    timing_method: str


def ttft_of(timed: PassTimes) -> float:
    """Time to first token of one timed pass (ms): preprocess + prefill (the first token comes out of the prefill
    forward; each input of a batch waits for the whole batch's preprocessing and prefill)."""
    return timed.preprocess_ms + timed.prefill_ms


def e2e_of(timed: PassTimes) -> float:
    """End to end (ms): preprocess + prefill + decode."""
    return ttft_of(timed) + timed.decode_ms


def aggregate_decode_rate(new_tokens: int, decode_ms: float, size: int) -> float | None:
    """Decode tokens per second of a whole batch of `size` inputs: every input's tokens after the first (which comes
    out of the prefill) over the decode time; None when nothing was decoded."""
    return None if not decode_ms else (new_tokens - 1) / decode_ms * 1e3 * size


def pages_rate(size: int, e2e_ms: float) -> float:
    """Inputs finished per second by a batch of `size` inputs, end to end (preprocessing included)."""
    return size / e2e_ms * 1e3


class PassTimes:
    """One timed pass, over one input or one batch, measured (`session.ImageMeasurement`, `.BatchMeasurement`) or
    recorded (`ImageRecord`, `BatchRecord`): preprocess, prefill (vision included) and decode ms, and the times
    derived from them. A record saving a derived time holds it as `attrs.field(init=False)`: written, never read."""

    __slots__ = ()

    if TYPE_CHECKING:

        @property
        def preprocess_ms(self) -> float: ...
        @property
        def prefill_ms(self) -> float: ...
        @property
        def decode_ms(self) -> float: ...

    @property
    def ttft_ms(self) -> float:
        return ttft_of(self)

    @property
    def e2e_ms(self) -> float:
        return e2e_of(self)


@attrs.frozen
class ImageRecord(PassTimes):
    """One timed pass over one input (times in ms). `image` is its path relative to the dataset root."""

    image: str
    repeat: int
    preprocess_ms: float
    prefill_ms: float  # vision included
    # nested inside prefill; in a batched run this input's own (vision per input) or, with batched vision, an equal
    # share of the batch's (the batch ran every input's views together), so the inputs' sum to the batch's
    vision_ms: Mapping[str, float]
    # derived (`ttft_of`, `e2e_of`) and saved in the file for its readers
    ttft_ms: float = attrs.field(init=False, default=attrs.Factory(ttft_of, takes_self=True))
    decode_ms: float
    decode_step_ms: tuple[float, ...]
    e2e_ms: float = attrs.field(init=False, default=attrs.Factory(e2e_of, takes_self=True))
    new_tokens: int
    prompt_tokens: int
    image_tokens: int
    tiles: int
    peak_memory_bytes: int | None
    crop_grid: tuple[int, int] | None = None  # DeepSeek-OCR v1 Gundam: tiles across, down (3x2 and 2x3 differ)
    output_check: OutputCheck | None = None  # against the eager dynamic-cache run of the same input
    # its page file decoded ahead while the previous pass ran (`runtime.prefetch_pages`): preprocess_ms leaves the
    # decoding out (the wait for it and the rest of preprocessing stay in)
    prefetched: bool = False

    @property
    def size(self) -> int:
        """Inputs this pass finishes: one (a batch pass's are its batch's, `BatchRecord.size`)."""
        return 1

    @property
    def cost_key(self) -> str:
        """The key of this pass's FLOPs and analytic bytes: its input."""
        return self.image


def batch_key(index: int) -> str:
    """The key of batch `index` (0-based, run order) in per-batch mappings (FLOPs, analytic bytes)."""
    return f"batch {index}"


@attrs.frozen
class BatchRecord(PassTimes):
    """One timed pass over one batch of inputs (`run.batch_size` > 1; times in ms, rates per second): preprocessed
    and run through vision one after the other (with `runtime.batch_vision`, their views through each vision stage
    together, one call per view shape), then prefilled and decoded together, so every input's TTFT and decode time
    are the batch's (its `ImageRecord`s say so too)."""

    batch: int  # 0-based index of the batch in run order
    repeat: int
    images: tuple[str, ...]  # the inputs' keys, in batch order
    preprocess_ms: float  # every input's preprocessing
    prefill_ms: float  # every input's vision + the batched decoder prefill
    # per vision sub-stage, summed over the inputs (nested inside prefill); with batched vision the batch's own
    # (each stage timed once per view group of the batch); either way the batch's vision, per page = / size
    vision_ms: Mapping[str, float]
    decode_ms: float
    decode_step_ms: tuple[float, ...]  # one per decode step of the whole batch
    new_tokens: int  # per input (the first from prefill)
    padded_prompt_tokens: int  # prompt positions after left padding (the longest prompt)
    peak_memory_bytes: int | None
    # derived: decode tokens of every input / decode time, and inputs finished per second, end to end
    aggregate_decode_tokens_per_s: float | None = attrs.field(
        init=False, default=attrs.Factory(lambda b: aggregate_decode_rate(b.new_tokens, b.decode_ms, b.size), True)
    )
    pages_per_s: float = attrs.field(init=False, default=attrs.Factory(lambda b: pages_rate(b.size, b.e2e_ms), True))
    experts_hit_per_step: float | None = None  # MoE: distinct experts per decode step and layer (routing record)
    prefetched: bool = False  # as `ImageRecord.prefetched`, for every input's page file

    @property
    def size(self) -> int:
        return len(self.images)

    @property
    def cost_key(self) -> str:
        """The key of this pass's FLOPs and analytic bytes: its batch."""
        return batch_key(self.batch)


def per_forward(batches: Sequence[BatchRecord], per_input: PerInput, per_batch: PerBatch) -> PerInput | PerBatch:
    """Which timed passes a run's figures (MFU, MBU, the speed of light, Stage 2's measured bytes) are over, the one
    rule: its batch passes when it batched (a batch's inputs share its prefill and decode steps; per-input FLOPs over
    the batch's time would count that time once per input), else its per-input passes. `per_input`, `per_batch`:
    what goes with each (the passes, or the passes with their counted FLOPs and analytic costs)."""
    return per_batch if batches else per_input


@attrs.frozen
class BatchSummary:
    """The batches of a run in brief: figures over the timed passes of the full batches (of `batch_size` inputs;
    of every batch when none is full), one value per batch pass, by the `Summary` rules."""

    batch_size: int
    batches: int  # batches per round over the inputs
    short_last_batch: int | None  # inputs of a last batch smaller than batch_size (None: every batch is full)
    passes: int  # batch passes the figures below summarise
    decode_step_ms: Summary | None  # a pass's mean decode step (ms)
    aggregate_decode_tokens_per_s: Summary | None
    pages_per_s: Summary
    peak_memory_bytes: int | None  # the largest over every batch pass (None off the GPU)
    decode_experts: str | None = None  # which routed-expert count the batch decode bytes used (MoE, analytic model)


@attrs.frozen
class StageStat:
    """Dispersion of one stage over the timed passes."""

    stage: str
    nested_in: str | None  # "prefill" for vision sub-stages: shown nested, never added again
    summary: Summary


@attrs.frozen
class ImageSpread:
    """Spread of one stage over the passes of one image."""

    image: str
    passes: int
    cv: float | None  # std (ddof=1) / mean over this image's passes; None below 2 passes or at mean 0


@attrs.frozen
class StageVariation:
    """Within-image and image-mix dispersion of one stage."""

    stage: str
    per_image: tuple[ImageSpread, ...]  # in first-seen image order
    images_judged: int  # images with >= 3 passes and a CV (the figures below use only these)
    within_image_cv_median: float | None  # None when no image has enough passes
    within_image_cv_max: float | None
    worst_image: str | None  # the image with the largest within-image CV
    image_mix_cv: float | None  # CV pooled over every pass of every image; None for a single image (no mix)
    # Which side the run-to-run noise is on (measure.variation.noise_side): "host-side", "GPU-side", "host and GPU";
    # None where the profiled pass cannot tell
    noise_side: str | None = None


@attrs.frozen
class MfuRecord:
    """MFU of one stage over all timed passes: total FLOPs / (total time · peak)."""

    stage: str
    flops_total: float  # FLOPs over all timed passes
    time_total_ms: float  # measured time over the same passes
    achieved_tflops: float  # flops_total / time_total
    peak: PeakFigure | None
    mfu: float | None  # fraction; None when no peak is known
    flops_source: str


@attrs.frozen
class StageEfficiency:
    """Roofline figures of one stage over all timed passes (None where a peak is unknown)."""

    stage: str
    time_ms: float
    flops: float
    bytes: float
    arithmetic_intensity: float | None  # FLOP / byte
    ridge_point: float | None  # FLOP / byte where the device's compute and bandwidth roofs meet
    bound: str | None  # "compute" | "memory"
    mfu: float | None
    mbu: float | None
    speed_of_light_ms: float | None
    gap: float | None  # measured / speed of light
    flops_source: str
    bytes_source: str = BYTES_SOURCE


@attrs.frozen
class Throughput:
    decode_tokens_per_s: float  # one input's decode steps / decode time (median over passes)
    # Inputs finished per second end to end, median over the timed forwards (a batch pass finishes all its inputs):
    # the same figure as `PageThroughput.pages_per_s` (folders before 1.4 held 1 / median per-input latency here).
    e2e_images_per_s: float
    e2e_tokens_per_s: float  # every input's new tokens / the forward's end-to-end time (median)


# How a run's FLOPs are counted (instruments.flops; the MFU and roofline records carry it).
FLOP_SOURCE = (
    "counted on the real modules with torch FlopCounterMode (+ grouped_mm, transformers' grouped_mm fallback, "
    "CPU-SDPA and GQA-SDPA formulas); 1 MAC = 2 FLOPs; matmul/conv/attention only"
)


# The parts of the time per page (`PagePart.part`), in the order a page goes through them.
PAGE_PREPROCESS = "preprocess"
PAGE_VISION = "vision"
PAGE_LM_PREFILL = "language-model prefill"
PAGE_DECODE = "decode"


@attrs.frozen
class PagePart:
    """One part of the time per page at the run's batch: the median over the timed forwards of the part's time
    divided by the inputs the forward holds, beside its floor (the analytic speed of light of the same work:
    counted FLOPs at the dense peak or priced bytes at the peak bandwidth, whichever is longer)."""

    part: str  # one of the PAGE_* names
    ms_per_page: float
    floor_ms_per_page: float | None  # None: not priced (preprocessing, or no peaks or analytic model)


@attrs.frozen
class PageThroughput:
    """Pages per second as a workload: every timed forward (one input, or one batch) from the first byte of its
    preprocessing to its last token. One value per forward in each summary; every input of a batch pass shares
    its time to first and last token."""

    batch_size: int  # inputs per forward the figures are for
    pages_per_s: Summary  # inputs finished / the forward's end-to-end time
    tokens_per_s: Summary  # every input's new tokens / the forward's end-to-end time
    ttft_ms: Summary  # time to first token of a page (its forward's preprocessing and prefill)
    ttlt_ms: Summary  # time to last token of a page (its forward's end to end)
    parts: tuple[PagePart, ...]  # the time per page, split (PAGE_*)
    # of the forwards (`pages_per_s.n`), those whose page files were decoded ahead (`runtime.prefetch_pages`)
    prefetched: int = 0

    @property
    def bound_by(self) -> PagePart | None:
        """The part that holds the most time per page."""
        return max(self.parts, key=lambda p: p.ms_per_page, default=None)

    @property
    def floor_ms_per_page(self) -> float | None:
        """The priced parts' floors summed (preprocessing has none); None when the model's stages are not priced."""
        floors = [p.floor_ms_per_page for p in self.parts if p.part != PAGE_PREPROCESS]
        return sum(f for f in floors if f is not None) if floors and None not in floors else None


@attrs.frozen
class ShapeGroup:
    """The calls of one operator with one set of input shapes (`record_shapes`)."""

    shapes: str  # the input shapes as the profiler gives them, e.g. "[[1, 903, 1280], [1280, 1280]]"
    calls: int
    self_device_ms: float
    self_cpu_ms: float


@attrs.frozen
class CallSite:
    """Where in the model's Python code an operator is called from (`with_stack`): innermost frame first."""

    frames: tuple[str, ...]  # "file.py(line): function", framework frames (torch, wrappers) left out
    calls: int


@attrs.frozen
class OperatorRow:
    """One operator name, aggregated over its calls (times in ms)."""

    name: str
    calls: int
    self_device_ms: float
    total_device_ms: float  # inclusive of child ops; do not sum this column
    self_cpu_ms: float
    total_cpu_ms: float  # inclusive of child ops; do not sum this column
    flops: float  # from the profiler's with_flops estimate (0 when not estimated)
    # Present only when the profiled pass recorded them (pipeline.torch_profiler record_shapes / profile_memory /
    # with_stack); absent from older files.
    shapes: tuple[ShapeGroup, ...] = ()  # the most frequent input-shape groups, by calls
    self_cpu_memory_bytes: int | None = None  # host memory allocated minus freed by the operator itself
    self_device_memory_bytes: int | None = None  # the same on the GPU (None on CPU runs)
    call_sites: tuple[CallSite, ...] = ()  # the most frequent call sites, by calls
    call_site_count: int = 0  # distinct call sites seen (call_sites holds the top ones)


@attrs.frozen
class StepActivity:
    """GPU activity of one forward pass of the profiled pass (the prefill or one decode step)."""

    kernels: int
    kernel_ms: float  # summed kernel durations (overlapping kernels counted each)
    busy_ms: float  # union of the kernel intervals: time the GPU ran at least one of them
    wall_ms: float  # from the step's start (its host span start, or the previous step's last kernel end if later)
    # to its end (its last kernel end, or its host span end if later)


@attrs.frozen
class DecodeActivity:
    """Kernels launched and GPU busy time per decode step and for the prefill, from the profiled pass (CUDA only)."""

    steps: int  # decode steps profiled
    kernels_mean: float
    kernels_min: int
    kernels_max: int
    kernel_ms_mean: float
    busy_ms_mean: float
    wall_ms_mean: float
    busy_fraction: float  # summed busy time / summed wall time over the decode steps
    prefill: StepActivity | None
    unattributed_kernels: int  # kernels whose launch could not be tied to a profiled span (outside every step)
    method: str


@attrs.frozen
class OperatorTable:
    """Operators of the profiled pass, overall and per stage (`operators.json`)."""

    sort_key: str  # "self_device_ms" on GPU, "self_cpu_ms" on CPU
    overall: tuple[OperatorRow, ...]  # host-side operators (their device time is that of the kernels they launch)
    kernels: tuple[OperatorRow, ...]  # GPU kernels by short name (device time only); empty on CPU
    by_stage: Mapping[str, tuple[OperatorRow, ...]]
    events: int
    decode_steps: int
    postprocess_s: float
    trace_path: str | None
    activity: DecodeActivity | None = None  # CUDA runs: kernels and GPU busy time per decode step
    modules: ModuleTimes | None = None  # pipeline.torch_profiler.modules: kernel time by module and stage
    # Of postprocess_s: torch's own parsing of the pass into its event tree (None: this torch does not say)
    torch_parse_s: float | None = None
    inputs: int = 1  # inputs in the profiled pass (a batched run's first batch)
    # Inputs whose vision ran under the profiler (pipeline.torch_profiler.max_vision_inputs); None: all of them
    vision_inputs: int | None = None

    def bound_text(self) -> str | None:
        """How the pass was bounded at a large batch, in words; None when it profiled every input's vision."""
        if self.vision_inputs is None:
            return None
        rest = self.inputs - self.vision_inputs
        return (
            f"the vision of {self.vision_inputs} of the batch's {self.inputs} inputs was profiled; the other {rest} "
            "were embedded before the profiler started, so their vision is in no table here, while prefill and "
            "decode are the whole batch's (pipeline.torch_profiler.max_vision_inputs)"
        )


@attrs.frozen
class ProfilerInfo:
    """The profiled pass in brief (the full table is `operators.json`)."""

    events: int
    decode_steps: int
    postprocess_s: float
    trace: str | None
    activity: DecodeActivity | None = None  # CUDA runs: kernels and GPU busy time per decode step
    torch_parse_s: float | None = None  # of postprocess_s: torch's own parsing of the pass into its event tree


@attrs.frozen
class ProfilerSettings:
    """The torch-profiler settings the run used."""

    enable: bool = False
    decode_steps: int = 0
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    chrome_trace: bool = False
    top_k: int = 0
    max_vision_inputs: int = 0  # a batch's inputs whose vision the profiled pass profiles (0: all)
    modules: bool = False  # kernel time by module (module ranges in the profiled pass)


@attrs.frozen
class PredictionOutput:
    """`predictions.jsonl`: the generated tokens and text of each input."""

    enable: bool = True
    save_dir: str = "predictions"  # relative to the run folder, or absolute


@attrs.frozen
class VisualizationOutput:
    """The gallery: `predictions.md` with a thumbnail (and grounding boxes) per image."""

    enable: bool = True
    save_dir: str = "viz"  # relative to the run folder, or absolute


@attrs.frozen
class DeepSeekOCROutput:
    """DeepSeek-OCR knobs: special tokens in the decoded text, gallery size and thumbnail width."""

    strip_special_tokens: bool = False
    max_images: int = 16  # images shown in the gallery, the first ones in run order
    thumbnail_width: int = 480  # pixels


@attrs.frozen
class OutputExtra:
    """Model-specific output knobs, by model family."""

    deepseek_ocr: DeepSeekOCROutput = attrs.field(factory=DeepSeekOCROutput)


@attrs.frozen
class OutputSettings:
    """Where and whether a run writes its predictions and the gallery (`pipeline.torch_profiler.output`)."""

    prediction: PredictionOutput = attrs.field(factory=PredictionOutput)
    visualization: VisualizationOutput = attrs.field(factory=VisualizationOutput)
    extra: OutputExtra = attrs.field(factory=OutputExtra)


#: The value of an inductor option (`runtime.compile_options`), saved as it is.
OptionValue = bool | int | float | str
#: An inductor option set on top of the compile mode's (`runtime.compile_options`): (name, value).
CompileOption = tuple[str, OptionValue]


#: torch.compile modes that capture the compiled step in CUDA graphs (inductor's `triton.cudagraphs`).
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")

#: What a runtime can compile (the setting's key) -> the key of the mode it compiles with.
MODE_KEYS = {"runtime.compile": "runtime.compile_mode", "runtime.compile_vision": "runtime.compile_vision"}


@attrs.frozen
class CompiledPart:
    """One thing a runtime compiles: the setting that asks for it (`key=value`) and the mode it compiles with."""

    key: str  # a key of MODE_KEYS
    value: str
    mode: str

    @property
    def mode_key(self) -> str:
        return MODE_KEYS[self.key]

    @property
    def cuda_graphs(self) -> bool:
        return self.mode in CUDA_GRAPH_MODES

    @property
    def warmup_needed(self) -> int:
        """One pass compiles each shape; with CUDA graphs a function called once per pass is recorded as a graph in
        its second call and replayed from the third."""
        return 2 if self.cuda_graphs else 1

    @property
    def text(self) -> str:
        """e.g. "runtime.compile=decode (compile_mode reduce-overhead)", "runtime.compile_vision=default"."""
        setting = f"{self.key}={self.value}"
        return setting if self.mode_key == self.key else f"{setting} ({self.mode_key.split('.')[-1]} {self.mode})"


@attrs.frozen
class DecoderRuntime:
    """The decoder's runtime (`runtime.*`, `run.batch_size`): the fields `session.runtime.RuntimeSettings` checks
    and `RuntimeRecord` saves, defined once here."""

    kv_cache: str = "dynamic"  # dynamic | static
    compile: str = "none"  # none | decode | prefill_decode
    compile_mode: str = "reduce-overhead"
    static_cache_len: int | None = None
    batch_size: int = 1
    record_routing: bool = True
    output_check: str = "auto"
    compile_options: tuple[CompileOption, ...] = ()  # inductor options on top of compile_mode's, sorted by name
    # none, or the torch.compile mode of the vision stage modules' forwards (SAM, CLIP, ...; their stage timing stays)
    compile_vision: str = "none"
    # the views of a batch's inputs through the vision stages together, by view shape (`runtime.batch_vision`)
    batch_vision: bool = False
    # threads that preprocess a batch's inputs together (`runtime.preprocess_workers`; 0 or 1: one after the other)
    preprocess_workers: int = 0
    # the next pass's page files decoded on threads while a pass runs (`runtime.prefetch_pages`)
    prefetch_pages: bool = False
    # none, or the torchao weight quantization of the language model's Linear layers (`runtime.quantize`)
    quantize: str = "none"

    def described(self, batch: str) -> str:
        """One line for reports with `batch` (e.g. "batch 1 (run.batch_size=2, 1 input)") in place of the configured
        size, e.g. "static KV cache, compiled decode (reduce-overhead), batch 4"."""
        cache_len = f" of {self.static_cache_len} positions" if self.static_cache_len is not None else ""
        parts = [f"{self.kv_cache} KV cache{cache_len}"]
        if self.quantize != "none":
            parts.insert(0, QUANTIZE_LABELS.get(self.quantize, self.quantize))
        if self.compile != "none":
            what = "decode" if self.compile == "decode" else "prefill and decode"
            tuned = "".join(f", {name}={value}" for name, value in self.compile_options)
            parts.append(f"compiled {what} ({self.compile_mode}{tuned})")
        else:
            parts.append("eager")
        if self.compile_vision != "none":
            parts.append(f"compiled vision ({self.compile_vision})")
        parts.append(batch + (" (vision batched)" if self.batch_vision else ""))
        if self.preprocess_workers > 1:
            parts.append(f"preprocessing on {self.preprocess_workers} threads")
        if self.prefetch_pages:
            parts.append("next pages decoded ahead")
        return ", ".join(parts)

    @property
    def uses_cuda_graphs(self) -> bool:
        """Whether a compiled step is replayed from CUDA graphs."""
        return self.compile != "none" and self.compile_mode in CUDA_GRAPH_MODES

    @property
    def compiled_parts(self) -> tuple[CompiledPart, ...]:
        """What is compiled: the decoder's steps (`runtime.compile`), the vision modules (`runtime.compile_vision`)."""
        parts = (
            CompiledPart("runtime.compile", self.compile, self.compile_mode),
            CompiledPart("runtime.compile_vision", self.compile_vision, self.compile_vision),
        )
        return tuple(part for part in parts if part.value != "none")

    @property
    def compiles(self) -> bool:
        """Whether anything is compiled: the decoder's steps or the vision modules."""
        return bool(self.compiled_parts)


@attrs.frozen
class RuntimeRecord(DecoderRuntime):
    """How the decoder ran: its runtime settings as they were, and their one-line label."""

    label: str = "dynamic KV cache, eager, batch 1"


@attrs.frozen
class RunSettings:
    """The effective settings of a run and where each came from (`sources`: key -> "config/override" or
    "device default (cpu)")."""

    repeats: int
    warmup: int
    max_new_tokens: int
    max_images: int | None
    sources: Mapping[str, str]
    batch_size: int = attrs.field(init=False)  # run.batch_size: the runtime's (`runtime.batch_size`), saved here too
    decoding: str = "greedy, fixed length (EOS ignored), first token from prefill"
    partial: bool = False
    workload_profile: Mapping[str, Any] | None = None
    input_kind: str = "image"  # "image" | "text"
    inputs_note: str | None = None
    profiler: ProfilerSettings | None = None
    measured_passes: int | None = None  # timed passes actually measured (fewer than asked when interrupted)
    asked_passes: int | None = None  # inputs x repeats
    outputs: OutputSettings = attrs.field(factory=OutputSettings)
    runtime: RuntimeRecord = attrs.field(factory=RuntimeRecord)
    fill_batches: bool = False  # run.fill_batches: batches filled to run.batch_size with copies of their inputs
    cpu_affinity: str | None = None  # run.cpu_affinity as applied (session.cpu_affinity.CpuPin.describe)

    @property
    def pinned(self) -> bool:
        """Whether the run's process was pinned to some cores (`cpu_affinity` recorded and not NOT_PINNED)."""
        return bool(self.cpu_affinity) and not str(self.cpu_affinity).startswith(NOT_PINNED)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "batch_size", self.runtime.batch_size)  # derived after `runtime`, set before it


@attrs.frozen
class OutputCheck:
    """One run's outputs against the reference of the same input."""

    first_departure: int | None  # first generated index whose token differs from the reference; None: none does
    compared_tokens: int  # generated tokens compared
    prefill_logits_max_abs_diff: float  # max |logit − reference logit| at the last prompt position

    @property
    def identical_tokens(self) -> bool:
        return self.first_departure is None


@attrs.frozen
class TopTwoLogits:
    """One input's eager greedy pass (dynamic cache, untimed) with the two highest logits behind each generated
    token: the candidates each greedy choice was made between and how far apart they were (`run.save_top2_logits`;
    perf-whatif judges an output departure at a near-tie by them)."""

    tokens: tuple[int, ...]  # the pass's generated ids
    ids: tuple[tuple[int, int], ...]  # per generated token: the highest and the second-highest token id
    logits: tuple[tuple[float, float], ...]  # their logits


@attrs.frozen
class TopTwoRecord:
    """`top2_logits.json`: each input's :class:`TopTwoLogits`, by input key."""

    schema_version: str
    inputs: Mapping[str, TopTwoLogits]


@attrs.frozen
class CompileEvent:
    """One call of a compiled step during which TorchDynamo compiled (first call of a shape, or a recompile)."""

    function: str  # "decode" or "prefill"
    shape: tuple[int, ...]  # (batch, query tokens, KV cache positions)
    call: int  # 1-based call number of this function
    host_ms: float  # wall time of the whole call (tracing, compilation and the step itself)
    frames: int  # frames TorchDynamo compiled during the call
    graph_breaks: int  # graph breaks found during the call
    recompile: bool  # True when the function had compiled before (a guard failed)


@attrs.frozen
class LayerRouting:
    """Distinct experts per decode step in one MoE layer."""

    layer: int
    unique_per_step: Summary  # unit "experts"


@attrs.frozen
class RoutingSummary:
    """Routing of all decode steps of some passes: distinct experts per step per layer, and how often each expert
    was hit."""

    experts: int
    top_k: int
    tokens_per_step: int
    steps: int  # decode steps summarised (all passes)
    per_layer: tuple[LayerRouting, ...]
    overall: Summary  # distinct experts per step and layer, every MoE layer pooled
    expected_unique: float  # E·(1 − (1 − k/E)^B) for B = tokens_per_step
    hit_histogram: tuple[tuple[int, ...], ...]  # MoE layer -> expert -> decode steps that hit it


@attrs.frozen
class HostUsage:
    """What the host spent on the timed passes: this process and its threads, from `getrusage` around each timed
    pass. A host-paced run that slows while its kernels do not shows why here: CPU time against wall time, page
    faults, and involuntary context switches (the scheduler took the CPU away)."""

    passes: int
    wall_s: float
    user_cpu_s: float
    system_cpu_s: float
    minor_faults: int
    major_faults: int  # faults that read from disk
    voluntary_switches: int  # the process waited (for the GPU, I/O or a lock)
    involuntary_switches: int
    # CPU time of the thread that ran the passes (time.thread_time), the rest being torch's, the driver's and other
    # threads': the same passes on a slower CPU cost this thread more; a busier other thread shows as the rest.
    # None: not recorded (older runs)
    pass_thread_cpu_s: float | None = None

    def per_pass(self, value: float) -> float:
        return value / self.passes if self.passes else 0.0


@attrs.frozen
class CompileSummary:
    """Compilation cost of a session so far (a run: warm-up passes included), per compiled call and in all."""

    events: tuple[CompileEvent, ...]
    cudagraph_skips: int  # times inductor declined to capture a CUDA graph (reduce-overhead only)
    # The compiling calls that fell in timed passes (their times include compilation); None: not recorded (older)
    in_timed_passes: tuple[CompileEvent, ...] | None = None

    @property
    def compile_ms(self) -> float:
        """Host time of every call that compiled (ms)."""
        return sum(e.host_ms for e in self.events)

    @property
    def recompiles(self) -> int:
        return sum(1 for e in self.events if e.recompile)


@attrs.frozen
class MeasuredPeaks:
    """MFU and MBU against the achievable peaks measured on this GPU (a second denominator beside the datasheet)."""

    compute: PeakFigure | None
    bandwidth: PeakFigure | None
    mfu: tuple[MfuRecord, ...]
    efficiency: tuple[StageEfficiency, ...]


@attrs.frozen
class Stage1Metrics:
    """`metrics.json` of a Stage 1 run."""

    schema_version: str
    run_id: str
    stage: str
    created: str
    model: ModelInfo
    device: DeviceInfo
    settings: RunSettings
    stages: tuple[StageStat, ...]
    throughput: Throughput
    mfu: tuple[MfuRecord, ...]
    top_operators: tuple[OperatorRow, ...]
    operator_sort_key: str | None
    warnings: tuple[str, ...]
    config_digest: str
    # Absent from older (1.0) files or from trimmed copies: read as empty.
    records: tuple[ImageRecord, ...] = ()
    # Each input's first pass (its first warm-up pass, outside every timed figure; in a batch run its batch's, given
    # to each input as the timed records are: the batch's preprocessing, prefill and decode, the input's own vision), at
    # shapes the process had not run: what a page of unseen shapes costs (e.g. cuDNN's attention plan per new length).
    first_passes: tuple[ImageRecord, ...] = ()
    per_image: Mapping[str, tuple[StageStat, ...]] = attrs.field(factory=dict)
    efficiency: tuple[StageEfficiency, ...] = ()  # MBU, roofline, speed of light per stage
    bandwidth_peak: PeakFigure | None = None
    flops_per_image: Mapping[str, Mapping[str, float]] = attrs.field(factory=dict)  # image -> stage -> FLOPs/pass
    profiler: ProfilerInfo | None = None
    variation: tuple[StageVariation, ...] = ()  # run-to-run dispersion within each image, and over the image mix
    # hardware.peaks=measured: the same figures against this GPU's measured achievable peaks (GEMM and copy)
    measured_peaks: MeasuredPeaks | None = None
    routing: RoutingSummary | None = None  # MoE decoders: experts hit per decode step (timed passes)
    compile: CompileSummary | None = None  # runtime.compile != none
    host_peak_rss_bytes: int | None = None  # the process's peak resident memory over the whole run (host side)
    host_usage: HostUsage | None = None  # CPU time, page faults and context switches over the timed passes
    # run.batch_size > 1: every timed batch pass, their summary, and each batch's counted FLOPs per stage and pass
    batches: tuple[BatchRecord, ...] = ()
    batch_summary: BatchSummary | None = None
    flops_per_batch: Mapping[str, Mapping[str, float]] = attrs.field(factory=dict)  # batch key -> stage -> FLOPs
    modules: ModuleAttribution | None = None  # the profiled pass's kernel time by module, beside each module's floor
    # The memory and energy passes (schema 1.3; None in older folders, whose reports say they were not recorded)
    memory: MemoryReport | None = None
    energy: EnergyReport | None = None
    time_budget: TimeBudget | None = None  # where the command's wall time went (None in older folders)
    pages: PageThroughput | None = None  # pages/s, per-page latency and the time per page (schema 1.4)
    # Every timed forward on the wall clock, and the share of a data-parallel workload this process timed
    # (run.data_parallel; None in a run of one process); absent from older folders
    timed_windows: tuple[PassWindow, ...] = ()
    data_parallel: ShardInfo | None = None

    @property
    def vision_stages(self) -> tuple[str, ...]:
        """The model's vision sub-stages, in the order they were recorded."""
        return tuple(dict.fromkeys(s for r in self.records for s in r.vision_ms))

    @property
    def images(self) -> tuple[str, ...]:
        """The inputs that were timed, in run order."""
        return tuple(dict.fromkeys(r.image for r in self.records))

    @property
    def forwards(self) -> tuple[ImageRecord, ...] | tuple[BatchRecord, ...]:
        """The timed forwards, one per pass over one forward (`per_forward`): the batch records when the run
        batched, else the per-input records."""
        return per_forward(self.batches, self.records, self.batches)

    def flops_of(self, forward: ImageRecord | BatchRecord) -> Mapping[str, float]:
        """Counted FLOPs per stage of one timed forward (a batch's, or an input's)."""
        if isinstance(forward, BatchRecord):
            return self.flops_per_batch.get(forward.cost_key, {})
        return self.flops_per_image.get(forward.image, {})

    def stage_stat(self, name: str) -> StageStat | None:
        return next((s for s in self.stages if s.stage == name), None)

    def mfu_of(self, name: str) -> MfuRecord | None:
        return next((r for r in self.mfu if r.stage == name), None)

    def efficiency_of(self, name: str) -> StageEfficiency | None:
        return next((e for e in self.efficiency if e.stage == name), None)

    def first_pass_extras_ms(self) -> tuple[float, ...]:
        """Each input's first pass minus its timed median, end to end (ms; negative where the first pass was the
        quicker), in run order, for the inputs with both."""
        median = {image: s.summary.p50 for image, stats in self.per_image.items() for s in stats if s.stage == E2E}
        return tuple(f.e2e_ms - median[f.image] for f in self.first_passes if median.get(f.image) is not None)

    @property
    def first_pass_extra_ms(self) -> float | None:
        """The most an input's first pass took beyond its timed median (ms, at least 0): the one-time cost a page of
        shapes not met before waits for; None where the run kept no first pass of a timed input."""
        extras = self.first_pass_extras_ms()
        return max(0.0, *extras) if extras else None

    @property
    def compute_peak(self) -> PeakFigure | None:
        """The dense compute peak MFU used (one per run)."""
        return next((r.peak for r in self.mfu if r.peak is not None), None)


@attrs.frozen
class ImageInput:
    """One image of the run (path absolute, size in pixels, file size in bytes)."""

    path: str
    width: int  # pixels, upright (after the EXIF orientation is applied)
    height: int
    bytes: int
    orientation: int | None = None  # the EXIF orientation tag applied (1..8); None when the file has none


@attrs.frozen
class TextInput:
    """One text prompt of the run (path absolute, length in characters, file size in bytes)."""

    path: str
    characters: int
    bytes: int


@attrs.frozen
class SkippedInput:
    path: str
    reason: str


@attrs.frozen
class InputFate:
    """What happened to one file the input selection considered."""

    path: str
    fate: str  # "run" | "skipped" | "not selected"
    reason: str | None = None  # why it was skipped or not selected


@attrs.frozen
class InputsManifest:
    """`inputs.yaml`: the inputs a run discovered, ran and skipped."""

    dataset_root: str
    subset_filelist: str | None
    discovered: int
    sampling: str
    seed: int
    max_images: int | None
    count: int
    kind: str  # "image" | "text"
    chosen_because: str | None
    images: tuple[ImageInput | TextInput, ...]
    skipped: tuple[SkippedInput, ...]
    fates: tuple[InputFate, ...] = ()  # every file considered, once each, in run order


@attrs.frozen
class Prediction:
    """One line of `predictions/predictions.jsonl`: the tokens generated for one input."""

    image: str
    path: str
    token_ids: tuple[int, ...]
    tokens: int
    text: str | None
    weights: str
