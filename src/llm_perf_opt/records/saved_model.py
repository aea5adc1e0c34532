"""The manifest of a saved random-weights model (`model.cache_dir`, :mod:`llm_perf_opt.session.saved_model`):
what the weights were built from, and what the file holds."""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen
class SavedModelKey:
    """What a saved random-weights model must match to stand for building it."""

    model: str  # model.name
    adapter: str
    model_class: str  # module.qualname of the built model
    config_digest: str  # sha256 of the built model's config (the architecture and every setting it records)
    source_digest: str  # sha256 of the model class's source file (its initialisation)
    dtype: str
    seed: int
    init_device: str  # where the weights were drawn: cpu, or cuda and the GPU's name
    torch: str
    transformers: str
    llm_perf_opt: str

    def describe_difference(self, other: dict[str, Any]) -> str | None:
        """The first field where `other` (a manifest's key) differs from this key, said in words; None if none."""
        for name, value in attrs.asdict(self).items():
            if other.get(name) != value:
                return f"its {name.replace('_', ' ')} is {other.get(name)!r}, this run's is {value!r}"
        return None


@attrs.frozen
class Manifest:
    """`manifest.json`: the key the weights were built under, and what the file holds."""

    key: SavedModelKey
    parameters: int  # parameter count (tied ones once)
    tensors: int  # tensors in the file
    file_bytes: int  # size of model.safetensors when it was written
    content_digest: str = ""  # hash of model.safetensors' bytes (session.saved_model.content_digest); "": none (older)
