"""The name transformers gives a model's KV cache, found by feature detection.

transformers up to 5.23 calls it ``past_key_values`` (argument and output field); 5.24 renamed both to ``cache``
and keeps the old name as a deprecated alias (a warning on every call, removal announced for 5.40). The toolkit
supports 5.17 on, so it passes and reads the cache through these helpers, under the name the release declares.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers.modeling_outputs import CausalLMOutputWithPast

#: The names a release may use, newest first.
CACHE_NAMES = ("cache", "past_key_values")


def _declared_cache_field() -> str:
    from transformers.modeling_outputs import CausalLMOutputWithPast

    fields = {field.name for field in dataclasses.fields(CausalLMOutputWithPast)}
    if declared := next((name for name in CACHE_NAMES if name in fields), None):
        return declared
    raise RuntimeError(  # a release this module does not know: fail loudly rather than drop the cache
        f"transformers' CausalLMOutputWithPast declares none of {CACHE_NAMES}; this release is not supported"
    )


#: The installed release's name for the cache, as a forward's keyword argument and as an output field.
CACHE_FIELD = _declared_cache_field()


def cache_kwargs(cache: Any) -> dict[str, Any]:
    """``{name: cache}`` under the installed release's name, to pass to a transformers forward."""
    return {CACHE_FIELD: cache}


def output_cache(output: Any) -> Any:
    """The KV cache a forward returned (or None), under either name (remote code has output classes of its own)."""
    for name in (CACHE_FIELD, *(other for other in CACHE_NAMES if other != CACHE_FIELD)):
        if name in _field_names(output):
            return getattr(output, name)
    return None


def _field_names(output: Any) -> set[str]:
    if dataclasses.is_dataclass(output):
        return {field.name for field in dataclasses.fields(output)}
    return set(vars(output)) if hasattr(output, "__dict__") else set()


def accepted_cache(cache: Any = None, past_key_values: Any = None) -> Any:
    """The cache a forward of ours was given under either name (it takes both, as transformers' own do)."""
    if cache is not None and past_key_values is not None:
        raise ValueError("pass the KV cache as `cache` or as `past_key_values`, not both")
    return cache if cache is not None else past_key_values


def causal_lm_output(logits: Any, cache: Any) -> CausalLMOutputWithPast:
    """A ``CausalLMOutputWithPast`` holding `logits` and `cache` under the installed release's field name."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return CausalLMOutputWithPast(logits=logits, **cache_kwargs(cache))


def forward_cache_argument(forward: Any) -> str | None:
    """Which of the cache names `forward`'s signature declares, newest first (None: neither)."""
    parameters = inspect.signature(forward).parameters
    return next((name for name in CACHE_NAMES if name in parameters), None)
