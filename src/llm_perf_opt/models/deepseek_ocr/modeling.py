"""DeepSeek-OCR v1 ("DeepEncoder" + DeepSeek-V2 MoE decoder) assembled from transformers 5.x building blocks.

- ``model.sam_model``: transformers' ``DeepseekOcr2SamVisionEncoder`` (SAM ViT-B, neck, net_2/net_3) with v1's
  ``downsample_channels [512, 1024]``.
- ``model.vision_model``: CLIP-L encoder layers (transformers ``CLIPEncoder``) whose patch tokens are SAM's
  output, plus the class token and bicubic-interpolated position embeddings, then ``pre_layrnorm``. CLIP's own
  patch embedding is kept (it is in the checkpoint) but never run, as in the vendor's code.
- ``model.projector``: ``Linear(2048, 1280)`` over ``cat(CLIP tokens without class token, SAM tokens)``.
- ``model.image_newline`` ends every row of features; ``model.view_seperator`` closes each image.
- ``model.language_model``: transformers' ``DeepseekOcr2TextModel`` (the same decoder OCR-2 uses); ``lm_head``.

Token layout (vendor ``tile_tag "2D"``): ``[stitched tiles with a newline per row (if any), global view with a
newline per row, view separator]``, scattered into the ``<image>`` placeholder positions of the prompt.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from transformers import CLIPVisionConfig
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.models.clip.modeling_clip import CLIPEncoder, CLIPVisionEmbeddings
from transformers.models.deepseek_ocr2.modeling_deepseek_ocr2 import DeepseekOcr2SamVisionEncoder, DeepseekOcr2TextModel

from llm_perf_opt.models.cache_argument import accepted_cache, cache_kwargs, causal_lm_output, output_cache
from llm_perf_opt.models.deepseek_ocr.configuration import DeepseekOcrConfig
from llm_perf_opt.models.view_groups import encode_grouped

#: One image's views: its global view (1, 3, S, S), its tiles (n, 3, s, s) or None, its crop grid (across, down).
ImageViews = tuple[torch.Tensor, torch.Tensor | None, Sequence[int] | None]


class DeepseekOcrClipEmbeddings(CLIPVisionEmbeddings):
    """Class token + SAM feature tokens + position embeddings resized to the token grid (vendor ``get_abs_pos``)."""

    def forward(self, sam_features: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        batch = sam_features.shape[0]
        tokens = sam_features.flatten(2).transpose(1, 2)
        class_token = self.class_embedding.to(tokens.dtype).expand(batch, 1, -1)
        embeddings = torch.cat([class_token, tokens], dim=1)
        return embeddings + self.positions(embeddings.shape[1]).to(embeddings.dtype)

    def positions(self, length: int) -> torch.Tensor:
        """Position embeddings for `length` tokens (class + a square grid), shape (1, length, width)."""
        table = self.position_embedding.weight
        source = math.isqrt(table.shape[0] - 1)
        target = math.isqrt(length - 1)
        if source == target:
            return table.unsqueeze(0)
        width = table.shape[1]
        grid = table[1:].reshape(1, source, source, width).permute(0, 3, 1, 2).to(torch.float32)
        resized = F.interpolate(grid, size=(target, target), mode="bicubic", antialias=True, align_corners=False)
        resized = resized.to(table.dtype).permute(0, 2, 3, 1).reshape(target * target, width)
        return torch.cat([table[:1], resized], dim=0).unsqueeze(0)


class DeepseekOcrClipEncoder(nn.Module):
    """CLIP-L over SAM features: embeddings, ``pre_layrnorm``, the encoder layers (no post-layernorm)."""

    def __init__(self, config: CLIPVisionConfig):
        super().__init__()
        self.config = config
        self.embeddings = DeepseekOcrClipEmbeddings(config)
        self.pre_layrnorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)  # checkpoint spelling
        self.encoder = CLIPEncoder(config)  # type: ignore[arg-type]  # annotated CLIPConfig, used with either

    def forward(self, sam_features: torch.Tensor) -> torch.Tensor:
        hidden = self.pre_layrnorm(self.embeddings(sam_features))
        output = self.encoder(inputs_embeds=hidden, attention_mask=None)
        result: torch.Tensor = output.last_hidden_state
        return result


class DeepseekOcrModel(nn.Module):
    """The vision encoders, projector, layout vectors and decoder (everything but the lm_head)."""

    def __init__(self, config: DeepseekOcrConfig):
        super().__init__()
        config.validate()
        self.config = config
        hidden = int(config.text_config.hidden_size)
        self.sam_model = DeepseekOcr2SamVisionEncoder(config.sam_config)
        self.vision_model = DeepseekOcrClipEncoder(config.clip_config)
        self.projector = nn.Linear(config.projector_input_dim, hidden)
        std = 1 / math.sqrt(hidden)
        self.image_newline = nn.Parameter(torch.randn(hidden) * std)
        self.view_seperator = nn.Parameter(torch.randn(hidden) * std)  # checkpoint spelling
        self.language_model = DeepseekOcr2TextModel(config.text_config)
        for module in (self.vision_model, self.projector):
            _init_plain(module, float(config.clip_config.initializer_range))

    def encode_views(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Square views (B, 3, S, S) -> projected features on their grid (B, S/64, S/64, hidden)."""
        sam = self.sam_model(pixel_values).last_hidden_state  # (B, C, h, w)
        batch, _, rows, cols = sam.shape
        clip = self.vision_model(sam)  # (B, 1 + h*w, width)
        fused = torch.cat([clip[:, 1:], sam.flatten(2).transpose(1, 2)], dim=-1)
        features: torch.Tensor = self.projector(fused)
        return features.reshape(batch, rows, cols, features.shape[-1])

    def image_features(
        self, pixel_values: torch.Tensor, pixel_values_local: torch.Tensor | None, crop_grid: Sequence[int] | None
    ) -> torch.Tensor:
        """One image's feature sequence: [stitched tiles + newlines, global view + newlines, view separator]."""
        if pixel_values.shape[0] != 1:
            raise ValueError(f"one image per forward is supported, got a batch of {pixel_values.shape[0]} views")
        tiles = None if pixel_values_local is None else self.encode_views(pixel_values_local)
        return self._laid_out(tiles, self.encode_views(pixel_values), crop_grid)

    def batch_image_features(self, images: Sequence[ImageViews], multiple: int = 1) -> list[torch.Tensor]:
        """:meth:`image_features` of several images, their views encoded together by shape (`models.view_groups`)."""
        for pixel_values, _, _ in images:
            if pixel_values.shape[0] != 1:
                raise ValueError(f"one global view per image, got {pixel_values.shape[0]}")
        stacks = [view for pixel_values, local, _ in images for view in (local, pixel_values)]
        encoded = encode_grouped(stacks, self.encode_views, multiple)
        out = []
        for index, (_, _, crop_grid) in enumerate(images):
            global_features = encoded[2 * index + 1]
            assert global_features is not None
            out.append(self._laid_out(encoded[2 * index], global_features, crop_grid))
        return out

    def _laid_out(
        self, tiles: torch.Tensor | None, global_view: torch.Tensor, crop_grid: Sequence[int] | None
    ) -> torch.Tensor:
        """Encoded tiles (n, h2, w2, C) or None and the encoded global view (1, h, w, C) as the image's sequence."""
        parts = []
        if tiles is not None:
            if crop_grid is None:
                raise ValueError("pixel_values_local needs crop_grid = (tiles across, tiles down)")
            across, down = (int(v) for v in crop_grid)
            if tiles.shape[0] != across * down:
                raise ValueError(f"{tiles.shape[0]} tiles do not fill a {across}x{down} crop grid")
            _, rows, cols, width = tiles.shape
            stitched = tiles.reshape(down, across, rows, cols, width).permute(0, 2, 1, 3, 4)
            parts.append(self._rows_with_newline(stitched.reshape(down * rows, across * cols, width)))
        parts.append(self._rows_with_newline(global_view[0]))
        parts.append(self.view_seperator.to(parts[-1].dtype).unsqueeze(0))
        return torch.cat(parts, dim=0)

    def _rows_with_newline(self, grid: torch.Tensor) -> torch.Tensor:
        rows, _, width = grid.shape
        newline = self.image_newline.to(grid.dtype).expand(rows, 1, width)
        return torch.cat([grid, newline], dim=1).reshape(-1, width)


class DeepseekOcrForConditionalGeneration(nn.Module):
    """DeepSeek-OCR v1 with an untied lm_head; ``forward`` takes the prompt ids and, at prefill, the views."""

    def __init__(self, config: DeepseekOcrConfig):
        super().__init__()
        self.config = config
        self.model = DeepseekOcrModel(config)
        text = config.text_config
        self.lm_head = nn.Linear(int(text.hidden_size), int(text.vocab_size), bias=False)
        _init_plain(self.lm_head, float(text.initializer_range))

    def embed_inputs(
        self,
        input_ids: torch.Tensor,
        pixel_values: torch.Tensor | None = None,
        pixel_values_local: torch.Tensor | None = None,
        crop_grid: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Token embeddings with the image features (run here) scattered into the ``<image>`` positions."""
        if pixel_values is None:
            return self.model.language_model.embed_tokens(input_ids)
        return self.scatter_features(input_ids, self.model.image_features(pixel_values, pixel_values_local, crop_grid))

    def scatter_features(self, input_ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Token embeddings of `input_ids` with one image's `features` in its ``<image>`` positions."""
        embeds = self.model.language_model.embed_tokens(input_ids)
        placeholders = input_ids == self.config.image_token_id
        count = int(placeholders.sum())
        if count != features.shape[0]:
            raise ValueError(
                f"Image features and image tokens do not match: {count} <image> tokens in the prompt, "
                f"{features.shape[0]} features"
            )
        return embeds.masked_scatter(placeholders.unsqueeze(-1), features.to(embeds.dtype))

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: Any = None,
        use_cache: bool | None = None,
        logits_to_keep: int = 0,
        pixel_values: torch.Tensor | None = None,
        pixel_values_local: torch.Tensor | None = None,
        crop_grid: Sequence[int] | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        past_key_values: Any = None,
    ) -> CausalLMOutputWithPast:
        """The decoder's logits (the last `logits_to_keep` positions, or all) and its KV cache (`cache_argument`)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        if inputs_embeds is None:
            assert input_ids is not None
            inputs_embeds = self.embed_inputs(input_ids, pixel_values, pixel_values_local, crop_grid)
        out = self.model.language_model(
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            use_cache=use_cache,
            position_ids=position_ids,
            **cache_kwargs(accepted_cache(cache, past_key_values)),
        )
        hidden = out.last_hidden_state
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        return causal_lm_output(self.lm_head(hidden), output_cache(out))


def _init_plain(module: nn.Module, std: float) -> None:
    """Normal(0, std) weights and zero biases for Linear/Embedding; unit LayerNorms (random-weight builds)."""
    with torch.no_grad():
        for sub in module.modules():
            if isinstance(sub, nn.Linear | nn.Embedding):
                sub.weight.normal_(0.0, std)
                if isinstance(sub, nn.Linear) and sub.bias is not None:
                    sub.bias.zero_()
            elif isinstance(sub, nn.LayerNorm):
                sub.weight.fill_(1.0)
                sub.bias.zero_()
