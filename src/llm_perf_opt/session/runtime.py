"""How the decoder runs: KV cache kind, torch.compile target and mode, weight quantization, batch size (the
`runtime:` config node and `run.batch_size`), checked once into a :class:`RuntimeSettings` record."""

from __future__ import annotations

from typing import Final

import attrs
import torch

from llm_perf_opt.compile_options import compile_options
from llm_perf_opt.config_schema import (
    COMPILE_MODES,
    COMPILE_TARGETS,
    KV_CACHES,
    OUTPUT_CHECKS,
    QUANTIZE_MODES,
    Stage1Nodes,
)
from llm_perf_opt.errors import UserError, require_bool, require_choice, require_whole
from llm_perf_opt.records.stage1 import DecoderRuntime, RuntimeRecord
from llm_perf_opt.session.quantize import check_quantize


@attrs.frozen
class RuntimeSettings(DecoderRuntime):
    """The decoder's runtime, checked (its fields: `DecoderRuntime`; `static_cache_len` None: each batch's prompt +
    new tokens); the defaults are the eager reference (dynamic cache, no compile, batch 1)."""

    @classmethod
    def from_nodes(cls, nodes: Stage1Nodes) -> RuntimeSettings:
        """From the typed `runtime` node and `run.batch_size`; a UserError for what cannot run."""
        node = nodes.runtime
        length = node.static_cache_len
        settings = cls(
            kv_cache=require_choice("runtime.kv_cache", node.kv_cache, KV_CACHES),
            compile=require_choice("runtime.compile", node.compile, COMPILE_TARGETS),
            compile_mode=require_choice("runtime.compile_mode", node.compile_mode, COMPILE_MODES),
            static_cache_len=None if length is None else require_whole("runtime.static_cache_len", length, 2),
            batch_size=require_whole("run.batch_size", nodes.run.batch_size, 1),
            record_routing=require_bool("runtime.record_routing", node.record_routing),
            output_check=require_choice("runtime.output_check", node.output_check, OUTPUT_CHECKS),
            compile_options=compile_options(node.compile_options),
            compile_vision=require_choice("runtime.compile_vision", node.compile_vision, ("none", *COMPILE_MODES)),
            batch_vision=require_bool("runtime.batch_vision", node.batch_vision),
            preprocess_workers=require_whole("runtime.preprocess_workers", node.preprocess_workers, 0),
            prefetch_pages=require_bool("runtime.prefetch_pages", node.prefetch_pages),
            quantize=require_choice("runtime.quantize", node.quantize, QUANTIZE_MODES),
        )
        settings.check_consistent()
        return settings

    def check_consistent(self) -> None:
        """A UserError for a combination of settings that cannot run."""
        if self.compile != "none" and self.kv_cache != "static":
            raise UserError(
                f"runtime.compile={self.compile} needs a static KV cache, but runtime.kv_cache={self.kv_cache}: a "
                "dynamic cache changes shape every step, so the compiled step would recompile at every token",
                "Set runtime.kv_cache=static (or runtime.compile=none)",
            )
        if self.compile_options and self.compile == "none":
            raise UserError(
                f"runtime.compile_options ({', '.join(name for name, _ in self.compile_options)}) are set but nothing "
                "is compiled (runtime.compile=none)",
                "Set runtime.compile=decode or prefill_decode, or leave runtime.compile_options empty",
            )
        if self.batch_vision and self.batch_size < 2:
            raise UserError(
                f"runtime.batch_vision=true batches the vision of the inputs of one batch, but run.batch_size="
                f"{self.batch_size}: each forward holds one input, so there is nothing to batch",
                "Set run.batch_size to 2 or more (with run.fill_batches=true to fill batches from one page), or "
                "runtime.batch_vision=false",
            )
        if self.static_cache_len is not None and self.kv_cache != "static":
            raise UserError(
                f"runtime.static_cache_len={self.static_cache_len} is set but runtime.kv_cache={self.kv_cache}",
                "Set runtime.kv_cache=static, or leave runtime.static_cache_len unset (null)",
            )

    def check_device(self, device: torch.device) -> None:
        """A UserError naming the setting for compilation or weight quantization this device cannot do."""
        check_quantize(self.quantize, device)
        parts = self.compiled_parts
        if not parts:
            return
        import torch._dynamo

        if not torch._dynamo.is_dynamo_supported():
            first = parts[0]
            raise UserError(
                f"{first.key}={first.value}: torch.compile is not supported by torch {torch.__version__} on this "
                "Python/platform",
                f"Set {first.key}=none, or use a torch build whose torch.compile supports this Python version",
            )
        if device.type == "cuda":
            return
        for part in parts:
            if part.cuda_graphs:
                raise UserError(
                    f"{part.mode_key}={part.mode} captures CUDA graphs, which need a CUDA device (device is "
                    f"{device.type})",
                    f"Use {part.mode_key}=default or max-autotune-no-cudagraphs off the GPU, or run on a GPU",
                )

    @property
    def vision_multiple(self) -> int:
        """Batched vision's groups pad to a multiple of this: the batch size when vision is compiled, else 1."""
        return self.batch_size if self.compile_vision != "none" else 1

    @property
    def compiles_decode(self) -> bool:
        return self.compile in ("decode", "prefill_decode")

    @property
    def compiles_prefill(self) -> bool:
        return self.compile == "prefill_decode"

    @property
    def warmup_needed(self) -> int:
        """Warm-up passes per input before a timed pass is steady: none eagerly; one when a step is compiled; two with
        CUDA graphs (a step called once per pass is recorded in its second call, replayed from the third)."""
        return max((part.warmup_needed for part in self.compiled_parts), default=0)

    @property
    def is_reference(self) -> bool:
        """True for the eager reference: dynamic cache, nothing compiled, batch 1."""
        return self.kv_cache == "dynamic" and not self.compiles and self.batch_size == 1

    @property
    def checks_outputs(self) -> bool:
        """Whether runs are compared with an eager dynamic-cache reference of the same inputs."""
        return not self.is_reference if self.output_check == "auto" else self.output_check == "always"

    @property
    def label(self) -> str:
        """One line for reports, e.g. "static KV cache, compiled decode (reduce-overhead), batch 4"."""
        return self.described(f"batch {self.batch_size}")

    def record(self) -> RuntimeRecord:
        """The settings as metrics.json saves them, with their label."""
        return RuntimeRecord(**attrs.asdict(self, recurse=False), label=self.label)


#: The eager reference every other runtime is compared with.
EAGER_REFERENCE: Final = RuntimeSettings(record_routing=False, output_check="never")
