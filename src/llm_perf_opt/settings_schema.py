"""Every setting's range, in one table, checked once when a command's config is composed, before any process or
model starts.

:data:`SCHEMA` maps a dotted key to its kind (a boolean, a whole number within bounds, a number, one of some words, a
list of names, a folder that stays inside the run folder, an output folder, inductor options); :func:`check_settings`
checks each key the composed config holds and raises a :class:`UserError` naming the first bad one. The type and
default of the commands' own nodes (run, infer, outputs, runtime, report, hardware, whatif, whatif_run) are
`config_schema`'s dataclasses, which Hydra composes onto; each of their fields has its kind here
(`tests/test_config_schema.py` checks both agree), and `override_keys` checks a command line's values of these keys
before composing, so a bad one is this paragraph, never the schema's traceback. The readers below it (the typed
settings records of each stage) use the same checks (`errors.require_*`), so a value is read one way everywhere.
Torch-free: `cli/common.launch` runs it before Hydra starts, and each command again on its composed config (so a
sweep's job refuses its own bad value into its failed folder). A check that needs more than the value (the model's
positions) is a cross check at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Final

from llm_perf_opt.errors import UserError, require_whole
from llm_perf_opt.records.vocabulary import QUANTIZE_LABELS
from llm_perf_opt.setting_kinds import (
    Choice,
    Flag,
    InductorOptions,
    InsideRun,
    Kind,
    Names,
    Number,
    OutputFolder,
    Whole,
)

if TYPE_CHECKING:
    from omegaconf import DictConfig

KV_CACHES: Final = ("dynamic", "static")
COMPILE_TARGETS: Final = ("none", "decode", "prefill_decode")
COMPILE_MODES: Final = ("reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs", "default")
OUTPUT_CHECKS: Final = ("auto", "always", "never")
QUANTIZE_MODES: Final = tuple(QUANTIZE_LABELS)  # runtime.quantize: none, then torchao's weight quantizations
#: Decode length a run may ask for when the model's config states no max_position_embeddings.
MAX_NEW_TOKENS: Final = 1 << 20

OUTPUT = "pipeline.torch_profiler.output"
_RUN_COUNTS: dict[str, Kind] = {
    "repeats": Whole(1),
    "warmup": Whole(0),
    "max_new_tokens": Whole(1, MAX_NEW_TOKENS),
    "max_images": Whole(1, nullable=True, words=("all",)),
    "timed_seconds": Number(0.0, "seconds", above=True, nullable=True),
}

#: Every typed setting of every command: dotted key -> kind. A command's config holds some of them; the others
#: are not checked for it. Open maps (what-if levers, inductor options) are checked by their readers.
SCHEMA: Final[Mapping[str, Kind]] = {
    # the model
    "model.trust_remote_code": Flag(),
    "model.seed": Whole(0),
    "model.cache_dir": OutputFolder(nullable=True),
    "model.preprocess.min_tiles": Whole(1),
    "model.preprocess.max_tiles": Whole(1),
    "model.preprocess.chat_template": Flag(),
    "model.preprocess.max_prompt_tokens": Whole(1, nullable=True),
    # the inputs
    "dataset.seed": Whole(0),
    "dataset.max_images": Whole(1, nullable=True, words=("all",)),
    "dataset.on_error": Choice(("skip", "fail")),
    # the run
    "run.repeats": Whole(1, nullable=True),
    "run.warmup": Whole(0, nullable=True),
    "infer.max_new_tokens": Whole(1, MAX_NEW_TOKENS, nullable=True),
    "run.batch_size": Whole(1),
    "run.fill_batches": Flag(),
    "run.check_batch_fit": Flag(),
    "run.cv_warn": Number(0.0, "(coefficient of variation)"),
    "run.save_prefill_logits": Flag(),
    "run.save_top2_logits": Flag(),
    "run.profiler_window": Flag(),
    "run.data_parallel": Whole(1),
    "run.shard": Whole(0, nullable=True),
    **{
        f"run.device_defaults.{device}.{name}": kind for device in ("cpu", "cuda") for name, kind in _RUN_COUNTS.items()
    },
    # the decoder's runtime
    "runtime.kv_cache": Choice(KV_CACHES),
    "runtime.compile": Choice(COMPILE_TARGETS),
    "runtime.compile_mode": Choice(COMPILE_MODES),
    "runtime.compile_options": InductorOptions(),
    "runtime.compile_vision": Choice(("none", *COMPILE_MODES)),
    "runtime.batch_vision": Flag(),
    "runtime.preprocess_workers": Whole(0),
    "runtime.prefetch_pages": Flag(),
    "runtime.static_cache_len": Whole(2, nullable=True),
    "runtime.record_routing": Flag(),
    "runtime.output_check": Choice(OUTPUT_CHECKS),
    "runtime.quantize": Choice(QUANTIZE_MODES),
    # the passes
    "pipeline.torch_profiler.enable": Flag(),
    "pipeline.torch_profiler.decode_steps": Whole(0),
    "pipeline.torch_profiler.record_shapes": Flag(),
    "pipeline.torch_profiler.profile_memory": Flag(),
    "pipeline.torch_profiler.with_stack": Flag(),
    "pipeline.torch_profiler.modules": Flag(),
    "pipeline.torch_profiler.with_flops": Flag(),
    "pipeline.torch_profiler.chrome_trace": Flag(),
    "pipeline.torch_profiler.top_k": Whole(1),
    f"{OUTPUT}.prediction.enable": Flag(),
    f"{OUTPUT}.prediction.save_dir": InsideRun(),
    f"{OUTPUT}.visualization.enable": Flag(),
    f"{OUTPUT}.visualization.save_dir": InsideRun(),
    f"{OUTPUT}.extra.deepseek_ocr.prediction.strip_special_tokens": Flag(),
    f"{OUTPUT}.extra.deepseek_ocr.visualization.max_images": Whole(1),
    f"{OUTPUT}.extra.deepseek_ocr.visualization.thumbnail_width": Whole(16),
    "outputs.save_predictions": Flag(nullable=True),
    "outputs.predictions.strip_special_tokens": Flag(nullable=True),
    "outputs.visualization.enable": Flag(nullable=True),
    "outputs.visualization.max_images": Whole(1, nullable=True),
    "outputs.visualization.thumbnail_width": Whole(16, nullable=True),
    "pipeline.memory.enable": Flag(),
    "pipeline.memory.max_entries": Whole(1),
    "pipeline.memory.snapshot_max_mib": Number(0.0, "MiB"),
    "pipeline.energy.enable": Flag(),
    "pipeline.energy.loop_seconds": Number(0.0, "seconds"),
    "pipeline.energy.prefill_seconds": Number(0.0, "seconds"),
    "pipeline.energy.idle_seconds": Number(0.0, "seconds"),
    "pipeline.nsys.enable": Flag(),
    "pipeline.nsys.timeout_s": Number(0.0, "seconds", above=True),
    "pipeline.ncu.enable": Flag(),
    "pipeline.ncu.timeout_s": Number(0.0, "seconds", above=True),
    "report.render": Flag(),
    "hardware.peak_tflops": Number(0.0, "TFLOP/s", above=True, nullable=True),
    "hardware.peak_bandwidth_gbps": Number(0.0, "GB/s", above=True, nullable=True),
    # stage2-profile
    "stage2.reuse_model": Flag(),
    **{f"stage2.modes.{mode}.bytes_pass": Flag() for mode in ("light", "deep")},
    **{f"stage2.modes.{mode}.top_kernels": Whole(1) for mode in ("light", "deep")},
    **{f"stage2.modes.{mode}.launches_per_kernel": Whole(1) for mode in ("light", "deep")},
    "stage2.workload.repeats": Whole(1),
    "stage2.workload.warmup": Whole(0),
    "stage2.ncu_workload.repeats": Whole(1),
    "stage2.ncu_workload.max_images": Whole(1),
    "stage2.ncu_workload.max_new_tokens": Whole(1, MAX_NEW_TOKENS),
    # analytic-report
    "analytic.tiles": Whole(0),
    "analytic.new_tokens": Whole(1, MAX_NEW_TOKENS),
    "analytic.text_tokens": Whole(0, nullable=True),
    # perf-whatif
    "whatif.memory_budget_gib": Number(0.0, "GiB", above=True, nullable=True),
    "whatif.latency_target.ttlt_p90_ms": Number(0.0, "ms", above=True, nullable=True),
    "whatif.latency_target.ttft_p90_ms": Number(0.0, "ms", above=True, nullable=True),
    "whatif_run.exclude": Names("static_cache,attn_eager"),
    "whatif_run.devices": Names("cuda:0,cuda:1"),
    "whatif_run.launcher": Choice(("local", "hydra")),
    "whatif_run.hydra_launcher": Names('"hydra/launcher=joblib","hydra.launcher.n_jobs=2"'),
    "whatif_run.rung_timeout_s": Number(0.0, "seconds", above=True, nullable=True),
    "whatif_run.reuse_model": Flag(),
    "whatif_run.fork_rungs": Flag(),
    "whatif_run.overlap_rungs": Flag(),
    "whatif_run.inductor_cache": OutputFolder(nullable=True, words=("user", "run")),
    "whatif_run.ladder": Flag(),
    "whatif_run.ladder_latency_only": Flag(),
    "whatif_run.ladder_identical_outputs": Flag(),
    "whatif_run.ladder_max_logit_diff": Number(0.0, "logits", nullable=True),
    "whatif_run.near_tie_tolerance": Number(0.0, "(a fraction of the top logit, below 1)", nullable=True),
    # where a command writes (hydra's own keys: composed with return_hydra_config)
    "hydra.run.dir": OutputFolder(),
    "hydra.sweep.dir": OutputFolder(),
}

Select = Callable[[str], object]  # a key's value in the composed config (MISSING when it has none)
MISSING: Final = object()


def check_settings(select: Select) -> None:
    """Each SCHEMA key the config holds (`select`: its value, or MISSING), then the checks across keys: a bad
    value is a UserError naming the key and its fix."""
    for key, kind in SCHEMA.items():
        value = select(key)
        if value is not MISSING:
            kind.check(key, value)
    _check_decode_length(select)


def _check_decode_length(select: Select) -> None:
    """infer.max_new_tokens within the positions the model's decoder takes (when its config says)."""
    positions = select("model.architecture.text_config.max_position_embeddings")
    tokens = select("infer.max_new_tokens")
    if positions is MISSING or tokens in (MISSING, None) or not isinstance(positions, int):
        return
    if require_whole("infer.max_new_tokens", tokens, 1) > positions:
        raise UserError(
            f"infer.max_new_tokens={tokens} is more than the model takes: its decoder has {positions:,} positions "
            "(max_position_embeddings), prompt included",
            f"Set infer.max_new_tokens below {positions:,}",
        )


def as_mapping(node: Mapping[str, object]) -> Select:
    """A `select` over a plain nested mapping (a config turned into dicts and lists)."""

    def select(key: str) -> object:
        here: object = node
        for part in key.split("."):
            if not isinstance(here, Mapping) or part not in here:
                return MISSING
            here = here[part]
        return here

    return select


def check_config(cfg: DictConfig) -> None:
    """`check_settings` over a composed config (a DictConfig; an interpolation that cannot be resolved here, such
    as Hydra's own `${now:...}` outside a run, is left to the command)."""
    from omegaconf import Container, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    def select(key: str) -> object:
        try:
            value = OmegaConf.select(cfg, key, default=MISSING)
        except OmegaConfBaseException:
            return MISSING
        return OmegaConf.to_container(value, resolve=True) if isinstance(value, Container) else value

    check_settings(select)
