"""Tiny Hugging Face models, tokenizers and processors written to local folders (no network), for the generic
adapter's tests (importable as `hf_fixtures`: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llm_perf_opt.data.prompts import bundled_prompts_dir
from llm_perf_opt.session.adapters.hf_source import presets_dir

IMAGE_TOKEN = "<image>"
SPECIALS = ("<unk>", "<pad>", "<s>", "</s>", IMAGE_TOKEN)
# Every word and punctuation mark of the bundled prompt question_short.txt and of model=hf's image prompt, so both
# tokenize without <unk>.
WORDS = tuple(
    re.findall(r"\w+|[^\w\s]", (bundled_prompts_dir() / "question_short.txt").read_text() + " Describe this image.")
)


def word_tokenizer(words: Sequence[str] = WORDS, *, chat_template: str | None = None) -> Any:
    """A WordLevel tokenizer (whitespace and punctuation split) over SPECIALS + `words`, BOS added to every text."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(dict.fromkeys([*SPECIALS, *words]))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        extra_special_tokens={"image_token": IMAGE_TOKEN},
    )
    if chat_template:
        fast.chat_template = chat_template
    return fast


def preset_config(name: str, **changes: Any) -> Any:
    """The transformers config of a shipped preset, with `changes` applied."""
    from transformers import CONFIG_MAPPING

    data = json.loads((presets_dir() / f"{name}.json").read_text())
    return CONFIG_MAPPING[data["model_type"]].from_dict({**data, **changes})


def save_tiny_causal_lm(folder: Path, preset: str = "qwen2_tiny", *, tokenizer: bool = True) -> Path:
    """A checkpoint folder (save_pretrained) of a preset with random weights, with a word tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    tok = word_tokenizer()
    config = preset_config(preset, vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    if tokenizer:
        tok.save_pretrained(folder)
    return folder


def save_tiny_llava(folder: Path, *, processor: bool = True) -> Path:
    """A tiny Llava checkpoint (CLIP vision 32 px / 8-px patches, Llama text) with its processor."""
    import torch
    from transformers import (
        CLIPImageProcessorPil,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tok = word_tokenizer()
    vision = CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8
    )
    text = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_id=tok.convert_tokens_to_ids(IMAGE_TOKEN))
    torch.manual_seed(0)
    LlavaForConditionalGeneration(config).save_pretrained(folder)
    if processor:
        LlavaProcessor(
            image_processor=CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}),
            tokenizer=tok,
            patch_size=8,
            vision_feature_select_strategy="default",
            image_token=IMAGE_TOKEN,
            num_additional_image_tokens=1,
        ).save_pretrained(folder)
    return folder


#: Image tokens the tiny Llava puts in a prompt: (32 / 8)² patches (its CLS token dropped).
LLAVA_IMAGE_TOKENS = 16
