"""Model inputs for the generic adapter: a text prompt for a causal LM, an image and a prompt for an
image-text-to-text model (through the checkpoint's processor)."""

from __future__ import annotations

import re
import zlib
from typing import Any

import torch
from PIL import Image

from llm_perf_opt.errors import UserError
from llm_perf_opt.session.adapters.base import PreparedInputs

_PIECES = re.compile(r"\w+|[^\w\s]")

#: How prompts are turned into ids when there is no tokenizer (random weights without tokenizer files).
STAND_IN_TOKENIZATION = "no tokenizer: one stand-in token id per word or punctuation mark of the prompt"


def stand_in_ids(text: str, vocab_size: int, bos_token_id: int | None) -> list[int]:
    """Deterministic ids for `text` without a tokenizer: BOS (if the model has one), then one id per word or
    punctuation mark (crc32 of the piece, modulo the vocabulary)."""
    ids = [zlib.crc32(piece.encode()) % vocab_size for piece in _PIECES.findall(text)]
    return ([bos_token_id] if bos_token_id is not None else []) + ids


def text_ids(text: str, tokenizer: Any, *, chat_template: bool) -> list[int]:
    """`text` tokenized with the model's special tokens, or in its chat template (with the generation prompt) when
    `chat_template` is set and the tokenizer has one."""
    if chat_template and getattr(tokenizer, "chat_template", None):
        encoded = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=True
        )
        return [int(i) for i in encoded["input_ids"]]
    return [int(i) for i in tokenizer(text)["input_ids"]]


def text_inputs(ids: list[int]) -> PreparedInputs:
    """A text-only prompt: no image tokens, tiles or views."""
    if not ids:
        raise UserError("the prompt tokenized to no tokens", "Use a prompt file with some text in it")
    input_ids = torch.tensor([ids], dtype=torch.long)
    return PreparedInputs(
        model_inputs={"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)},
        prompt_tokens=len(ids),
        image_tokens=0,
        tiles=0,
        views=(),
    )


def image_inputs(
    image: Image.Image, processor: Any, prompt: str, *, chat_template: bool, image_token_id: int | None
) -> PreparedInputs:
    """One image and `prompt` through the processor, with the model's image placeholder convention: the
    processor's chat template (`chat_template`), else its image token before the prompt."""
    if chat_template and getattr(processor, "chat_template", None):
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
        text = str(processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
    else:
        token = getattr(processor, "image_token", None)
        if not token:
            raise UserError(
                f"the processor {type(processor).__name__} names no image placeholder token",
                "Set model.preprocess.chat_template=true to place the image with the processor's chat template",
            )
        text = f"{token}\n{prompt}"
    inputs = dict(processor(images=image.convert("RGB"), text=text, return_tensors="pt"))
    input_ids = inputs["input_ids"]
    pixel_values = inputs.get("pixel_values")
    views: tuple[tuple[str, int, int], ...] = ()
    if isinstance(pixel_values, torch.Tensor) and pixel_values.dim() == 4:  # (views, channels, height, width)
        views = (("image", int(pixel_values.shape[-2]), int(pixel_values.shape[-1])),) * int(pixel_values.shape[0])
    image_tokens = int((input_ids == image_token_id).sum()) if image_token_id is not None else 0
    return PreparedInputs(
        model_inputs=inputs, prompt_tokens=int(input_ids.shape[-1]), image_tokens=image_tokens, tiles=0, views=views
    )
