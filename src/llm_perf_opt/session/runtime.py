"""How the decoder runs: KV cache kind, torch.compile target and mode, batch size (the `runtime:` config node
and `run.batch_size`), checked once into a :class:`RuntimeSettings` record."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs
import torch

from llm_perf_opt.errors import UserError, require_bool, require_choice, require_whole
from llm_perf_opt.records.stage1 import CompileOption, DecoderRuntime, RuntimeRecord
from llm_perf_opt.settings_schema import COMPILE_MODES, COMPILE_TARGETS, KV_CACHES, OUTPUT_CHECKS


@attrs.frozen
class RuntimeSettings(DecoderRuntime):
    """The decoder's runtime, checked (its fields: `DecoderRuntime`; `static_cache_len` None: each batch's prompt +
    new tokens); the defaults are the eager reference (dynamic cache, no compile, batch 1)."""

    @classmethod
    def from_config(cls, cfg: Any) -> RuntimeSettings:
        """From the composed stage config (its `runtime` node and `run.batch_size`); bad values raise UserError."""
        node: Mapping[str, Any] = cfg.get("runtime") or {}
        run: Mapping[str, Any] = cfg.get("run") or {}
        batch = run.get("batch_size", 1)
        batch_size = require_whole("run.batch_size", 1 if batch is None else batch, 1)
        length = node.get("static_cache_len")
        settings = cls(
            kv_cache=require_choice("runtime.kv_cache", node.get("kv_cache", "dynamic"), KV_CACHES),
            compile=require_choice("runtime.compile", node.get("compile", "none"), COMPILE_TARGETS),
            compile_mode=require_choice(
                "runtime.compile_mode", node.get("compile_mode", "reduce-overhead"), COMPILE_MODES
            ),
            static_cache_len=None if length is None else require_whole("runtime.static_cache_len", length, 2),
            batch_size=batch_size,
            record_routing=require_bool("runtime.record_routing", node.get("record_routing", True)),
            output_check=require_choice("runtime.output_check", node.get("output_check", "auto"), OUTPUT_CHECKS),
            compile_options=compile_options(node.get("compile_options")),
            compile_vision=require_choice(
                "runtime.compile_vision", node.get("compile_vision", "none"), ("none", *COMPILE_MODES)
            ),
            batch_vision=require_bool("runtime.batch_vision", node.get("batch_vision", False)),
        )
        settings.check_consistent()
        return settings

    def check_consistent(self) -> None:
        """Combinations that cannot run: compiled decode on a growing cache, batched vision without a batch, a cache
        length without a static cache."""
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
        """Compilation this device and torch can do (a UserError naming the setting otherwise)."""
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
        """Batched vision's view groups are padded to a multiple of this (`models.view_groups`): the batch size when
        the vision stages are compiled (a few fixed shapes per group: one graph each, a short last batch's too), else
        1 (no padding)."""
        return self.batch_size if self.compile_vision != "none" else 1

    @property
    def compiles_decode(self) -> bool:
        return self.compile in ("decode", "prefill_decode")

    @property
    def compiles_prefill(self) -> bool:
        return self.compile == "prefill_decode"

    @property
    def warmup_needed(self) -> int:
        """Warm-up passes per input a timed pass needs to be steady state: none eagerly; one when a step is compiled
        (the first pass of each shape compiles it); two with CUDA graphs (a step called once per pass, such as a
        compiled prefill, is recorded as a graph in its second call and replayed from the third)."""
        return max((part.warmup_needed for part in self.compiled_parts), default=0)

    @property
    def is_reference(self) -> bool:
        """True for the eager reference: dynamic cache, nothing compiled, batch 1."""
        return self.kv_cache == "dynamic" and not self.compiles and self.batch_size == 1

    @property
    def checks_outputs(self) -> bool:
        """Whether runs are compared with an eager dynamic-cache reference of the same inputs."""
        if self.output_check == "auto":
            return not self.is_reference
        return self.output_check == "always"

    @property
    def label(self) -> str:
        """One line for reports, e.g. "static KV cache, compiled decode (reduce-overhead), batch 4"."""
        return self.described(f"batch {self.batch_size}")

    def record(self) -> RuntimeRecord:
        """The settings as metrics.json saves them, with their label."""
        return RuntimeRecord(**attrs.asdict(self, recurse=False), label=self.label)


def compile_options(node: Any) -> tuple[CompileOption, ...]:
    """`runtime.compile_options` (a mapping of inductor config names to values, set on top of the compile mode's
    own; a nested option such as `cpp.simdlen` as a nested mapping or a dotted name), checked against this torch's
    inductor config (the name, and the value's type against the option's default), sorted by name."""
    if node is None:
        return ()
    if not isinstance(node, Mapping):
        raise UserError(
            f"runtime.compile_options={node} is not a mapping",
            "Give inductor options by name, e.g. +runtime.compile_options.coordinate_descent_tuning=true",
        )
    import torch._inductor.config as inductor_config

    known = inductor_config.get_config_copy()
    out = [(name, _option_value(name, value, known)) for name, value in _flat_options(node, "")]
    return tuple(sorted(out))


def _flat_options(node: Mapping[Any, Any], prefix: str) -> list[tuple[str, Any]]:
    """`node`'s (dotted name, value) pairs, nested mappings flattened (`{cpp: {simdlen: 4}}` -> `cpp.simdlen`)."""
    out: list[tuple[str, Any]] = []
    for name, value in node.items():
        if isinstance(value, Mapping):
            out += _flat_options(value, f"{prefix}{name}.")
        else:
            out.append((f"{prefix}{name}", value))
    return out


def _option_value(name: str, value: Any, known: Mapping[str, Any]) -> bool | int | float | str:
    """`value` for the inductor option `name` when the option exists and `value` has its default's type."""
    key = f"runtime.compile_options.{name}"
    if name not in known:
        raise UserError(
            f"{key} is not an option of torch {torch.__version__}'s inductor",
            "Use a name from torch._inductor.config (e.g. coordinate_descent_tuning, max_autotune, "
            "max_autotune_gemm_backends, cpp.simdlen), or remove it",
        )
    default = known[name]
    if isinstance(default, bool):
        return require_bool(key, value)
    if isinstance(default, int) and not isinstance(value, bool) and isinstance(value, int):
        return value
    if isinstance(default, int | float) and not isinstance(value, bool) and isinstance(value, int | float):
        return value
    if isinstance(default, str) and isinstance(value, str):
        return value
    if default is None and isinstance(value, bool | int | float | str):
        return value
    kind = type(default).__name__ if default is not None else "plain value"
    raise UserError(
        f"{key}={value} does not fit the option (inductor's default is {default!r}, a {kind})",
        f"Give {key} a value of that type, or remove it",
    )


#: The eager reference every other runtime is compared with.
EAGER_REFERENCE: Final = RuntimeSettings(record_routing=False, output_check="never")
