"""DeepSeekOCRSession: load a model once, run many images through explicit prefill and decode steps."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import attrs
import torch

from llm_perf_opt.errors import UserError
from llm_perf_opt.measure.timing import StageRecorder
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.session.adapters.base import LoadedModel, ModelAdapter, PreparedInputs
from llm_perf_opt.session.adapters.registry import make_adapter

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


@attrs.frozen
class ImageMeasurement:
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

    @property
    def prefill_ms(self) -> float:
        return self.stage_ms[vocab.PREFILL]

    @property
    def decode_ms(self) -> float:
        return self.stage_ms.get(vocab.DECODE, 0.0)

    @property
    def ttft_ms(self) -> float:
        """Time to first token: preprocess + prefill (the first token comes out of the prefill forward)."""
        return self.preprocess_ms + self.prefill_ms


class DeepSeekOCRSession:
    """A loaded model and its adapter. Load once with :meth:`load`, then :meth:`run_image` many times."""

    def __init__(self, adapter: ModelAdapter, loaded: LoadedModel, device: torch.device, dtype: torch.dtype):
        self.adapter = adapter
        self.loaded = loaded
        self.model = loaded.model
        self.device = device
        self.dtype = dtype
        self._recorder: StageRecorder | None = None
        self._stage_modules = adapter.stage_modules(self.model)
        self._hooks = self._install_stage_hooks()

    @classmethod
    def load(cls, model_cfg: Mapping[str, Any], device: torch.device) -> DeepSeekOCRSession:
        """Build (random weights) or load (the adapter's checkpoint folder) the model `model_cfg` names on `device`."""
        adapter = make_adapter(model_cfg)
        dtype = resolve_dtype(model_cfg.get("dtype"), device)
        path = adapter.checkpoint_path()
        if path:
            loaded = adapter.load_checkpoint(path, device=device, dtype=dtype)
        else:
            loaded = adapter.build_random(device=device, dtype=dtype)
        return cls(adapter, loaded, device, dtype)

    # ---- stage hooks -------------------------------------------------------------------------------
    def _install_stage_hooks(self) -> list[Any]:
        handles = []
        for stage, module in self._stage_modules.items():

            def pre_hook(_module: Any, _args: Any, stage: str = stage) -> None:
                if self._recorder is not None:
                    self._recorder.begin(stage)

            def post_hook(_module: Any, _args: Any, _out: Any, stage: str = stage) -> None:
                if self._recorder is not None:
                    self._recorder.end(stage)

            handles.append(module.register_forward_pre_hook(pre_hook))
            handles.append(module.register_forward_hook(post_hook))
        return handles

    def remove_stage_hooks(self) -> None:
        """Detach the vision-stage hooks (for uninstrumented baselines); :meth:`install_stage_hooks` restores them."""
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

    # ---- running -----------------------------------------------------------------------------------
    def prepare(self, input_path: Path) -> PreparedInputs:
        """Preprocess one input file (an image, or a text prompt for text models) and move it to the device."""
        prepared = self.adapter.prepare_file(input_path, self.loaded.tokenizer)
        return prepared.to(self.device, self.dtype)

    @torch.inference_mode()
    def generate(
        self,
        prepared: PreparedInputs,
        max_new_tokens: int,
        recorder: StageRecorder,
        around_step: Callable[[int], AbstractContextManager[Any]] | None = None,
    ) -> list[int]:
        """Greedy decoding of exactly `max_new_tokens` tokens (EOS ignored); the first comes from prefill.

        `around_step(i)` wraps forward i (0 = prefill, i >= 1 = decode step i), e.g. to count its FLOPs.
        """
        around = around_step or (lambda _step: nullcontext())
        inputs = dict(prepared.model_inputs)
        prompt_len = prepared.prompt_tokens
        full_mask = torch.ones((1, prompt_len + max_new_tokens), dtype=torch.long, device=self.device)
        inputs["attention_mask"] = full_mask[:, :prompt_len]
        self._recorder = recorder
        try:
            with recorder.span(vocab.PREFILL), around(0):
                out = self.model(**inputs, use_cache=True, logits_to_keep=1)
                next_token = out.logits[:, -1].argmax(-1)
            tokens = [next_token]
            cache = out.past_key_values
            if max_new_tokens > 1:
                with recorder.span(vocab.DECODE):
                    for step in range(1, max_new_tokens):
                        with recorder.span(vocab.DECODE_STEP), around(step):
                            out = self.model(
                                input_ids=next_token[:, None],
                                attention_mask=full_mask[:, : prompt_len + step],
                                past_key_values=cache,
                                use_cache=True,
                                logits_to_keep=1,
                            )
                            next_token = out.logits[:, -1].argmax(-1)
                            cache = out.past_key_values
                        tokens.append(next_token)
        finally:
            self._recorder = None
        return [int(t) for t in torch.cat(tokens).tolist()]

    def run_image(self, image_path: Path, max_new_tokens: int, *, nvtx: bool = True) -> ImageMeasurement:
        """One full pass (preprocess, prefill with vision, decode) with stage timing."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        recorder = StageRecorder(self.device, nvtx=nvtx)
        if nvtx:
            from llm_perf_opt.measure import nvtx_ranges

            nvtx_ranges.push(vocab.PREPROCESS)
        start = time.perf_counter()
        prepared = self.prepare(image_path)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        preprocess_ms = (time.perf_counter() - start) * 1e3
        if nvtx:
            nvtx_ranges.pop()
        token_ids = self.generate(prepared, max_new_tokens, recorder)
        spans = recorder.spans_ms()
        totals: dict[str, float] = {}
        calls: dict[str, int] = {}
        for name, ms in spans:
            totals[name] = totals.get(name, 0.0) + ms
            calls[name] = calls.get(name, 0) + 1
        peak = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None
        return ImageMeasurement(
            preprocess_ms=preprocess_ms,
            stage_ms=totals,
            stage_calls=calls,
            decode_step_ms=tuple(ms for name, ms in spans if name == vocab.DECODE_STEP),
            token_ids=tuple(token_ids),
            prompt_tokens=prepared.prompt_tokens,
            image_tokens=prepared.image_tokens,
            tiles=prepared.tiles,
            peak_memory_bytes=peak,
        )
