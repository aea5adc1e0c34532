"""DeepSeek-OCR-2 through transformers' native `DeepseekOcr2ForConditionalGeneration` (transformers >= 5.17)."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import torch
from PIL import Image
from transformers import DeepseekOcr2Config, DeepseekOcr2ForConditionalGeneration
from transformers.models.deepseek_ocr2.image_processing_pil_deepseek_ocr2 import DeepseekOcr2ImageProcessorPil
from transformers.utils import CONFIG_NAME

from llm_perf_opt.errors import UserError
from llm_perf_opt.models.deepseek_ocr2_views import ocr2_views
from llm_perf_opt.models.view_groups import encode_grouped
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.stage1 import ModelFamily
from llm_perf_opt.session.adapters.base import LoadedModel, ModelAdapter, PreparedInputs, PromptIds, load_tokenizer
from llm_perf_opt.session.adapters.preprocess_device import Target, preprocess_device, preprocess_target
from llm_perf_opt.session.model_settings import ModelSettings

if TYPE_CHECKING:
    from llm_perf_opt.analytic.spec import ModelSpec, Workload

# The model class hard-codes two learned query banks (DeepseekOcr2VisionModel): 144 queries for views whose
# SAM output has at most 144 positions (768-px tiles), 256 otherwise (the 1024-px global view). A view
# therefore yields the bank size in tokens, whatever its pixel size.
_SMALL_BANK = 144
_LARGE_BANK = 256
_SAM_TOTAL_STRIDE = 64  # patch 16, then two stride-2 convolutions


def view_tokens(side_px: int) -> int:
    """Vision tokens one square view of `side_px` pixels yields in DeepSeek-OCR-2."""
    positions = math.ceil(side_px / _SAM_TOTAL_STRIDE) ** 2
    return _SMALL_BANK if positions <= _SMALL_BANK else _LARGE_BANK


@attrs.frozen
class Ocr2Preprocess:
    """`model.preprocess` of DeepSeek-OCR-2: view sides, how many tiles, and where the pixels are processed (`cpu`:
    transformers' PIL image processor; `cuda`: torch ops on the model's GPU, models/deepseek_ocr2_views.py)."""

    global_size: int
    tile_size: int
    crop_to_patches: bool
    min_tiles: int
    max_tiles: int
    device: str = "cpu"

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> Ocr2Preprocess:
        return cls(
            global_size=int(table["global_size"]),
            tile_size=int(table["tile_size"]),
            crop_to_patches=bool(table["crop_to_patches"]),
            min_tiles=int(table["min_tiles"]),
            max_tiles=int(table["max_tiles"]),
            device=preprocess_device(table),
        )


class DeepseekOcr2Adapter(ModelAdapter):
    """Stages: vision/sam, vision/encoder (Qwen2-style), vision/projector; then the DeepSeek-V2 MoE decoder."""

    has_analytic_model: ClassVar[bool] = True
    ANALYTIC_MODULE_ROOTS: ClassVar[Mapping[str, str]] = {
        "sam": "model.vision_tower.sam_encoder",
        "sam.net_2": "model.vision_tower.sam_encoder.proj.conv1",
        "sam.net_3": "model.vision_tower.sam_encoder.proj.conv2",
        "encoder": "model.vision_tower.vision_encoder",
        "encoder.concat_queries": "model.vision_tower",
        "projector": "model.multi_modal_projector",
        "image_features": "model",
        "decoder": "model.language_model",
        "lm_head": "lm_head",
    }
    vision_stage_modules: ClassVar[Mapping[str, str]] = {
        vocab.VISION_SAM: "model.vision_tower.sam_encoder",
        vocab.VISION_ENCODER: "model.vision_tower.vision_encoder",
        vocab.VISION_PROJECTOR: "model.multi_modal_projector",
    }

    def __init__(self, settings: ModelSettings) -> None:
        super().__init__(settings)
        self.preprocess = Ocr2Preprocess.from_table(settings.preprocess)
        self.ids = PromptIds.of(settings.architecture)
        # Where `prepare` makes the views with model.preprocess.device=cuda; None: the PIL processor on the host.
        self.preprocess_target: Target | None = None

    def bind_device(self, device: torch.device, dtype: torch.dtype) -> None:
        self.preprocess_target = preprocess_target(self.preprocess.device, device, dtype)

    def build_random(self, *, device: torch.device, dtype: torch.dtype) -> LoadedModel:
        config = DeepseekOcr2Config(**copy.deepcopy(dict(self.settings.architecture)))
        self.seed_random_weights()
        with torch.device(device):
            model = DeepseekOcr2ForConditionalGeneration._from_config(
                config, dtype=dtype, **self.settings.implementation_kwargs()
            )
        return self.random_weights(model)

    def load_checkpoint(self, path: str, *, device: torch.device, dtype: torch.dtype) -> LoadedModel:
        folder = Path(path).expanduser()
        if not (folder / CONFIG_NAME).is_file():
            raise UserError(
                f"model.path={path} holds no loadable checkpoint (no config.json in {folder.resolve()})",
                "Point model.path at a local DeepSeek-OCR-2 checkpoint folder in the transformers layout "
                "(config.json, *.safetensors, tokenizer files), e.g. a link under extern/, or leave model.path "
                "unset to build the published architecture with random weights",
            )
        try:
            model = DeepseekOcr2ForConditionalGeneration.from_pretrained(
                folder, local_files_only=True, dtype=dtype, **self.settings.implementation_kwargs()
            )
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise UserError(
                f"model.path={path} could not be loaded as DeepSeek-OCR-2: {type(exc).__name__}: {exc}",
                "Check that the folder holds a complete transformers-format DeepSeek-OCR-2 checkpoint "
                "(deepseek-community/DeepSeek-OCR-2 layout) with all safetensors shards, or leave model.path unset",
            ) from exc
        return LoadedModel(
            model=model.to(device=device).eval(),  # type: ignore[call-arg]
            tokenizer=load_tokenizer(folder),
            weights="checkpoint",
            weights_detail=f"checkpoint weights from {folder.resolve()}",
            config_source=f"{folder.resolve() / 'config.json'}",
        )

    def model_family(self) -> ModelFamily:
        """v2: a global view plus `tile_size`-px tiles when it crops to patches, each through SAM and the encoder."""
        pre = self.preprocess
        return ModelFamily(
            name="deepseek_ocr2", tiled_views=True, tiling=pre.crop_to_patches, tile_px=pre.tile_size, encoder="encoder"
        )

    def image_processor(self) -> DeepseekOcr2ImageProcessorPil:
        pre = self.preprocess
        return DeepseekOcr2ImageProcessorPil(
            size={"height": pre.global_size, "width": pre.global_size},
            tile_size=pre.tile_size,
            crop_to_patches=pre.crop_to_patches,
            min_patches=pre.min_tiles,
            max_patches=pre.max_tiles,
        )

    def views(self, image: Image.Image) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The page's global view and tiles (or None), made on the host or the bound device."""
        rgb = image.convert("RGB")
        if self.preprocess_target is None:
            processed = self.image_processor()(rgb, return_tensors="pt")
            return processed["pixel_values"], processed.get("pixel_values_local")
        device, dtype = self.preprocess_target
        pre = self.preprocess
        made = ocr2_views(
            rgb,
            global_size=pre.global_size,
            tile_size=pre.tile_size,
            crop_to_patches=pre.crop_to_patches,
            min_tiles=pre.min_tiles,
            max_tiles=pre.max_tiles,
            device=device,
            dtype=dtype,
        )
        return made.global_view, made.tiles

    def prepare(self, image: Image.Image, tokenizer: Any | None) -> PreparedInputs:
        pixel_values, local = self.views(image)
        tiles = 0 if local is None else int(local.shape[0])
        views = [("global", int(pixel_values.shape[-2]), int(pixel_values.shape[-1]))]
        views += [("tile", int(local.shape[-2]), int(local.shape[-1]))] * tiles if local is not None else []
        image_tokens = sum(view_tokens(h) for _, h, _ in views) + 1  # + the view separator
        ids = self.ids.prompt(image_tokens, self.prompt_ids(tokenizer))
        input_ids = torch.tensor([ids], dtype=torch.long)
        inputs: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            "pixel_values": pixel_values,
            "num_local_patches": [tiles],
        }
        if local is not None:
            inputs["pixel_values_local"] = local
        return PreparedInputs(
            model_inputs=inputs, prompt_tokens=len(ids), image_tokens=image_tokens, tiles=tiles, views=tuple(views)
        )

    def embed_prompt(self, model: Any, prepared: PreparedInputs) -> torch.Tensor | None:
        """Token embeddings with the page's vision features in its image placeholders (as the model's forward)."""
        inputs = prepared.model_inputs
        vision = model.model.get_image_features(
            inputs["pixel_values"], inputs.get("pixel_values_local"), inputs.get("num_local_patches"), return_dict=True
        )
        return _scatter(model, inputs["input_ids"], torch.cat(list(vision.pooler_output), dim=0))

    def embed_prompts(self, model: Any, batch: Sequence[PreparedInputs], multiple: int = 1) -> list[torch.Tensor]:
        """The pages' views through the vision tower and projector together by view shape (the model's own
        `get_image_features` lays each page out the same way: tiles, global view, view separator)."""
        inner = model.model

        def encode(views: torch.Tensor) -> torch.Tensor:
            projected: torch.Tensor = inner.multi_modal_projector(inner.vision_tower(views).last_hidden_state)
            return projected

        inputs = [prepared.model_inputs for prepared in batch]
        stacks = [view for i in inputs for view in (i.get("pixel_values_local"), i["pixel_values"])]
        encoded = encode_grouped(stacks, encode, multiple)
        separator = inner.view_separator.unsqueeze(0)
        out = []
        for index, page in enumerate(inputs):
            views = [encoded[2 * index], encoded[2 * index + 1]]
            parts = [v.reshape(-1, v.shape[-1]) for v in views if v is not None]
            features = torch.cat([*parts, separator.to(parts[-1].device, parts[-1].dtype)], dim=0)
            out.append(_scatter(model, page["input_ids"], features))
        return out

    def batch_vision_blocker(self, model: Any) -> str | None:
        return None

    def analytic_spec(self, model: Any) -> ModelSpec:
        from llm_perf_opt.analytic import ModelSpec

        return ModelSpec.from_config(model.config)

    def analytic_workload(self, prepared: PreparedInputs, new_tokens: int, dtype_bytes: int) -> Workload:
        from llm_perf_opt.analytic import Workload

        sides = {kind: h for kind, h, _ in prepared.views}
        return Workload(
            global_size=sides["global"],
            tile_size=sides.get("tile", self.preprocess.tile_size),
            tiles=prepared.tiles,
            text_tokens=prepared.prompt_tokens - 1 - prepared.image_tokens,
            new_tokens=new_tokens,
            dtype_bytes=dtype_bytes,
        )


def _scatter(model: Any, input_ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """Token embeddings of `input_ids` with one page's vision `features` in its image placeholders."""
    embeds: torch.Tensor = model.get_input_embeddings()(input_ids)
    placeholders = (input_ids == model.config.image_token_id).unsqueeze(-1)
    return embeds.masked_scatter(placeholders, features.to(embeds.dtype))
