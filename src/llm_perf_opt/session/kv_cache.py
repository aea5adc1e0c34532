"""KV caches for the explicit decode loop: a fresh transformers ``DynamicCache`` per pass, or a ``StaticCache``
sized for the batch's prompt + new tokens and kept across passes of the same shape (its tensors keep their
addresses, so compiled decode steps and their CUDA graphs are reused instead of re-captured)."""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import attrs

from llm_perf_opt.errors import UserError

if TYPE_CHECKING:
    import torch

#: Static caches kept for reuse (the least recently used beyond this is dropped).
_KEPT_STATIC_CACHES = 8


@attrs.frozen
class BatchCache:
    """The cache of one pass, and its fixed length when it is static."""

    cache: Any  # None: the model's prefill creates it
    static_length: int | None  # positions of a StaticCache; None for a DynamicCache


class KvCaches:
    """Builds the cache of one batch for a decoder config, by kind ("dynamic" or "static")."""

    def __init__(self, kind: str, decoder_config: Any, fixed_length: int | None = None) -> None:
        self.kind = kind
        self.decoder_config = decoder_config
        self.fixed_length = fixed_length
        self.sized_new_tokens = 0  # static caches hold at least this many new tokens (`sized_for`)
        self._static: OrderedDict[tuple[int, int], Any] = OrderedDict()

    @contextlib.contextmanager
    def sized_for(self, new_tokens: int) -> Iterator[None]:
        """While inside, static caches are sized for at least `new_tokens` new tokens (`caches_sized_for`)."""
        before, self.sized_new_tokens = self.sized_new_tokens, new_tokens
        try:
            yield
        finally:
            self.sized_new_tokens = before

    def length_for(self, prompt_tokens: int, new_tokens: int) -> int:
        """Positions a static cache holds for a prompt of `prompt_tokens` (padded) and `new_tokens` generated (the
        last generated token is never fed back, so prompt + new - 1 positions are written)."""
        needed = prompt_tokens + new_tokens - 1
        if self.fixed_length is None:
            return prompt_tokens + max(new_tokens, self.sized_new_tokens)
        if needed > self.fixed_length:
            raise UserError(
                f"runtime.static_cache_len={self.fixed_length} is too small: a prompt of {prompt_tokens} tokens and "
                f"{new_tokens} new tokens (infer.max_new_tokens) write {needed} positions",
                f"Set runtime.static_cache_len to at least {needed} (or leave it unset, null, to size each cache for "
                "its prompt), or lower infer.max_new_tokens",
            )
        return self.fixed_length

    def for_batch(self, batch_size: int, prompt_tokens: int, new_tokens: int) -> BatchCache:
        """An empty cache for `batch_size` sequences of `prompt_tokens` (padded) plus `new_tokens` generated."""
        from transformers import DynamicCache

        if self.kind == "dynamic":
            if self.decoder_config is None:
                return BatchCache(None, None)  # the model's forward makes its own
            return BatchCache(DynamicCache(config=self.decoder_config), None)
        length = self.length_for(prompt_tokens, new_tokens)
        key = (batch_size, length)
        cache = self._static.pop(key, None)
        if cache is None:
            cache = self._new_static(length)
        else:
            cache.reset()  # zeroed in place: same tensors, same addresses
        self._static[key] = cache
        while len(self._static) > _KEPT_STATIC_CACHES:
            self._static.popitem(last=False)
        return BatchCache(cache, length)

    def allocate(self, batch: BatchCache, batch_size: int, dtype: torch.dtype, device: torch.device) -> None:
        """Allocate a static cache's tensors now (a compiled prefill must not create them inside its graph)."""
        cache = batch.cache
        if batch.static_length is None or all(getattr(layer, "is_initialized", False) for layer in cache.layers):
            return
        config = self.decoder_config
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        cache.early_initialization(batch_size, heads, head_dim, dtype, device)

    def _new_static(self, length: int) -> Any:
        from transformers import StaticCache

        try:
            return StaticCache(config=self.decoder_config, max_cache_len=length)
        except (ValueError, KeyError, TypeError, NotImplementedError) as exc:
            raise UserError(
                f"runtime.kv_cache=static: transformers could not build a StaticCache for "
                f"{type(self.decoder_config).__name__}: {type(exc).__name__}: {exc}",
                "Set runtime.kv_cache=dynamic (and runtime.compile=none) for this model",
            ) from exc


def static_cache_error(blocker: str) -> UserError:
    """The UserError for a model whose decoder transformers' StaticCache cannot drive (`blocker` says why)."""
    return UserError(
        f"runtime.kv_cache=static is not supported by this model: {blocker}",
        "Set runtime.kv_cache=dynamic and runtime.compile=none for this model",
    )


def rewind_blocker(cache: object) -> str | None:
    """Why :func:`rewind` cannot take `cache` back to an earlier length, or None. Only plain full-attention layers
    rewind: transformers' ``DynamicLayer`` (its tensors grow) and ``StaticLayer`` (a write position)."""
    from transformers.cache_utils import DynamicLayer, StaticLayer

    layers = getattr(cache, "layers", None)
    if not layers:
        return f"the model keeps its KV cache in a {type(cache).__name__}, not transformers' cache layers"
    kinds = {type(layer) for layer in layers}
    other = sorted(k.__name__ for k in kinds if k not in (DynamicLayer, StaticLayer))
    if other:
        return f"its KV cache has {', '.join(other)} layers (only full-attention dynamic and static layers rewind)"
    return None


def rewind(cache: Any, length: int) -> None:
    """Take `cache` back to its first `length` positions (a decode section repeated over the same prompt); a static
    layer keeps its tensors and their addresses (CUDA graphs stay valid). Check :func:`rewind_blocker` first."""
    from transformers.cache_utils import StaticLayer

    for layer in cache.layers:
        if not getattr(layer, "is_initialized", False):
            continue
        if isinstance(layer, StaticLayer):
            # a tensor from its first update on (some transformers releases annotate it as an int)
            cast("torch.Tensor", layer.cumulative_length).fill_(length)
        else:
            layer.keys = layer.keys[..., :length, :]
            layer.values = layer.values[..., :length, :]
