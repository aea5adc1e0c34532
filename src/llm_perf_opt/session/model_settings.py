"""What model a session builds (the `model:` config node), read once into a :class:`ModelSettings` record: the
pipeline parses the node at its edge and hands the record down; adapters read its attributes.

The family's own tables (`preprocess`, `architecture`, v1's `modes`) stay plain mappings here: each adapter reads
the ones it needs once, when it is made (:mod:`llm_perf_opt.session.adapters`), and `preprocess` is what the
reports record as configured."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs


def plain_data(value: Any) -> Any:
    """`value` as plain Python data: mappings as dicts (string keys, order kept), sequences as lists, the rest as
    is. A config node given here (any mapping) is read through its mapping interface, resolved as it is read."""
    if isinstance(value, Mapping):
        return {str(k): plain_data(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [plain_data(v) for v in value]
    return value


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


@attrs.frozen
class PromptSettings:
    """The text sent after the image (`model.prompt`)."""

    text: str = ""
    text_tokens: int | None = None  # stand-in ids for the text when there is no tokenizer (DeepSeek-OCR)


@attrs.frozen
class ModelSettings:
    """The `model:` node: which adapter, where the model comes from, how it is built and prompted."""

    name: str
    adapter: str
    path: str | None = None  # a local checkpoint folder (DeepSeek-OCR adapters); None: random weights
    seed: int = 0  # for random weights
    cache_dir: str | None = None  # random weights: saved here once, loaded by later processes (session.saved_model)
    dtype: str | None = None  # None: bfloat16 on CUDA, float32 on CPU
    attn_implementation: str | None = None
    experts_implementation: str | None = None
    sam_attention: str = "sdpa"  # "flex": SAM's relative-position bias inside FlexAttention (models.sam_flex_attention)
    prompt: PromptSettings = PromptSettings()
    preprocess: Mapping[str, Any] = attrs.field(factory=dict)  # the family's preprocessing table, as configured
    architecture: Mapping[str, Any] = attrs.field(factory=dict)  # the family's published shape (DeepSeek-OCR)
    mode: str | None = None  # DeepSeek-OCR v1: the resolution mode, one of `modes`
    modes: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)
    trust_remote_code: bool = False  # DeepSeek-OCR v1: the vendor's own code from `path`
    name_or_path: str | None = None  # hf: a local checkpoint folder
    config: str | None = None  # hf: a preset or a config.json (random weights)
    tokenizer: str | None = None  # hf: a folder of tokenizer files
    vision_stage_modules: Mapping[str, str] | None = None  # hf: vision sub-stage -> submodule path; None: detected

    @classmethod
    def from_config(cls, node: Mapping[str, Any]) -> ModelSettings:
        """From the composed `model` node (any mapping); keys a family does not use may be absent."""
        data: dict[str, Any] = plain_data(node)
        prompt = data.get("prompt") or {}
        tokens = prompt.get("text_tokens")
        stages = data.get("vision_stage_modules")
        texts: tuple[str, ...] = ("path", "cache_dir", "dtype", "attn_implementation", "experts_implementation", "mode")
        texts += ("name_or_path", "config", "tokenizer")  # the settings that are text, or None for null
        return cls(
            name=str(data.get("name") or ""),
            adapter=str(data.get("adapter")),
            seed=int(data.get("seed", 0)),
            sam_attention=str(data.get("sam_attention") or "sdpa"),
            prompt=PromptSettings(str(prompt.get("text", "")), None if tokens is None else int(tokens)),
            preprocess=data.get("preprocess") or {},
            architecture=data.get("architecture") or {},
            modes=data.get("modes") or {},
            trust_remote_code=bool(data.get("trust_remote_code", False)),
            vision_stage_modules=None if stages is None else {str(k): str(v) for k, v in stages.items()},
            **{key: _text(data.get(key)) for key in texts},
        )

    @classmethod
    def of(cls, model: ModelSettings | Mapping[str, Any]) -> ModelSettings:
        """`model` itself, or the settings a `model` node gives (scripts and tests that compose a node)."""
        return model if isinstance(model, ModelSettings) else cls.from_config(model)

    @property
    def own_weights(self) -> bool:
        """Checkpoint weights (`path`, `name_or_path`) or a saved-model folder of the user's (`cache_dir`): a command
        that would share a saved model among its child processes uses these instead."""
        return bool(self.cache_dir or self.path or self.name_or_path)

    def implementation_kwargs(self) -> dict[str, Any]:
        """`attn_implementation` / `experts_implementation` where set, for transformers loaders."""
        names = ("attn_implementation", "experts_implementation")
        return {name: value for name in names if (value := getattr(self, name))}
