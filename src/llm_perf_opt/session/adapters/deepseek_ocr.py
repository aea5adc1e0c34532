"""DeepSeek-OCR (v1): the project's implementation (random weights or the official checkpoint by name map), or
the vendor's own code from the checkpoint folder with ``model.trust_remote_code=true``."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import torch
from PIL import Image
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.utils import CONFIG_NAME

from llm_perf_opt.errors import UserError
from llm_perf_opt.models.cache_argument import (
    CACHE_FIELD,
    accepted_cache,
    causal_lm_output,
    forward_cache_argument,
    output_cache,
)
from llm_perf_opt.models.deepseek_ocr.configuration import DeepseekOcrConfig
from llm_perf_opt.models.deepseek_ocr.device_preprocess import preprocess_on_device
from llm_perf_opt.models.deepseek_ocr.modeling import DeepseekOcrForConditionalGeneration
from llm_perf_opt.models.deepseek_ocr.preprocess import Mode, Views, image_token_count, mode_from_config, preprocess
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.stage1 import ModelFamily
from llm_perf_opt.session.adapters.base import LoadedModel, ModelAdapter, PreparedInputs, PromptIds, load_tokenizer
from llm_perf_opt.session.adapters.preprocess_device import Target, preprocess_device, preprocess_target
from llm_perf_opt.session.model_settings import ModelSettings

if TYPE_CHECKING:
    from llm_perf_opt.analytic.spec import ModelSpec, Workload


@contextmanager
def default_dtype(dtype: torch.dtype) -> Any:
    """Parameters created inside are `dtype` (full-size builds never hold an fp32 copy on the GPU)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


class VendorModel(nn.Module):
    """The vendor's ``DeepseekOCRForCausalLM`` (remote code) behind the session's forward interface."""

    def __init__(self, inner: nn.Module, image_token_id: int):
        super().__init__()
        self.inner = inner
        self.config = inner.config
        self.image_token_id = image_token_id
        # The vendor's code names the cache argument itself, whatever the installed transformers calls it.
        self.inner_cache_argument = forward_cache_argument(inner.forward) or CACHE_FIELD

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: Any = None,
        use_cache: bool | None = None,
        logits_to_keep: int = 0,
        pixel_values: torch.Tensor | None = None,
        pixel_values_local: torch.Tensor | None = None,
        crop_grid: Sequence[int] | None = None,
        past_key_values: Any = None,
    ) -> CausalLMOutputWithPast:
        vision: dict[str, Any] = {}
        if pixel_values is not None:
            # The vendor's infer(): zeros stand for "no tiles"; images_spatial_crop is [[n_w, n_h]].
            crops = pixel_values_local if pixel_values_local is not None else torch.zeros_like(pixel_values)
            vision = {
                "images": [(crops, pixel_values)],
                "images_seq_mask": input_ids == self.image_token_id,
                "images_spatial_crop": torch.tensor([list(crop_grid or (1, 1))], dtype=torch.long),
            }
        out = self.inner(
            input_ids=input_ids,
            attention_mask=attention_mask,
            use_cache=use_cache,
            return_dict=True,
            **{self.inner_cache_argument: accepted_cache(cache, past_key_values)},
            **vision,
        )
        logits = out.logits[:, -logits_to_keep:] if logits_to_keep else out.logits
        return causal_lm_output(logits, output_cache(out))


@attrs.frozen
class V1Preprocess:
    """`model.preprocess` of v1: how many tiles a Gundam crop grid may have, and where the pixels are processed
    (`cpu`: PIL, the vendor's way; `cuda`: torch ops on the model's GPU, `models.deepseek_ocr.device_preprocess`)."""

    min_tiles: int
    max_tiles: int
    device: str = "cpu"

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> V1Preprocess:
        return cls(
            min_tiles=int(table["min_tiles"]), max_tiles=int(table["max_tiles"]), device=preprocess_device(table)
        )


class DeepseekOcrAdapter(ModelAdapter):
    """Stages: vision/sam, vision/clip, vision/projector; then the DeepSeek-V2 MoE decoder."""

    has_analytic_model: ClassVar[bool] = True
    ANALYTIC_MODULE_ROOTS: ClassVar[Mapping[str, str]] = {
        "sam": "model.sam_model",
        "sam.net_2": "model.sam_model.proj.conv1",
        "sam.net_3": "model.sam_model.proj.conv2",
        "clip": "model.vision_model",
        "projector": "model.projector",
        "image_features": "model",
        "decoder": "model.language_model",
        "lm_head": "lm_head",
    }
    vision_stage_modules: ClassVar[Mapping[str, str]] = {
        vocab.VISION_SAM: "model.sam_model",
        vocab.VISION_CLIP: "model.vision_model",
        vocab.VISION_PROJECTOR: "model.projector",
    }

    def __init__(self, settings: ModelSettings) -> None:
        super().__init__(settings)
        self.mode: Mode = mode_from_config(str(settings.mode), settings.modes)  # an unknown mode fails here
        self.preprocess = V1Preprocess.from_table(settings.preprocess)
        self.ids = PromptIds.of(settings.architecture)
        # Where `prepare` makes the views (device, dtype) with model.preprocess.device=cuda; None: PIL on the host.
        self.preprocess_target: Target | None = None

    def bind_device(self, device: torch.device, dtype: torch.dtype) -> None:
        self.preprocess_target = preprocess_target(self.preprocess.device, device, dtype)

    def _config(self) -> DeepseekOcrConfig:
        return DeepseekOcrConfig.from_architecture(
            copy.deepcopy(dict(self.settings.architecture)),
            attn_implementation=self.settings.attn_implementation,
            experts_implementation=self.settings.experts_implementation,
        )

    def build_random(self, *, device: torch.device, dtype: torch.dtype) -> LoadedModel:
        config = self._config()
        self.seed_random_weights()
        with torch.device(device), default_dtype(dtype):
            model = DeepseekOcrForConditionalGeneration(config)
        return self.random_weights(model)

    def load_checkpoint(self, path: str, *, device: torch.device, dtype: torch.dtype) -> LoadedModel:
        folder = Path(path).expanduser()
        if not (folder / CONFIG_NAME).is_file():
            raise UserError(
                f"model.path={path} holds no loadable checkpoint (no config.json in {folder.resolve()})",
                "Point model.path at a local DeepSeek-OCR checkpoint folder (config.json, *.safetensors, tokenizer "
                "files, as published as deepseek-ai/DeepSeek-OCR), e.g. a link under extern/, or leave model.path "
                "unset to build the published architecture with random weights",
            )
        if self.settings.trust_remote_code:
            model: nn.Module = self._load_vendor_code(folder, device=device, dtype=dtype)
            detail = f"checkpoint weights from {folder.resolve()}, run by the vendor's own code (trust_remote_code)"
        else:
            from llm_perf_opt.models.deepseek_ocr.checkpoint import load_v1_checkpoint

            model, _architecture = load_v1_checkpoint(
                folder,
                device=device,
                dtype=dtype,
                attn_implementation=self.settings.attn_implementation,
                experts_implementation=self.settings.experts_implementation,
            )
            detail = f"checkpoint weights from {folder.resolve()} (official tensor names mapped onto this model)"
        return LoadedModel(
            model=model.eval(),
            tokenizer=load_tokenizer(folder),
            weights="checkpoint",
            weights_detail=detail,
            config_source=f"{folder.resolve() / 'config.json'}",
        )

    def _load_vendor_code(self, folder: Path, *, device: torch.device, dtype: torch.dtype) -> VendorModel:
        import transformers
        from transformers import AutoModel

        kwargs = {}
        if self.settings.attn_implementation:
            kwargs["attn_implementation"] = self.settings.attn_implementation
        try:
            inner = AutoModel.from_pretrained(
                folder, trust_remote_code=True, local_files_only=True, use_safetensors=True, dtype=dtype, **kwargs
            )
        except Exception as exc:  # vendor code fails in many ways; each becomes one user error
            raise UserError(
                f"model.trust_remote_code=true: the vendor code in {folder.resolve()} could not be loaded with "
                f"transformers {transformers.__version__}: {type(exc).__name__}: {exc}",
                "The vendor's modeling code was written for transformers 4.46; run it in an environment with that "
                "version, or set model.trust_remote_code=false to load the same checkpoint into this project's "
                "implementation (no remote code, any transformers 5.x)",
            ) from exc
        return VendorModel(inner.to(device=device), self.ids.image)

    def decoder_config(self, model: nn.Module) -> Any:
        if isinstance(model, VendorModel):
            return None  # the vendor's code builds its own cache
        config: Any = model.config
        return config.text_config

    def decoder_module(self, model: nn.Module) -> nn.Module:
        return model if isinstance(model, VendorModel) else model.get_submodule("model.language_model")

    def static_cache_blocker(self, model: nn.Module) -> str | None:
        if isinstance(model, VendorModel):
            return (
                "the vendor's own code (model.trust_remote_code=true) manages its KV cache itself; set "
                "model.trust_remote_code=false to run the same checkpoint through this project's implementation"
            )
        return super().static_cache_blocker(model)

    def embed_prompt(self, model: nn.Module, prepared: PreparedInputs) -> torch.Tensor | None:
        if not isinstance(model, DeepseekOcrForConditionalGeneration):
            return None  # the vendor's code merges vision inside its forward
        inputs = prepared.model_inputs
        return model.embed_inputs(
            inputs["input_ids"], inputs.get("pixel_values"), inputs.get("pixel_values_local"), inputs.get("crop_grid")
        )

    def embed_prompts(
        self, model: nn.Module, batch: Sequence[PreparedInputs], multiple: int = 1
    ) -> list[torch.Tensor] | None:
        if self.batch_vision_blocker(model) is not None:
            return None
        assert isinstance(model, DeepseekOcrForConditionalGeneration)
        inputs = [prepared.model_inputs for prepared in batch]  # every page has its global view (`prepare`)
        views = [(i["pixel_values"], i.get("pixel_values_local"), i.get("crop_grid")) for i in inputs]
        features = model.model.batch_image_features(views, multiple)
        return [model.scatter_features(i["input_ids"], f) for i, f in zip(inputs, features, strict=True)]

    def batch_vision_blocker(self, model: nn.Module) -> str | None:
        if isinstance(model, DeepseekOcrForConditionalGeneration):
            return None
        return (
            "the vendor's own code (model.trust_remote_code=true) runs each page's vision inside its forward; set "
            "model.trust_remote_code=false to run the same checkpoint through this project's implementation"
        )

    def analytic_spec(self, model: nn.Module) -> ModelSpec:
        """From the architecture config (the vendor's code, when loaded, has the same hard-coded sizes)."""
        from llm_perf_opt.analytic import ModelSpec

        return ModelSpec.from_config(model.config if isinstance(model.config, DeepseekOcrConfig) else self._config())

    def analytic_workload(self, prepared: PreparedInputs, new_tokens: int, dtype_bytes: int) -> Workload:
        from llm_perf_opt.analytic import Workload

        return Workload(
            text_tokens=prepared.prompt_tokens - 1 - prepared.image_tokens,
            new_tokens=new_tokens,
            dtype_bytes=dtype_bytes,
        ).with_mode(self.mode, tuple(prepared.model_inputs["crop_grid"]))

    def stage_modules(self, model: nn.Module) -> dict[str, nn.Module]:
        prefix = "inner." if isinstance(model, VendorModel) else ""
        return {stage: model.get_submodule(prefix + path) for stage, path in self.vision_stage_modules.items()}

    def model_family(self) -> ModelFamily:
        """v1: a global view plus `image_size`-px tiles in crop mode, each through SAM and CLIP; named modes."""
        mode = self.mode
        return ModelFamily(
            name="deepseek_ocr",
            tiled_views=True,
            tiling=mode.crop_mode,
            tile_px=mode.image_size,
            has_modes=True,
            mode=mode.name,
            encoder="CLIP",
        )

    def preprocess_settings(self) -> dict[str, Any]:
        mode = self.mode
        return {
            "mode": mode.name,
            "base_size": mode.base_size,
            "image_size": mode.image_size,
            "crop_mode": mode.crop_mode,
            **self.settings.preprocess,
        }

    def views(self, image: Image.Image) -> Views:
        """The page's views: PIL on the host, or torch ops on the bound device (`model.preprocess.device`)."""
        table = self.preprocess
        if self.preprocess_target is None:
            return preprocess(image, self.mode, min_tiles=table.min_tiles, max_tiles=table.max_tiles)
        device, dtype = self.preprocess_target
        return preprocess_on_device(
            image, self.mode, device=device, dtype=dtype, min_tiles=table.min_tiles, max_tiles=table.max_tiles
        )

    def prepare(self, image: Image.Image, tokenizer: Any | None) -> PreparedInputs:
        mode = self.mode
        views = self.views(image)
        image_tokens = image_token_count(mode, views.grid)
        ids = self.ids.prompt(image_tokens, self.prompt_ids(tokenizer))
        input_ids = torch.tensor([ids], dtype=torch.long)
        inputs: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            "pixel_values": views.global_view,
            "crop_grid": list(views.grid),
        }
        side = mode.global_size
        shapes = [("global", side, side)]
        if views.tiles is not None:
            inputs["pixel_values_local"] = views.tiles
            shapes += [("tile", mode.image_size, mode.image_size)] * views.tile_count
        return PreparedInputs(
            model_inputs=inputs,
            prompt_tokens=len(ids),
            image_tokens=image_tokens,
            tiles=views.tile_count,
            views=tuple(shapes),
        )
