"""What the session needs from a model family: build or load it, preprocess one image, name its stages."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import torch
from PIL import Image
from torch import nn

from llm_perf_opt.data.images import open_upright
from llm_perf_opt.errors import UserError
from llm_perf_opt.records.stage1 import ModelFamily, QuantizedLayers
from llm_perf_opt.session.model_settings import ModelSettings

if TYPE_CHECKING:
    from llm_perf_opt.analytic.model import StageCost
    from llm_perf_opt.analytic.spec import ModelSpec, Workload


@attrs.frozen
class PreparedInputs:
    """One image turned into model inputs (CPU tensors until :meth:`to` moves them)."""

    model_inputs: Mapping[str, Any]
    prompt_tokens: int  # whole prompt length (text + image placeholders)
    image_tokens: int  # image placeholder tokens in the prompt
    tiles: int  # local tiles (0 = global view only)
    views: tuple[tuple[str, int, int], ...]  # (kind, height, width) of each vision view, e.g. ("global", 1024, 1024)

    @property
    def input_ids(self) -> torch.Tensor:
        ids = self.model_inputs["input_ids"]
        assert isinstance(ids, torch.Tensor)
        return ids

    def to(self, device: torch.device, float_dtype: torch.dtype) -> PreparedInputs:
        """Tensors moved to `device`, floating-point ones cast to `float_dtype` (one already there is not copied)."""

        def move(value: Any) -> Any:
            if not isinstance(value, torch.Tensor):
                return value
            dtype = float_dtype if value.is_floating_point() else None  # None: its own dtype
            return value.to(device=device, dtype=dtype, non_blocking=True)

        return attrs.evolve(self, model_inputs={k: move(v) for k, v in self.model_inputs.items()})


@attrs.frozen
class PromptIds:
    """The ids a DeepSeek-OCR prompt starts with: BOS, then the image placeholder once per image token."""

    bos: int
    image: int

    @classmethod
    def of(cls, architecture: Mapping[str, Any]) -> PromptIds:
        """From the family's `architecture` table (its text config's BOS, its image token)."""
        return cls(bos=int(architecture["text_config"]["bos_token_id"]), image=int(architecture["image_token_id"]))

    def prompt(self, image_tokens: int, text_ids: Sequence[int]) -> list[int]:
        """BOS, `image_tokens` placeholders, then the text."""
        return [self.bos] + [self.image] * image_tokens + list(text_ids)


@attrs.frozen
class ModelDescription:
    """Facts about the built model for the reports (what `ModelInfo` records of it)."""

    class_name: str
    parameters: int
    attn_implementation: str | None
    experts_implementation: str | None
    family: ModelFamily
    # model_type, layers, hidden size, heads, vocabulary, input kind, vision stages; empty when not described
    architecture: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class LoadedModel:
    """A model ready to run, with what it was built from."""

    model: nn.Module
    tokenizer: Any | None
    weights: str  # "random" or "checkpoint"
    weights_detail: str  # one line for the reports: where the weights came from
    config_source: str  # where the architecture came from
    quantized: QuantizedLayers | None = None  # what `runtime.quantize` quantized in place (None: nothing)


def present_roots(model: nn.Module, roots: Mapping[str, str]) -> dict[str, str]:
    """The entries of `roots` whose module path exists in `model` ("" is the model itself)."""
    paths = {name for name, _ in model.named_modules()}
    return {prefix: path for prefix, path in roots.items() if path in paths}


class ModelAdapter(ABC):
    """One model family. Subclasses are registered in :mod:`llm_perf_opt.session.adapters.registry`."""

    #: True when `llm_perf_opt.analytic` models this family (analytic costs and the static analysis report).
    has_analytic_model: ClassVar[bool] = False

    #: Vision sub-stage name -> dotted path of the submodule that runs it (forward hooks time it).
    vision_stage_modules: ClassVar[Mapping[str, str]] = {}

    #: The analytic model's name prefixes -> module paths in the built model (see :meth:`analytic_module_roots`).
    ANALYTIC_MODULE_ROOTS: ClassVar[Mapping[str, str]] = {}

    def __init__(self, settings: ModelSettings) -> None:
        self.settings = settings

    @property
    def input_kind(self) -> str:
        """What one input file is: "image" (a page image) or "text" (a UTF-8 prompt file)."""
        return "image"

    def checkpoint_path(self) -> str | None:
        """The checkpoint folder `model.path` (a UserError unless a folder), or None: random weights."""
        path = self.settings.path
        if not path:
            return None
        folder = Path(str(path)).expanduser()
        if not folder.is_dir():
            problem = "is a file, not a folder" if folder.exists() else "does not exist"
            raise UserError(
                f"model.path={path} {problem} (looked at {folder.resolve()})",
                "Point model.path at a local checkpoint folder (config.json, *.safetensors, tokenizer files), e.g. "
                "a link under extern/; a relative path is relative to the folder the command runs in. Or leave "
                "model.path unset to build the published architecture with random weights",
            )
        return str(path)

    def bind_device(self, device: torch.device, dtype: torch.dtype) -> None:
        """The device and dtype the model runs in, before any input is prepared (for preprocessing there)."""
        del device, dtype  # by default inputs are made on the host and moved by PreparedInputs.to

    def decode_file(self, path: Path) -> Image.Image | None:
        """`path`'s image, decoded and upright, ahead on a thread (`runtime.prefetch_pages`); None: no image."""
        return open_upright(path)[0]

    def prepare_file(self, path: Path, tokenizer: Any | None, image: Image.Image | None = None) -> PreparedInputs:
        """Preprocess one input file, by default an upright image through :meth:`prepare`; `image`: the file
        already decoded by :meth:`decode_file` (its caller closes it)."""
        if image is not None:
            return self.prepare(image, tokenizer)
        with open_upright(path)[0] as opened:
            return self.prepare(opened, tokenizer)

    @abstractmethod
    def build_random(self, *, device: torch.device, dtype: torch.dtype) -> LoadedModel:
        """The published architecture at its real size with random weights (seeded)."""

    @abstractmethod
    def load_checkpoint(self, path: str, *, device: torch.device, dtype: torch.dtype) -> LoadedModel:
        """A local checkpoint folder, local files only."""

    @abstractmethod
    def prepare(self, image: Image.Image, tokenizer: Any | None) -> PreparedInputs:
        """The real preprocessing of one page image, and the prompt ids."""

    def seed_random_weights(self) -> None:
        """Seed torch with `model.seed` before a random-weight build (reproducible FLOPs, routing, timings)."""
        torch.manual_seed(self.settings.seed)

    def random_weights(
        self, model: nn.Module, *, tokenizer: Any | None = None, note: str = "", config_source: str = ""
    ) -> LoadedModel:
        """`model` (just built with random weights) with the provenance line every report shows."""
        return LoadedModel(
            model=model.eval(),
            tokenizer=tokenizer,
            weights="random",
            weights_detail=(
                f"random weights (seed {self.settings.seed}), no checkpoint: timings, FLOPs and bytes are real, "
                f"generated text is not{f'; {note}' if note else ''}"
            ),
            config_source=config_source or f"shipped config conf/model/{self.settings.name}.yaml (architecture)",
        )

    def prompt_ids(self, tokenizer: Any | None) -> list[int]:
        """The prompt text after the image, tokenized; without a tokenizer, `prompt.text_tokens` stand-in ids."""
        prompt = self.settings.prompt
        if tokenizer is not None:
            return list(tokenizer.encode(prompt.text, add_special_tokens=False))
        return [1000 + i for i in range(prompt.text_tokens or 0)]

    def preprocess_settings(self) -> dict[str, Any]:
        """The preprocessing settings the reports record."""
        return dict(self.settings.preprocess)

    def stage_modules(self, model: nn.Module) -> dict[str, nn.Module]:
        """Vision sub-stage name -> submodule of `model`."""
        return {stage: model.get_submodule(path) for stage, path in self.vision_stage_modules.items()}

    def analytic_costs(
        self, model: nn.Module, prepared: PreparedInputs, new_tokens: int, dtype_bytes: int
    ) -> Mapping[str, StageCost] | None:
        """Analytic cost per stage name (objects with `.flops` and `.bytes`), or None without an analytic model."""
        if not self.has_analytic_model:
            return None
        from llm_perf_opt.analytic import stage_costs

        return stage_costs(self.analytic_spec(model), self.analytic_workload(prepared, new_tokens, dtype_bytes))

    def analytic_module_roots(self, model: nn.Module) -> Mapping[str, str]:
        """Analytic name prefix ("sam", "sam.net_2") -> module path, those present in `model` (empty without one)."""
        return present_roots(model, self.ANALYTIC_MODULE_ROOTS)

    def analytic_batch_costs(
        self,
        model: nn.Module,
        batch: Sequence[PreparedInputs],
        new_tokens: int,
        dtype_bytes: int,
        experts_hit: float | None = None,
    ) -> Mapping[str, StageCost] | None:
        """Analytic cost per stage name of `batch` run together (the decoder left-padded), or None without an
        analytic model. `experts_hit`: distinct routed experts per MoE layer and decode step, as measured (None: the
        uniform-routing expectation)."""
        if not self.has_analytic_model:
            return None
        from llm_perf_opt.analytic.model import batch_stage_costs

        workloads = [self.analytic_workload(prepared, new_tokens, dtype_bytes) for prepared in batch]
        return batch_stage_costs(self.analytic_spec(model), workloads, experts_hit)

    def analytic_spec(self, model: nn.Module) -> ModelSpec:
        """The analytic model of `model` (families with `has_analytic_model`)."""
        raise NotImplementedError

    def analytic_workload(self, prepared: PreparedInputs, new_tokens: int, dtype_bytes: int) -> Workload:
        """The analytic workload of one prepared input (families with `has_analytic_model`)."""
        raise NotImplementedError

    # ---- decoder runtime (KV caches, batches, compiled steps) ---------------------------------------------
    def decoder_config(self, model: nn.Module) -> Any:
        """The text decoder's config its KV caches are built from (None: the model builds its own)."""
        config: Any = model.config
        return config.get_text_config(decoder=True)

    def decoder_module(self, model: nn.Module) -> nn.Module:
        """The transformers module that runs the text decoder (its class says which caches it supports)."""
        return model

    def static_cache_blocker(self, model: nn.Module) -> str | None:
        """Why transformers' StaticCache cannot drive this model's decoder, or None when it can."""
        cls = type(self.decoder_module(model))
        if not getattr(cls, "_can_compile_fullgraph", False):
            return (
                f"transformers does not mark {cls.__name__} as working with static-shape KV caches "
                "(_can_compile_fullgraph is False)"
            )
        return None

    def embed_prompt(self, model: nn.Module, prepared: PreparedInputs) -> torch.Tensor | None:
        """The prompt's input embeddings (1, tokens, hidden) with the vision features merged in (vision runs here,
        under the stage hooks), or None when its vision cannot run apart (no batches, no compiled prefill)."""
        return None

    def embed_prompts(
        self, model: nn.Module, batch: Sequence[PreparedInputs], multiple: int = 1
    ) -> list[torch.Tensor] | None:
        """:meth:`embed_prompt` of every input, their views encoded together by shape (each group padded to a multiple
        of `multiple`), or None when :meth:`batch_vision_blocker` says why not."""
        return None

    def batch_vision_blocker(self, model: nn.Module) -> str | None:
        """Why `model`'s vision cannot run batched (`runtime.batch_vision`), or None."""
        return f"the {self.settings.adapter} adapter runs the vision of one input at a time"

    def describe(self, model: nn.Module) -> ModelDescription:
        """Facts about the built model for the reports (implementations, sizes)."""
        config = getattr(model, "config", None)
        return ModelDescription(
            class_name=type(model).__name__,
            parameters=sum(p.numel() for p in model.parameters()),
            attn_implementation=getattr(config, "_attn_implementation", None),
            experts_implementation=getattr(config, "_experts_implementation", None),
            family=self.model_family(),
        )

    def model_family(self) -> ModelFamily:
        """The family facts the reports' advice reads (how an image becomes vision views); by default none."""
        return ModelFamily(name=self.settings.adapter)


def load_tokenizer(folder: Path) -> Any | None:
    """The checkpoint's tokenizer, or None when the folder has no tokenizer files."""
    if not any((folder / name).exists() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, local_files_only=True)
