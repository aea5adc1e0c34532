"""Sessions: load a model once, run many inputs through explicit prefill and decode steps.

`InferenceSession` runs any model an adapter builds (DeepSeek-OCR v1 and OCR-2, Hugging Face causal LMs and
image-text-to-text models); `DeepSeekOCRSession` is the same session for the DeepSeek-OCR family only."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import attrs
import torch
from PIL import Image
from torch.utils.hooks import RemovableHandle

from llm_perf_opt.errors import UserError
from llm_perf_opt.instruments.profiler_window import ProfilerWindow
from llm_perf_opt.instruments.routing import RoutingRecorder
from llm_perf_opt.instruments.timing import NullRecorder, StageRecorder
from llm_perf_opt.measure.routing_summary import RoutingTrace, mean_unique_experts
from llm_perf_opt.models.sam_flex_attention import apply_sam_attention
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.stage1 import (
    BatchRecord,
    CompileSummary,
    ImageRecord,
    PassTimes,
    TopTwoLogits,
    aggregate_decode_rate,
    pages_rate,
)
from llm_perf_opt.session import saved_model
from llm_perf_opt.session.adapters.base import LoadedModel, ModelAdapter, PreparedInputs
from llm_perf_opt.session.adapters.deepseek_ocr import DeepseekOcrAdapter
from llm_perf_opt.session.adapters.deepseek_ocr2 import DeepseekOcr2Adapter
from llm_perf_opt.session.adapters.registry import make_adapter
from llm_perf_opt.session.compiled import (
    CompiledForward,
    CompileEvent,
    compile_forwards,
    cudagraph_skips,
    eager_forwards,
    restore_forwards,
)
from llm_perf_opt.session.decode import AroundStep, DecodeLoop, EmbedInput, LoopOutput
from llm_perf_opt.session.kv_cache import KvCaches, static_cache_error
from llm_perf_opt.session.model_settings import ModelSettings
from llm_perf_opt.session.output_check import OutputCheck, ReferenceOutput, ReferenceOutputs, compare_outputs
from llm_perf_opt.session.prefetch import PagePrefetch, close_images
from llm_perf_opt.session.quantize import quantize_linears
from llm_perf_opt.session.runtime import EAGER_REFERENCE, RuntimeSettings

if TYPE_CHECKING:
    from llm_perf_opt.instruments.compiled_modules import InductorProvenance

log = logging.getLogger("llm_perf_opt.session")

_TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_device(spec: str) -> torch.device:
    """`auto` | `cpu` | `cuda` | `cuda:N` -> a device that exists here."""
    spec = str(spec).strip().lower()
    if spec == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "cuda" or spec.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise UserError(
                f"device={spec} was asked for but PyTorch sees no CUDA GPU here "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'none'})",
                "Run on a machine with an NVIDIA GPU and a CUDA build of torch, or use device=cpu (or device=auto)",
            )
        index = _cuda_index(spec)
        if index >= torch.cuda.device_count():
            raise UserError(
                f"device={spec} names GPU {index} but only {torch.cuda.device_count()} GPU(s) are visible",
                f"Use device=cuda:0 … cuda:{torch.cuda.device_count() - 1}, or check CUDA_VISIBLE_DEVICES",
            )
        return torch.device("cuda", index)
    raise UserError(f"device={spec} is not a device name", "Use device=auto, device=cpu, device=cuda or cuda:N")


def _cuda_index(spec: str) -> int:
    if ":" not in spec:
        return torch.cuda.current_device()
    text = spec.split(":", 1)[1]
    if not text.isdigit():
        raise UserError(f"device={spec} has no valid GPU index", "Use device=cuda:N with N = 0, 1, …")
    return int(text)


def resolve_dtype(spec: str | None, device: torch.device) -> torch.dtype:
    """null -> bfloat16 on CUDA, float32 on CPU; otherwise the named dtype."""
    if spec is None or str(spec).lower() in ("", "auto", "none"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    canonical = vocab.canonical_dtype(str(spec))
    if canonical is None:
        raise UserError(
            f"model.dtype={spec} is not a supported compute dtype",
            f"Use model.dtype={vocab.SUPPORTED_DTYPES_TEXT} (or leave it unset: bf16 on GPU, fp32 on CPU)",
        )
    return _TORCH_DTYPES[canonical]


def device_name(device: torch.device) -> str:
    """The GPU's marketing name (as torch reports it) or the CPU's model."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from llm_perf_opt.env_info import cpu_model

    return cpu_model()


class StagePassTimes(PassTimes):
    """A measured pass's prefill (vision included) and decode times (ms), from its stage times."""

    __slots__ = ()

    if TYPE_CHECKING:

        @property
        def stage_ms(self) -> Mapping[str, float]: ...

    @property
    def prefill_ms(self) -> float:
        return self.stage_ms[vocab.PREFILL]

    @property
    def decode_ms(self) -> float:
        return self.stage_ms.get(vocab.DECODE, 0.0)


@attrs.frozen
class ImageMeasurement(StagePassTimes):
    """One pass over one image: stage times (ms), tokens and memory."""

    preprocess_ms: float
    stage_ms: Mapping[str, float]  # per stage name: summed over the stage's spans (vision sub-stages included)
    stage_calls: Mapping[str, int]
    decode_step_ms: tuple[float, ...]
    token_ids: tuple[int, ...]
    prompt_tokens: int
    image_tokens: int
    tiles: int
    peak_memory_bytes: int | None
    routing: RoutingTrace | None = None  # experts each decode step hit (MoE decoders with runtime.record_routing)
    compile_events: tuple[CompileEvent, ...] = ()  # compilations during this pass (recorded when it is timed)
    output_check: OutputCheck | None = None  # against the eager dynamic-cache reference (runtime.output_check)
    # (vocab,) float32 logits at the last prompt position, when the session keeps them (`keep_prefill_logits`)
    prefill_logits: torch.Tensor | None = attrs.field(default=None, eq=False, repr=False)
    prefetched: bool = False  # its page file(s) decoded ahead while the previous pass ran (runtime.prefetch_pages)

    def record(
        self, image: str, repeat: int, vision_stages: tuple[str, ...], crop_grid: tuple[int, int] | None
    ) -> ImageRecord:
        """This pass as the `ImageRecord` of input `image` (its key) and timed pass `repeat`."""
        return ImageRecord(
            image=image,
            repeat=repeat,
            preprocess_ms=self.preprocess_ms,
            prefill_ms=self.prefill_ms,
            vision_ms={s: self.stage_ms.get(s, 0.0) for s in vision_stages},
            decode_ms=self.decode_ms,
            decode_step_ms=self.decode_step_ms,
            new_tokens=len(self.token_ids),
            prompt_tokens=self.prompt_tokens,
            image_tokens=self.image_tokens,
            tiles=self.tiles,
            peak_memory_bytes=self.peak_memory_bytes,
            crop_grid=crop_grid,
            output_check=self.output_check,
            prefetched=self.prefetched,
        )


@attrs.frozen
class PageResult:
    """One input of a batch: its own preprocessing, vision and tokens."""

    input: str  # the input file
    prompt_tokens: int
    image_tokens: int
    tiles: int
    preprocess_ms: float  # this input's preprocessing
    # this input's vision sub-stages (inputs run their vision one after the other); with batched vision (or one
    # input), an equal share of the batch's (`InferenceSession.run_batch`)
    vision_ms: Mapping[str, float]
    vision_calls: Mapping[str, int]
    token_ids: tuple[int, ...]
    output_check: OutputCheck | None  # against this input run alone, eager, dynamic cache (runtime.output_check)
    prefill_logits: torch.Tensor | None = attrs.field(default=None, eq=False, repr=False)  # see ImageMeasurement


@attrs.frozen
class BatchMeasurement(StagePassTimes):
    """One pass over a batch: per-input results and the batch's stage times (ms), tokens and memory (time to first
    token and decode time are the batch's, for every input)."""

    pages: tuple[PageResult, ...]
    stage_ms: Mapping[str, float]  # prefill (every input's vision + the batched decoder prefill), decode, decode/step,
    # and each vision sub-stage summed over the inputs (with batched vision: the batch's own calls, once per batch)
    stage_calls: Mapping[str, int]
    decode_step_ms: tuple[float, ...]  # one per decode step of the whole batch
    padded_prompt_tokens: int  # prompt positions after left padding (the longest prompt)
    peak_memory_bytes: int | None
    routing: RoutingTrace | None = None  # tokens_per_step = batch size
    compile_events: tuple[CompileEvent, ...] = ()
    prefetched: bool = False  # its page files decoded ahead while the previous pass ran (runtime.prefetch_pages)

    @property
    def batch_size(self) -> int:
        return len(self.pages)

    @property
    def new_tokens(self) -> int:
        """Tokens generated per input (the first from prefill)."""
        return len(self.pages[0].token_ids)

    @property
    def preprocess_ms(self) -> float:
        """All inputs' preprocessing (one after the other, before the batch's prefill)."""
        return sum(p.preprocess_ms for p in self.pages)

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Decode tokens per second of one input (tokens after the first, over the decode time)."""
        return aggregate_decode_rate(self.new_tokens, self.decode_ms, 1)

    @property
    def aggregate_decode_tokens_per_s(self) -> float | None:
        """Decode tokens per second of the whole batch (as its `BatchRecord` saves it)."""
        return aggregate_decode_rate(self.new_tokens, self.decode_ms, self.batch_size)

    @property
    def pages_per_s(self) -> float:
        """Inputs finished per second, end to end (as its `BatchRecord` saves it)."""
        return pages_rate(self.batch_size, self.e2e_ms)

    def page_measurements(self) -> tuple[ImageMeasurement, ...]:
        """Each input as an :class:`ImageMeasurement`: its own vision sub-stages and tokens; the batch's
        preprocessing, prefill and decode (what it waited for); routing and compile events stay on the batch."""
        batch_stages = {s: ms for s, ms in self.stage_ms.items() if not vocab.is_vision(s)}
        batch_calls = {s: n for s, n in self.stage_calls.items() if not vocab.is_vision(s)}
        return tuple(
            ImageMeasurement(
                preprocess_ms=self.preprocess_ms,
                stage_ms={**batch_stages, **page.vision_ms},
                stage_calls={**batch_calls, **page.vision_calls},
                decode_step_ms=self.decode_step_ms,
                token_ids=page.token_ids,
                prompt_tokens=page.prompt_tokens,
                image_tokens=page.image_tokens,
                tiles=page.tiles,
                peak_memory_bytes=self.peak_memory_bytes,
                output_check=page.output_check,
                prefill_logits=page.prefill_logits,
                prefetched=self.prefetched,
            )
            for page in self.pages
        )

    def record(self, index: int, repeat: int, keys: tuple[str, ...]) -> BatchRecord:
        """This pass as the `BatchRecord` of batch `index` (its inputs' keys `keys`) and timed pass `repeat`."""
        return BatchRecord(
            batch=index,
            repeat=repeat,
            images=keys,
            preprocess_ms=self.preprocess_ms,
            prefill_ms=self.prefill_ms,
            vision_ms={s: ms for s, ms in self.stage_ms.items() if vocab.is_vision(s)},
            decode_ms=self.decode_ms,
            decode_step_ms=self.decode_step_ms,
            new_tokens=self.new_tokens,
            padded_prompt_tokens=self.padded_prompt_tokens,
            peak_memory_bytes=self.peak_memory_bytes,
            experts_hit_per_step=None if self.routing is None else mean_unique_experts([self.routing]),
            prefetched=self.prefetched,
        )


def _totals(spans: Sequence[tuple[str, float]]) -> tuple[dict[str, float], dict[str, int]]:
    """Per span name: summed milliseconds and number of spans."""
    totals: dict[str, float] = {}
    calls: dict[str, int] = {}
    for name, ms in spans:
        totals[name] = totals.get(name, 0.0) + ms
        calls[name] = calls.get(name, 0) + 1
    return totals, calls


def batches(paths: Sequence[Path], batch_size: int) -> list[tuple[Path, ...]]:
    """`paths` in order, `batch_size` at a time; the last batch holds what is left (it may be smaller)."""
    if batch_size < 1:
        raise UserError(f"run.batch_size={batch_size} is out of range", "Set run.batch_size to a whole number ≥ 1")
    return [tuple(paths[i : i + batch_size]) for i in range(0, len(paths), batch_size)]


def filled(group: Sequence[Path], batch_size: int) -> tuple[Path, ...]:
    """`group` filled to `batch_size` inputs with copies of its own inputs, in turn (one page: that page B times)."""
    if not group:
        return ()
    return tuple(group[i % len(group)] for i in range(max(batch_size, len(group))))


class InferenceSession:
    """A loaded model and its adapter under one :class:`RuntimeSettings`: :meth:`load` once, then :meth:`run_image`
    (one input) or :meth:`run_batch` (several) many times."""

    def __init__(
        self,
        adapter: ModelAdapter,
        loaded: LoadedModel,
        device: torch.device,
        dtype: torch.dtype,
        runtime: RuntimeSettings | None = None,
    ):
        self.adapter = adapter
        self.loaded = loaded
        self.model = loaded.model
        self.device = device
        self.dtype = dtype
        self.runtime = runtime = runtime or RuntimeSettings()
        runtime.check_device(device)
        quantized = loaded.quantized.setting if loaded.quantized is not None else "none"
        if runtime.quantize != quantized:
            raise ValueError(
                f"the model's weights were quantized as {quantized}, but the runtime has runtime.quantize="
                f"{runtime.quantize}: weight quantization is applied when the model is loaded (InferenceSession.load)"
            )
        adapter.bind_device(device, dtype)
        if runtime.kv_cache == "static" and (blocker := adapter.static_cache_blocker(self.model)):
            raise static_cache_error(blocker)
        if runtime.batch_vision and (blocker := adapter.batch_vision_blocker(self.model)):
            raise UserError(
                f"runtime.batch_vision=true cannot run here: {blocker}",
                "Set runtime.batch_vision=false (each input's vision then runs on its own)",
            )
        self._recorder: StageRecorder | None = None
        self._input_recorders: list[StageRecorder] | None = None  # per input of a batch (its vision sub-stages)
        self._kept_embeds: dict[int, torch.Tensor] = {}  # input index -> its embeddings (`embeddings_kept`)
        self._stage_modules = adapter.stage_modules(self.model)
        self._hooks = self._install_stage_hooks()
        # runtime.compile_vision: each vision stage module's forward compiled apart (its stage hooks stay outside)
        self._vision: tuple[CompiledForward, ...] = (
            compile_forwards(self._stage_modules, runtime.compile_vision) if runtime.compile_vision != "none" else ()
        )
        self.routing = RoutingRecorder.install(self.model) if runtime.record_routing else None
        self._loop = self._make_loop(runtime, self.routing)
        # runtime.prefetch_pages: the next pass's page files, decoding on threads while a pass runs
        self._prefetch: PagePrefetch | None = None
        self._prefetches = runtime.prefetch_pages and adapter.input_kind == "image"
        if runtime.prefetch_pages and not self._prefetches:
            log.warning(
                "runtime.prefetch_pages=true: model %s takes %s inputs, not page images, so nothing is decoded ahead "
                "(each input is prepared in its pass, as without it)",
                adapter.settings.name,
                adapter.input_kind,
            )
        self._cudagraph_skips_before = cudagraph_skips()
        self._reference_loop: DecodeLoop | None = None
        self.references = ReferenceOutputs()
        # Keep each pass's prefill logits (last prompt position) in its measurement (`run.save_prefill_logits`).
        self.keep_prefill_logits = False
        # The CUDA profiler window the timed passes open (`run.profiler_window`: Stage 2's ncu workloads), if any.
        self.profiler_window: ProfilerWindow | None = None
        # Inductor's provenance recorder, installed before the first compile when the profiled pass attributes
        # compiled kernels to modules (the profiled pass then reuses the timed passes' graphs instead of compiling).
        self.compiled_provenance: InductorProvenance | None = None

    def traced_hooked_modules(self) -> frozenset[str]:
        """Paths of the modules with forward hooks of their own inside the compiled decoder (the routing recorder's
        MoE gates; the vision stages' hooked modules are never compiled): a compiled step guards on how many hooks
        they have, so more would recompile it. Empty for an eager runtime."""
        if self.runtime.compile == "none":
            return frozenset()
        stages = {id(m) for m in self._stage_modules.values()}
        return frozenset(
            name
            for name, module in self.model.named_modules()
            if (module._forward_hooks or module._forward_pre_hooks) and id(module) not in stages
        )

    def caches_sized_for(self, new_tokens: int) -> AbstractContextManager[None]:
        """While inside, static caches hold at least `new_tokens` new tokens (a shorter pass reuses them)."""
        return self._loop.caches.sized_for(new_tokens)

    @classmethod
    def load(
        cls, model: ModelSettings | Mapping[str, Any], device: torch.device, runtime: RuntimeSettings | None = None
    ) -> Self:
        """Build (random weights) or load (a checkpoint folder) the model the settings name on `device`, to run under
        `runtime` (default: the eager reference); `runtime.quantize` is applied here, before anything compiles."""
        adapter = make_adapter(model)
        cls.check_adapter(adapter)
        dtype = resolve_dtype(adapter.settings.dtype, device)
        if runtime is not None:
            runtime.check_device(device)  # before minutes of building
        adapter.bind_device(device, dtype)
        path = adapter.checkpoint_path()
        if path:
            loaded = adapter.load_checkpoint(path, device=device, dtype=dtype)
        elif adapter.settings.cache_dir:  # build once, reuse: a saved random-weights model (session.saved_model)
            cache_dir = Path(adapter.settings.cache_dir)
            loaded = saved_model.load_or_build(adapter, device=device, dtype=dtype, cache_dir=cache_dir)
        else:
            loaded = adapter.build_random(device=device, dtype=dtype)
        apply_sam_attention(adapter.settings.sam_attention, loaded.model)
        if runtime is not None and runtime.quantize != "none":
            vision = adapter.stage_modules(loaded.model).values()
            loaded = attrs.evolve(loaded, quantized=quantize_linears(loaded.model, runtime.quantize, vision))
        return cls(adapter, loaded, device, dtype, runtime)

    @classmethod
    def check_adapter(cls, adapter: ModelAdapter) -> None:
        """Whether this kind of session runs `adapter`'s models (every adapter, for the general session)."""

    def with_runtime(self, runtime: RuntimeSettings) -> Self:
        """A session on the same loaded model under another runtime (its own caches, compiled steps and hooks; close
        the one no longer used); `runtime.quantize` must be the loaded model's."""
        return type(self)(self.adapter, self.loaded, self.device, self.dtype, runtime)

    def close(self) -> None:
        """Detach this session's hooks, restore its vision modules' forwards and drop a prefetch in flight."""
        self.discard_prefetch()
        self.remove_stage_hooks()
        restore_forwards(self._vision)
        if self.routing is not None:
            self.routing.remove()
            self.routing = None
            self._loop.routing = None

    def _make_loop(self, runtime: RuntimeSettings, routing: RoutingRecorder | None) -> DecodeLoop:
        config = self.adapter.decoder_config(self.model)
        return DecodeLoop(
            self.model,
            runtime,
            KvCaches(runtime.kv_cache, config, runtime.static_cache_len),
            attn_implementation=getattr(config, "_attn_implementation", None),
            routing=routing,
        )

    @property
    def reference_loop(self) -> DecodeLoop:
        """The eager dynamic-cache loop (FLOP counting, output checks)."""
        if self._reference_loop is None:
            self._reference_loop = self._make_loop(EAGER_REFERENCE, None)
        return self._reference_loop

    def compile_summary(self) -> CompileSummary:
        """Every compilation of this session's steps so far, and the CUDA-graph captures inductor skipped since."""
        steps = [*self._loop.compiled, *(forward.step for forward in self._vision)]
        events = tuple(e for step in steps for e in step.events)
        skips = cudagraph_skips() - self._cudagraph_skips_before if steps else 0
        return CompileSummary(events=events, cudagraph_skips=skips)

    # ---- stage hooks -------------------------------------------------------------------------------
    def _install_stage_hooks(self) -> list[RemovableHandle]:
        handles = []
        for stage, module in self._stage_modules.items():

            def pre_hook(_module: torch.nn.Module, _args: tuple[object, ...], stage: str = stage) -> None:
                if self._recorder is not None:
                    self._recorder.begin(stage)

            def post_hook(
                _module: torch.nn.Module, _args: tuple[object, ...], _out: object, stage: str = stage
            ) -> None:
                if self._recorder is not None:
                    self._recorder.end(stage)

            handles.append(module.register_forward_pre_hook(pre_hook))
            handles.append(module.register_forward_hook(post_hook))
        return handles

    def remove_stage_hooks(self) -> None:
        """Detach the vision-stage hooks (for uninstrumented baselines: bench/instrumentation_overhead.py);
        :meth:`install_stage_hooks` restores them."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    def install_stage_hooks(self) -> None:
        """Attach the vision-stage hooks if they are not attached."""
        if not self._hooks:
            self._hooks = self._install_stage_hooks()

    @property
    def vision_stages(self) -> tuple[str, ...]:
        return tuple(self._stage_modules)

    @contextmanager
    def observe_cache(self, observer: Callable[[Any], None]) -> Iterator[None]:
        """Within the block, `observer` sees each pass's KV cache when it is made and after the prefill."""
        self._loop.cache_observer = observer
        try:
            yield
        finally:
            self._loop.cache_observer = None

    @contextmanager
    def repeat_decode(self, repeater: Callable[[Callable[[], None]], None]) -> Iterator[None]:
        """Within the block, after each pass's decode section `repeater` gets a function that runs it again over the
        same prompt; a pass whose cache cannot rewind raises :class:`DecodeNotRepeatable`."""
        self._loop.decode_repeater = repeater
        try:
            yield
        finally:
            self._loop.decode_repeater = None

    # ---- running -----------------------------------------------------------------------------------
    def prepare(self, input_path: Path, image: Image.Image | None = None) -> PreparedInputs:
        """Preprocess one input file and move it to the device; `image`: the file already decoded (closed here)."""
        try:
            prepared = self.adapter.prepare_file(input_path, self.loaded.tokenizer, image)
        finally:  # closed explicitly: `with image` closes only the file of an image read lazily, not a decoded one
            if image is not None:
                image.close()
        return prepared.to(self.device, self.dtype)

    def prefetch(self, paths: Sequence[Path]) -> None:
        """Start decoding a coming pass's page files on threads, dropping a prefetch of other pages (only with
        `runtime.prefetch_pages` and a model that takes images)."""
        self.discard_prefetch()
        if self._prefetches and paths:
            self._prefetch = PagePrefetch(paths, self.adapter.decode_file, self.runtime.preprocess_workers)

    def discard_prefetch(self) -> None:
        """Drop the prefetch in flight, if any: its decodes not started cancelled, the running ones finished."""
        pending, self._prefetch = self._prefetch, None
        if pending is not None:
            pending.discard()

    def _decoded_ahead(self, paths: Sequence[Path]) -> list[Image.Image | None] | None:
        """The images of `paths` decoded ahead; None without a prefetch of exactly these (another is dropped)."""
        pending = self._prefetch
        if pending is None or not pending.is_for(paths):
            self.discard_prefetch()
            return None
        self._prefetch = None
        return pending.take()

    @contextmanager
    def embeddings_kept(self, batch: Sequence[PreparedInputs], first: int) -> Iterator[None]:
        """Within the block, the passes over `batch` take the embeddings of inputs `first`… computed once here (their
        vision runs now, not in the passes inside; a batch only)."""
        grad_off = torch.no_grad() if self._loop.compiled or self._vision else torch.inference_mode()  # as _run_loop
        indices = range(first, len(batch))
        with grad_off:
            if self._batches_vision(len(batch)):
                kept = dict(zip(indices, self._embed_together([batch[i] for i in indices]), strict=True))
            else:
                kept = {index: self._embed(index, batch[index]) for index in indices}
        self._kept_embeds = kept
        try:
            yield
        finally:
            self._kept_embeds = {}

    def _embed(self, index: int, prepared: PreparedInputs) -> torch.Tensor:
        kept = self._kept_embeds.get(index)
        if kept is not None:
            return kept
        batch_recorder = self._recorder
        if self._input_recorders is not None:
            self._recorder = self._input_recorders[index]  # vision sub-stages of input `index`
        try:
            embeds = self.adapter.embed_prompt(self.model, prepared)
        finally:
            self._recorder = batch_recorder
        if embeds is None:
            raise UserError(
                f"{type(self.model).__name__} merges its vision features inside its own forward, so its inputs "
                f"cannot be embedded apart (needed by run.batch_size={self.runtime.batch_size} and "
                f"runtime.compile={self.runtime.compile})",
                "Use run.batch_size=1 and runtime.compile=none or decode for this model",
            )
        return embeds

    def _batches_vision(self, inputs: int) -> bool:
        """Whether a pass of the session's own loop over `inputs` inputs runs their vision together."""
        return self.runtime.batch_vision and inputs > 1

    def _embed_together(self, batch: Sequence[PreparedInputs]) -> list[torch.Tensor]:
        """Every input's embeddings, their vision views batched by shape (under the batch's recorder)."""
        embeds = self.adapter.embed_prompts(self.model, batch, self.runtime.vision_multiple)
        assert embeds is not None, "the session refuses runtime.batch_vision for a model that cannot batch vision"
        return embeds

    def _batch_embedder(self, batch: Sequence[PreparedInputs]) -> EmbedInput:
        """The loop's `embed` for a pass with batched vision: its first call embeds every input not kept
        (`embeddings_kept`) together; each call then hands back its input's embeddings."""
        embedded: dict[int, torch.Tensor] = {}

        def embed(index: int, _prepared: PreparedInputs) -> torch.Tensor:
            kept = self._kept_embeds.get(index)
            if kept is not None:
                return kept
            if not embedded:
                todo = [i for i in range(len(batch)) if i not in self._kept_embeds]
                embedded.update(zip(todo, self._embed_together([batch[i] for i in todo]), strict=True))
            return embedded[index]

        return embed

    def _run_loop(
        self,
        batch: Sequence[PreparedInputs],
        max_new_tokens: int,
        recorder: StageRecorder,
        around_step: AroundStep | None,
        *,
        reference: bool,
        keep_logits: bool = False,
        keep_top2: bool = False,
    ) -> LoopOutput:
        loop = self.reference_loop if reference else self._loop
        # Compiled steps run under no_grad, as transformers' own compiled generate does: CUDA-graph trees and
        # inference tensors (a KV cache made under inference_mode) do not mix well.
        grad_off = torch.no_grad() if loop.compiled or self._vision else torch.inference_mode()
        eager_vision = eager_forwards(self._vision) if reference else nullcontext()
        # The eager reference (FLOP counts, output checks) runs each input's vision on its own, unpadded.
        embed = self._batch_embedder(batch) if not reference and self._batches_vision(len(batch)) else self._embed
        self._recorder = recorder
        try:
            with grad_off, eager_vision:
                return loop.run(
                    batch,
                    max_new_tokens,
                    recorder,
                    embed=embed,
                    around_step=around_step,
                    keep_logits=keep_logits,
                    keep_top2=keep_top2,
                )
        finally:
            self._recorder = None

    def reference_output(self, key: str, prepared: PreparedInputs, max_new_tokens: int) -> ReferenceOutput:
        """The eager dynamic-cache outputs of input `key` (run once per input and token count, then kept)."""

        def run() -> ReferenceOutput:
            out = self._run_loop(
                [prepared], max_new_tokens, NullRecorder(self.device), None, reference=True, keep_logits=True
            )
            assert out.prefill_logits is not None
            return ReferenceOutput(token_ids=out.tokens[0], prefill_logits=out.prefill_logits[0])

        return self.references.get((key, max_new_tokens), run)

    def top_two(self, prepared: PreparedInputs, max_new_tokens: int) -> TopTwoLogits:
        """An untimed eager dynamic-cache pass over one input: its tokens and the top two logits behind each."""
        out = self._run_loop(
            [prepared], max_new_tokens, NullRecorder(self.device), None, reference=True, keep_top2=True
        )
        assert out.top2 is not None
        return out.top2[0]

    def check_outputs(self, key: str, prepared: PreparedInputs, out: LoopOutput, index: int = 0) -> OutputCheck | None:
        """Output `index` of a pass against the reference of its input (None unless the runtime checks outputs)."""
        if not self.runtime.checks_outputs or out.prefill_logits is None:
            return None
        reference = self.reference_output(key, prepared, len(out.tokens[index]))
        return compare_outputs(out.tokens[index], out.prefill_logits[index], reference)

    def generate(
        self,
        prepared: PreparedInputs,
        max_new_tokens: int,
        recorder: StageRecorder,
        around_step: Callable[[int], AbstractContextManager[Any]] | None = None,
        *,
        reference: bool = False,
    ) -> list[int]:
        """Greedy decoding of exactly `max_new_tokens` tokens (EOS ignored; the first from prefill). `around_step(i)`
        wraps forward i (0 = prefill); `reference=True` runs the eager dynamic-cache loop whatever the runtime."""
        return self.generate_batch([prepared], max_new_tokens, recorder, around_step, reference=reference)[0]

    def generate_batch(
        self,
        batch: Sequence[PreparedInputs],
        max_new_tokens: int,
        recorder: StageRecorder,
        around_step: Callable[[int], AbstractContextManager[Any]] | None = None,
        *,
        reference: bool = False,
    ) -> list[list[int]]:
        """:meth:`generate` for several inputs in one batch (the decoder left-padded); the tokens of each input."""
        out = self._run_loop(batch, max_new_tokens, recorder, around_step, reference=reference)
        return [list(tokens) for tokens in out.tokens]

    def _timed_prepare(self, path: Path) -> tuple[PreparedInputs, float]:
        start = time.perf_counter()
        prepared = self.prepare(path)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return prepared, (time.perf_counter() - start) * 1e3

    def _prepare_all(
        self, paths: Sequence[Path], images: Sequence[Image.Image | None], workers: int
    ) -> list[PreparedInputs]:
        """Each input prepared (from its decoded image where given), in order, on up to `workers` threads; when one
        fails, the others not started are cancelled and the running ones finish before its error is raised."""
        if workers <= 1:
            return [self.prepare(path, image) for path, image in zip(paths, images, strict=True)]
        with ThreadPoolExecutor(workers, thread_name_prefix="llo-preprocess") as pool:
            futures = [pool.submit(self.prepare, path, image) for path, image in zip(paths, images, strict=True)]
            try:
                return [future.result() for future in futures]
            except BaseException:
                for future in futures:
                    future.cancel()
                raise

    def _prepare_batch(self, paths: Sequence[Path]) -> tuple[list[tuple[PreparedInputs, float]], bool]:
        """Each input of a pass prepared, with its preprocess time in ms (one after the other: its own; decoded ahead
        or on `runtime.preprocess_workers` threads: an equal share of the whole), and whether it was decoded ahead."""
        start = time.perf_counter()
        decoded = self._decoded_ahead(paths)
        workers = min(self.runtime.preprocess_workers, len(paths))
        if decoded is None and workers <= 1:
            return [self._timed_prepare(path) for path in paths], False
        images = decoded if decoded is not None else [None] * len(paths)
        try:
            prepared = self._prepare_all(paths, images, workers)
        except BaseException:
            close_images(images)  # the pages not prepared when one failed (each prepared one is closed already)
            raise
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        share = (time.perf_counter() - start) * 1e3 / len(paths)
        return [(one, share) for one in prepared], decoded is not None

    def run_batch(
        self, paths: Sequence[Path], max_new_tokens: int, *, nvtx: bool = True, next_paths: Sequence[Path] | None = None
    ) -> BatchMeasurement:
        """One full pass over a batch of inputs (at most `run.batch_size`): each preprocessed, its vision run one
        after the other (or together by view shape with `runtime.batch_vision`), then the decoder's prefill and decode
        steps on the whole batch. With `runtime.prefetch_pages`, `next_paths` decode on threads meanwhile."""
        if not paths:
            raise ValueError("a batch needs at least one input")
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        recorder = StageRecorder(self.device, nvtx=nvtx, window=self.profiler_window if nvtx else None)
        if nvtx:
            from llm_perf_opt.instruments import nvtx_ranges

            nvtx_ranges.push(vocab.PREPROCESS)
        prepared_ms, prefetched = self._prepare_batch(paths)
        if nvtx:
            nvtx_ranges.pop()
        if next_paths:
            self.prefetch(next_paths)
        compiled_before = len(self.compile_summary().events)
        if self.routing is not None:
            self.routing.begin_pass()
        inputs = [StageRecorder(self.device, nvtx=nvtx) for _ in paths]
        batch = [prepared for prepared, _ in prepared_ms]
        vision_apart = len(paths) > 1 and not self._batches_vision(len(paths))
        self._input_recorders = inputs if vision_apart else None
        keep_logits = self.runtime.checks_outputs or self.keep_prefill_logits
        try:
            out = self._run_loop(batch, max_new_tokens, recorder, None, reference=False, keep_logits=keep_logits)
        finally:
            self._input_recorders = None
        spans = recorder.spans_ms()
        totals, calls = _totals(spans)
        if vision_apart:
            per_input = [_totals(r.spans_ms()) for r in inputs]
            for vision_ms, vision_calls in per_input:
                for stage, ms in vision_ms.items():
                    totals[stage] = totals.get(stage, 0.0) + ms
                    calls[stage] = calls.get(stage, 0) + vision_calls[stage]
        else:  # one input, or batched vision: the vision ran under the batch recorder; each input gets an equal
            # share of its times (so the inputs' times sum to the pass's) and the pass's calls
            vision = {s: ms / len(paths) for s, ms in totals.items() if vocab.is_vision(s)}
            per_input = [(vision, {s: n for s, n in calls.items() if vocab.is_vision(s)})] * len(paths)
        peak = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None
        routing = self.routing.end_pass() if self.routing is not None else None
        compiled = self.compile_summary().events[compiled_before:]
        pages = tuple(
            PageResult(
                input=str(path),
                prompt_tokens=prepared.prompt_tokens,
                image_tokens=prepared.image_tokens,
                tiles=prepared.tiles,
                preprocess_ms=ms,
                vision_ms=per_input[i][0],
                vision_calls=per_input[i][1],
                token_ids=out.tokens[i],
                output_check=self.check_outputs(str(path), prepared, out, i),  # after the timed pass
                prefill_logits=None if out.prefill_logits is None else out.prefill_logits[i],
            )
            for i, (path, (prepared, ms)) in enumerate(zip(paths, prepared_ms, strict=True))
        )
        return BatchMeasurement(
            pages=pages,
            stage_ms=totals,
            stage_calls=calls,
            decode_step_ms=tuple(ms for name, ms in spans if name == vocab.DECODE_STEP),
            padded_prompt_tokens=max(p.prompt_tokens for p in batch),
            peak_memory_bytes=peak,
            routing=routing,
            compile_events=compiled,
            prefetched=prefetched,
        )

    def run_image(
        self, image_path: Path, max_new_tokens: int, *, nvtx: bool = True, next_paths: Sequence[Path] | None = None
    ) -> ImageMeasurement:
        """One full pass (preprocess, prefill with vision, decode) with stage timing; `next_paths`: prefetched. A batch
        of one input: its stage times are the batch's, and it keeps the batch's routing and compile events."""
        measured = self.run_batch([image_path], max_new_tokens, nvtx=nvtx, next_paths=next_paths)
        (page,) = measured.page_measurements()
        return attrs.evolve(page, routing=measured.routing, compile_events=measured.compile_events)


class DeepSeekOCRSession(InferenceSession):
    """An :class:`InferenceSession` of a DeepSeek-OCR model (v1 or OCR-2, `model=deepseek_ocr*`)."""

    @classmethod
    def check_adapter(cls, adapter: ModelAdapter) -> None:
        if not isinstance(adapter, DeepseekOcrAdapter | DeepseekOcr2Adapter):
            raise UserError(
                f"DeepSeekOCRSession runs DeepSeek-OCR models, not {type(adapter).__name__}'s",
                "Use llm_perf_opt.session.session.InferenceSession for any other model",
            )
