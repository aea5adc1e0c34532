"""The configuration of DeepSeek-OCR v1: transformers sub-configs for SAM, CLIP-L and the DeepSeek-V2 decoder.

The vendor's code hard-codes the vision sizes; ``conf/model/deepseek_ocr.yaml`` spells them out in ``architecture``
so that tiny variants are a config away (``../shared/reference/deepseek-ocr-facts.md`` §1)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
from transformers import CLIPVisionConfig
from transformers.models.deepseek_ocr2.configuration_deepseek_ocr2 import (
    DeepseekOcr2SamVisionConfig,
    DeepseekOcr2TextConfig,
)


@attrs.define
class DeepseekOcrConfig:
    """SAM ViT-B (v1 channels), CLIP-L fed with SAM features, a linear projector, the DeepSeek-V2 MoE decoder."""

    sam_config: DeepseekOcr2SamVisionConfig
    clip_config: CLIPVisionConfig
    text_config: DeepseekOcr2TextConfig
    projector_input_dim: int  # CLIP width + SAM output channels (1024 + 1024)
    image_token_id: int
    model_type: str = "deepseek_ocr"

    @classmethod
    def from_architecture(
        cls,
        architecture: Mapping[str, Any],
        *,
        attn_implementation: str | None = None,
        experts_implementation: str | None = None,
    ) -> DeepseekOcrConfig:
        """From the Hydra ``model.architecture`` mapping (plain dict; see conf/model/deepseek_ocr.yaml)."""
        config = cls(
            sam_config=DeepseekOcr2SamVisionConfig(**dict(architecture["sam_config"])),
            clip_config=CLIPVisionConfig(**dict(architecture["clip_config"])),
            text_config=DeepseekOcr2TextConfig(**dict(architecture["text_config"])),
            projector_input_dim=int(architecture["projector_input_dim"]),
            image_token_id=int(architecture["image_token_id"]),
        )
        config.set_implementations(attn_implementation, experts_implementation)
        return config

    def set_implementations(self, attn: str | None, experts: str | None) -> None:
        """Attention backend for every part (sdpa | eager) and the MoE experts backend for the decoder."""
        for sub in (self.sam_config, self.clip_config, self.text_config):
            sub._attn_implementation = attn or "sdpa"
        if experts:
            self.text_config._experts_implementation = experts

    @property
    def _attn_implementation(self) -> str | None:
        return self.text_config._attn_implementation

    @property
    def _experts_implementation(self) -> str | None:
        return self.text_config._experts_implementation

    def validate(self) -> None:
        """The shape constraints the model relies on (raises ValueError)."""
        channels = self.sam_config.downsample_channels
        if not channels:
            raise ValueError("the SAM config needs downsample_channels (net_2, net_3)")
        sam_out, clip = int(channels[-1]), int(self.clip_config.hidden_size)
        if sam_out != clip:
            raise ValueError(
                f"SAM's last downsample channels ({sam_out}) must equal the CLIP width ({clip}): SAM features are "
                "CLIP's patch tokens"
            )
        if self.projector_input_dim != sam_out + clip:
            raise ValueError(
                f"projector_input_dim {self.projector_input_dim} must be SAM channels + CLIP width ({sam_out + clip})"
            )
