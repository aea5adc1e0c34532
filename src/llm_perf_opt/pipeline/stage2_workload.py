"""The Stage 1 command Stage 2 profiles: the user's overrides that configure it, Stage 2's own settings on top, and
the saved model its processes share."""

from __future__ import annotations

import logging
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llm_perf_opt.override_text import override_key, quoted, quoted_override, sets_key
from llm_perf_opt.pipeline.stage2_settings import Stage2Settings

log = logging.getLogger("llm_perf_opt.stage2")

MODEL_CACHE_DIR = "model_cache"  # the workloads' saved random-weights model (`model.cache_dir`), removed at the end

# Keys that belong to Stage 2 itself and are not forwarded to the profiled workload.
_OWN_PREFIXES = (
    "stage2.",
    "report.",
    "pipeline.nsys",
    "pipeline.ncu",
    "pipeline/nsys",
    "pipeline/ncu",
    "hydra.",
    "hydra/",
)


def forwarded_overrides(task_overrides: Sequence[str]) -> list[str]:
    """The user's overrides that configure the workload (all but Stage 2's own keys)."""
    return [override for override in task_overrides if not override_key(override).startswith(_OWN_PREFIXES)]


def workload_argv(
    settings: Stage2Settings,
    user_overrides: Sequence[str],
    run_dir: Path,
    *,
    name: str,
    ncu: bool = False,
    model_cache: Path | None = None,
) -> list[str]:
    """`python -m llm_perf_opt.cli.stage1` with every user override plus Stage 2's own settings; an ncu workload
    runs one forward: one input, or one whole batch (`run.batch_size`). `model_cache`: the `model.cache_dir` the
    workloads share (the first saves the random-weights model, the others load it)."""
    argv = [sys.executable, "-m", "llm_perf_opt.cli.stage1", *user_overrides]
    defaults = {  # the user's value wins
        "pipeline.torch_profiler.enable": "false",  # the torch profiler and Nsight both use CUPTI
        "pipeline.memory.enable": "false",  # Stage 1's extra passes: nothing Nsight analyses
        "pipeline.energy.enable": "false",
        "run.repeats": settings.workload.repeats,
        "run.warmup": settings.workload.warmup,
        "model.cache_dir": None if model_cache is None else quoted(model_cache),
    }
    forced: dict[str, Any] = {}  # after the user's overrides, so these win
    if ncu:
        one = settings.ncu_workload
        forced = {  # one forward: one input, or one whole batch
            "dataset.max_images": max(one.max_images, settings.runtime.batch_size),
            "infer.max_new_tokens": one.max_new_tokens,
            "run.repeats": one.repeats,
            "run.profiler_window": "true",  # ncu --profile-from-start off: the first prefill and a middle decode step
        }
    for key, value in defaults.items():
        if value is not None and not sets_key(user_overrides, key) and forced.get(key) is None:
            argv.append(f"{key}={value}")
    argv += [f"{key}={value}" for key, value in forced.items() if value is not None]
    argv.append(quoted_override("hydra.run.dir", run_dir / "workload" / name))
    return argv


def run_model_cache(settings: Stage2Settings, user_overrides: Sequence[str], run_dir: Path) -> Path | None:
    """The run's own `model.cache_dir` for its workloads (`<run>/model_cache`, removed when the run ends): None
    with `stage2.reuse_model=false`, checkpoint weights (`model.path`, `model.name_or_path`) or a `model.cache_dir`
    the user chose (that folder is forwarded as set, and kept)."""
    if not settings.reuse_model or sets_key(user_overrides, "model.cache_dir") or settings.own_model:
        return None
    return run_dir / MODEL_CACHE_DIR


def remove_model_cache(folder: Path | None) -> None:
    """Delete a run's own saved model (gigabytes the finished run no longer needs); a failure is logged."""
    if folder is None or not folder.exists():
        return
    try:
        shutil.rmtree(folder)
    except OSError as exc:
        log.warning("could not remove the run's saved model %s: %s", folder, exc)
