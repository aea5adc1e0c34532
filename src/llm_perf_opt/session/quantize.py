"""Weight quantization of the language model through torchao (`runtime.quantize`).

Every nn.Linear outside the vision stage modules is quantized in place once the model is built or loaded, before
anything is compiled. The routed experts of transformers 5's MoE decoders are fused tensors (`gate_up_proj`,
`down_proj`), not nn.Linear layers, so they keep the model's dtype, as do the MoE routers. torchao is optional (not
a dependency of the toolkit): a setting it needs is refused up front without it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Final

import torch
from torch import nn

from llm_perf_opt.errors import UserError
from llm_perf_opt.records.stage1 import QuantizedLayers

log = logging.getLogger(__name__)

#: runtime.quantize -> the torchao 0.18 config class that applies it (torchao.quantization).
TORCHAO_CONFIGS: Final = {
    "int8_weight_only": "Int8WeightOnlyConfig",
    "float8_weight_only": "Float8WeightOnlyConfig",
    "float8_dynamic": "Float8DynamicActivationFloat8WeightConfig",
}
#: Float8 matmuls need a CUDA GPU of this compute capability or newer (Ada, Hopper and later).
FLOAT8_CAPABILITY: Final = (8, 9)


def check_quantize(setting: str, device: torch.device) -> None:
    """A UserError unless `runtime.quantize=setting` can run here (cheap: before the model is built)."""
    if setting == "none":
        return
    key = f"runtime.quantize={setting}"
    if setting.startswith("float8"):
        capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
        if capability is None or capability < FLOAT8_CAPABILITY:
            where = f"compute capability {capability[0]}.{capability[1]}" if capability else f"device {device.type}"
            raise UserError(
                f"{key} needs a CUDA GPU of compute capability {FLOAT8_CAPABILITY[0]}.{FLOAT8_CAPABILITY[1]} or newer "
                f"for its float8 matmuls (Ada, Hopper and later), but this run has {where}",
                "Run on such a GPU, or set runtime.quantize=int8_weight_only or none",
            )
    try:
        import torchao.quantization  # noqa: F401
    except ImportError as exc:
        raise UserError(
            f"{key} quantizes the weights through torchao, which cannot be imported here ({exc})",
            "Install torchao into this environment (pip install torchao; a release that matches your torch), or set "
            "runtime.quantize=none",
        ) from None


def torchao_config(setting: str) -> Any:
    """torchao's config for `setting`. torchao's own inductor settings are left off (`set_inductor_config=False`),
    so a compiled step is compiled as `runtime.compile_mode` and `runtime.compile_options` say, as without it."""
    import torchao.quantization

    return getattr(torchao.quantization, TORCHAO_CONFIGS[setting])(set_inductor_config=False)


def quantize_linears(model: nn.Module, setting: str, skipped: Iterable[nn.Module]) -> QuantizedLayers:
    """Quantize in place every nn.Linear of `model` outside the `skipped` modules; what was quantized."""
    from torchao.quantization import quantize_

    inside = {id(module) for root in skipped for module in root.modules()}
    linears = [module for module in model.modules() if isinstance(module, nn.Linear)]
    chosen = [module for module in linears if id(module) not in inside]
    chosen_ids = {id(module) for module in chosen}
    quantized = QuantizedLayers(
        setting=setting,
        layers=len(chosen),
        parameters=sum(module.weight.numel() for module in chosen),
        linear_layers=len(linears),
    )
    quantize_(model, torchao_config(setting), filter_fn=lambda module, _name: id(module) in chosen_ids)
    log.info("runtime.quantize: %s", quantized.text)
    return quantized
