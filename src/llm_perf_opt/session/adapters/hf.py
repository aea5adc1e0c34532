"""Any Hugging Face causal LM or image-text-to-text model, by configuration (`model=hf`): text prompts from the
dataset for text models; an image and `prompt.text` through the checkpoint's processor for image-text-to-text models,
whose vision sub-stages are the configured `vision_stage_modules` or the vision tower and projector found by name."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import torch
from PIL import Image
from torch import nn

from llm_perf_opt.data.prompts import read_prompt
from llm_perf_opt.errors import UserError
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.session.adapters.base import (
    LoadedModel,
    ModelAdapter,
    ModelDescription,
    PreparedInputs,
    load_tokenizer,
    present_roots,
)
from llm_perf_opt.session.adapters.hf_arch import IMAGE, TEXT, HfArchitecture, classify
from llm_perf_opt.session.adapters.hf_inputs import (
    STAND_IN_TOKENIZATION,
    image_inputs,
    stand_in_ids,
    text_ids,
    text_inputs,
)
from llm_perf_opt.session.adapters.hf_source import HfSource, resolve_source
from llm_perf_opt.session.model_settings import ModelSettings

#: Submodule names of vision towers and of the projectors that feed their output to the language model.
VISION_TOWER_NAMES = ("vision_tower", "visual", "vision_model", "vision_encoder", "image_encoder")
PROJECTOR_NAMES = ("multi_modal_projector", "mm_projector", "connector", "vision_projection")
_PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
_ARCH_KEYS = (
    *("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim"),
    *("intermediate_size", "vocab_size", "max_position_embeddings", "tie_word_embeddings"),
)

if TYPE_CHECKING:
    from llm_perf_opt.analytic.model import StageCost
#: Config keys whose presence (non-zero) marks a mixture-of-experts text model.
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def _shallowest(model: nn.Module, names: tuple[str, ...], outside: str | None = None) -> str | None:
    """The dotted path of the shallowest submodule whose own name is in `names` (not inside `outside`)."""
    found = [
        path
        for path, _ in model.named_modules()
        if path.rsplit(".", 1)[-1] in names and not (outside and (path + ".").startswith(outside + "."))
    ]
    return min(found, key=lambda p: p.count("."), default=None)


def detect_vision_stages(model: nn.Module) -> dict[str, str]:
    """vision/encoder -> the vision tower, vision/projector -> the projector outside it (those found)."""
    tower = _shallowest(model, VISION_TOWER_NAMES)
    projector = _shallowest(model, PROJECTOR_NAMES, outside=tower)
    stages = {vocab.VISION_ENCODER: tower, vocab.VISION_PROJECTOR: projector}
    return {stage: path for stage, path in stages.items() if path is not None}


@attrs.frozen
class HfPreprocess:
    """`model.preprocess` of model=hf."""

    chat_template: bool = False  # wrap the prompt in the tokenizer's / processor's chat template
    max_prompt_tokens: int | None = None  # keep at most this many (the first) tokens of a text prompt

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> HfPreprocess:
        limit = table.get("max_prompt_tokens")
        return cls(chat_template=bool(table.get("chat_template")), max_prompt_tokens=int(limit) if limit else None)


class HfAdapter(ModelAdapter):
    """Stages: prefill and decode; for image-text-to-text models also the vision tower and projector."""

    # has_analytic_model stays False: analytic-report models DeepSeek-OCR only; dense decoder-only models still get
    # analytic bytes (and MBU) through :meth:`analytic_costs`.

    def __init__(self, settings: ModelSettings) -> None:
        super().__init__(settings)
        self.preprocess = HfPreprocess.from_table(settings.preprocess)
        self._source: HfSource | None = None
        self._arch: HfArchitecture | None = None

    @property
    def source(self) -> HfSource:
        """Where the model comes from (resolved on first use; every problem is a UserError)."""
        if self._source is None:
            self._source = resolve_source(self.settings)
        return self._source

    @property
    def arch(self) -> HfArchitecture:
        """How the model is built and what it takes (a UserError for a model this adapter cannot drive)."""
        if self._arch is None:
            self._arch = classify(self.source.config)
        return self._arch

    @property
    def input_kind(self) -> str:
        return self.arch.kind

    @property
    def name(self) -> str:
        return self.settings.name or "hf"

    def checkpoint_path(self) -> str | None:
        folder = self.source.weights_folder
        return None if folder is None else str(folder)

    # ---- building ------------------------------------------------------------------------------------------
    def build_random(self, *, device: torch.device, dtype: torch.dtype) -> LoadedModel:
        source, arch = self.source, self.arch
        tokenizer, how = self._tokenizer_or_processor()  # before any weight: a missing processor fails fast
        self.seed_random_weights()
        try:
            with torch.device(device):
                model = arch.auto_class.from_config(source.config, dtype=dtype, **self.settings.implementation_kwargs())
        except (ValueError, KeyError) as exc:  # a config transformers takes but its model classes refuse
            raise UserError(
                f"transformers cannot build a model from {source.config_source} ({type(exc).__name__}: "
                f"{' '.join(str(exc).split())})",
                "Fix the values the message names in that config (model.config), or start from a config.json written "
                "by save_pretrained",
            ) from exc
        return self.random_weights(model, tokenizer=tokenizer, note=how, config_source=source.config_source)

    def load_checkpoint(self, path: str, *, device: torch.device, dtype: torch.dtype) -> LoadedModel:
        folder = Path(path)
        tokenizer, how = self._tokenizer_or_processor()
        try:
            model = self.arch.auto_class.from_pretrained(
                folder, local_files_only=True, dtype=dtype, **self.settings.implementation_kwargs()
            )
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise UserError(
                f"model.name_or_path={folder} could not be loaded as {self.arch.model_class.__name__}: "
                f"{type(exc).__name__}: {exc}",
                "Check that the folder holds a complete checkpoint written by save_pretrained (config.json and all "
                "*.safetensors shards), or use model.config=<config.json> for random weights",
            ) from exc
        return LoadedModel(
            model=model.to(device=device).eval(),
            tokenizer=tokenizer,
            weights="checkpoint",
            weights_detail=f"checkpoint weights from {folder}; {how}",
            config_source=self.source.config_source,
        )

    def _tokenizer_or_processor(self) -> tuple[Any | None, str]:
        """The tokenizer (text models) or processor (image-text-to-text models), and how prompts are tokenized."""
        folder = self.source.assets_folder
        if self.arch.kind == IMAGE:
            if folder is None or not any((folder / name).is_file() for name in _PROCESSOR_FILES):
                raise UserError(
                    f"model {self.name} is an image-text-to-text model ({self.arch.model_class.__name__}) but "
                    f"{folder or 'a shipped preset'} has no processor files ({' or '.join(_PROCESSOR_FILES)})",
                    "Use a checkpoint folder saved with its processor (processor.save_pretrained), or point "
                    "model.config at a config.json in such a folder",
                )
            processor = self._from_folder("processor", folder)
            return processor, f"images and prompts prepared by {type(processor).__name__} from {folder}"
        tokenizer = None if folder is None else self._from_folder("tokenizer", folder)
        if tokenizer is None:
            return None, STAND_IN_TOKENIZATION
        return tokenizer, f"prompts tokenized by {type(tokenizer).__name__} from {folder}"

    @staticmethod
    def _from_folder(what: str, folder: Path) -> Any:
        from transformers import AutoProcessor

        try:
            if what == "processor":
                return AutoProcessor.from_pretrained(folder, local_files_only=True)
            return load_tokenizer(folder)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UserError(
                f"the {what} files in {folder} could not be loaded: {type(exc).__name__}: {exc}",
                f"Save the {what} again with save_pretrained, or point model.tokenizer at a folder with working "
                "tokenizer files",
            ) from exc

    # ---- inputs --------------------------------------------------------------------------------------------
    def decode_file(self, path: Path) -> Image.Image | None:
        return super().decode_file(path) if self.input_kind == IMAGE else None  # a text prompt: nothing to decode

    def prepare_file(self, path: Path, tokenizer: Any | None, image: Image.Image | None = None) -> PreparedInputs:
        if self.input_kind == IMAGE:
            return super().prepare_file(path, tokenizer, image)
        text = read_prompt(path)
        pre = self.preprocess
        config = self.source.config.get_text_config()
        if tokenizer is None:
            ids = stand_in_ids(text, int(config.vocab_size), getattr(config, "bos_token_id", None))
        else:
            ids = text_ids(text, tokenizer, chat_template=pre.chat_template)
        if pre.max_prompt_tokens:
            ids = ids[: pre.max_prompt_tokens]
        limit = getattr(config, "max_position_embeddings", None)
        if limit and len(ids) > int(limit):
            raise UserError(
                f"prompt {path.name} has {len(ids)} tokens, more than model {self.name} takes "
                f"(max_position_embeddings={limit})",
                f"Shorten the prompt, or keep its first tokens with model.preprocess.max_prompt_tokens={limit}",
            )
        return text_inputs(ids)

    def prepare(self, image: Image.Image, tokenizer: Any | None) -> PreparedInputs:
        if self.input_kind != IMAGE:
            raise UserError(
                f"model {self.name} is a text-only model: it takes text prompts, not images",
                "Run it on text prompts (dataset=prompts, or dataset=prompts dataset.root=<folder of .txt files>)",
            )
        if tokenizer is None:
            raise UserError(
                f"model {self.name} takes images but no processor was loaded for it",
                "Load it through a session (InferenceSession.load), which loads the checkpoint's processor",
            )
        config = self.source.config
        return image_inputs(
            image,
            tokenizer,
            self.settings.prompt.text,
            chat_template=self.preprocess.chat_template,
            image_token_id=getattr(config, "image_token_id", None) or getattr(config, "image_token_index", None),
        )

    # ---- stages and reports --------------------------------------------------------------------------------
    def vision_stage_paths(self, model: nn.Module) -> dict[str, str]:
        """Vision sub-stage -> dotted submodule path: configured, or detected for image-text-to-text models."""
        configured = self.settings.vision_stage_modules
        if configured and self.input_kind == TEXT:
            raise UserError(
                f"model.vision_stage_modules is set, but model {self.name} is a text-only model without a vision side",
                "Leave model.vision_stage_modules unset for text models",
            )
        if not configured:
            return detect_vision_stages(model) if self.input_kind == IMAGE else {}
        return {(s if vocab.is_vision(s) else f"{vocab.VISION_PREFIX}{s}"): p for s, p in configured.items()}

    def stage_modules(self, model: nn.Module) -> dict[str, nn.Module]:
        out = {}
        for stage, path in self.vision_stage_paths(model).items():
            try:
                out[stage] = model.get_submodule(path)
            except AttributeError:
                top = ", ".join(name for name, _ in model.named_children())
                raise UserError(
                    f"model.vision_stage_modules: {stage} names {path!r}, which is no submodule of "
                    f"{type(model).__name__} (its top-level modules: {top})",
                    "Give dotted paths from the model's root (print(model) lists them), or leave "
                    "model.vision_stage_modules unset to detect the vision tower and projector",
                ) from None
        return out

    def embed_prompt(self, model: nn.Module, prepared: PreparedInputs) -> torch.Tensor | None:
        """Text models: the prompt's token embeddings (others merge vision inside their own forward: None)."""
        if self.input_kind != TEXT:
            return None
        get_embeddings: Any = model.get_input_embeddings
        embeds: torch.Tensor = get_embeddings()(prepared.input_ids)
        return embeds

    def analytic_costs(
        self, model: Any, prepared: PreparedInputs, new_tokens: int, dtype_bytes: int
    ) -> Mapping[str, StageCost] | None:
        """Analytic prefill and decode costs for dense decoder-only text models (llm_perf_opt.analytic.dense)."""
        from llm_perf_opt.analytic.dense import DenseSpec, stage_costs

        spec = DenseSpec.from_config(model.config) if self.input_kind == TEXT else None
        return None if spec is None else stage_costs(spec, prepared.prompt_tokens, new_tokens, dtype_bytes)

    def analytic_module_roots(self, model: nn.Module) -> Mapping[str, str]:
        """The dense analytic model's names live under the shallowest module holding `embed_tokens`."""
        if self.input_kind != TEXT:
            return {}
        paths = [name for name, _ in model.named_modules()]
        owners = sorted(
            (p.removesuffix("embed_tokens").rstrip(".") for p in paths if p.split(".")[-1] == "embed_tokens"), key=len
        )
        roots = {"": owners[0]} if owners else {}
        return {**roots, **present_roots(model, {"lm_head": "lm_head"})}

    def analytic_batch_costs(
        self,
        model: Any,
        batch: Sequence[PreparedInputs],
        new_tokens: int,
        dtype_bytes: int,
        experts_hit: float | None = None,
    ) -> Mapping[str, StageCost] | None:
        """The same for a batch of prompts left-padded to the longest (dense models: no experts)."""
        from llm_perf_opt.analytic.dense import DenseSpec, batch_stage_costs

        spec = DenseSpec.from_config(model.config) if self.input_kind == TEXT else None
        lengths = [prepared.prompt_tokens for prepared in batch]
        return None if spec is None else batch_stage_costs(spec, lengths, new_tokens, dtype_bytes)

    def describe(self, model: nn.Module) -> ModelDescription:
        config = self.source.config
        text = config.get_text_config()
        facts = {key: getattr(text, key, None) for key in _ARCH_KEYS}
        if facts["head_dim"] is None and facts["hidden_size"] and facts["num_attention_heads"]:
            facts["head_dim"] = facts["hidden_size"] // facts["num_attention_heads"]  # what the attention uses
        described = super().describe(model)
        return attrs.evolve(
            described,
            # transformers sets an experts default even on dense models
            experts_implementation=described.experts_implementation
            if any(getattr(text, key, None) for key in _EXPERT_KEYS)
            else None,
            architecture={
                "model_type": config.model_type,
                "input": self.input_kind,
                **({"text_model_type": text.model_type} if text is not config else {}),
                **facts,
                "vision_stages": self.vision_stage_paths(model),
            },
        )
