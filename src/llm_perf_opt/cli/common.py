"""What every Hydra entry point shares: config resolvers and turning errors into exit codes."""

from __future__ import annotations

import logging
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from llm_perf_opt.errors import UserError

log = logging.getLogger("llm_perf_opt")


def new_run_id() -> str:
    """`YYYYMMDD-HHMMSS-xxxxxx`: time-sortable, with 24 random bits so two runs in one second never share one."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def job_device() -> str:
    """`cuda:<job number mod visible GPUs>` inside a Hydra job (one GPU per parallel sweep job), else `auto`."""
    import torch
    from hydra.core.hydra_config import HydraConfig

    count = torch.cuda.device_count()
    if count == 0 or not HydraConfig.initialized():
        return "auto"
    number = getattr(HydraConfig.get().job, "num", None) or 0
    return f"cuda:{int(number) % count}"


def register_resolvers() -> None:
    """`${llo_run_id:}`, `${llo_samples_dir:}`, `${llo_prompts_dir:}`, `${llo_job_device:}` and
    `${llo_hf_label:name_or_path,config}` for the configs (idempotent)."""
    from llm_perf_opt.data.dataset import bundled_samples_dir
    from llm_perf_opt.data.prompts import bundled_prompts_dir
    from llm_perf_opt.session.adapters.hf_source import hf_label

    if not OmegaConf.has_resolver("llo_run_id"):
        OmegaConf.register_new_resolver("llo_run_id", new_run_id, use_cache=True)
    if not OmegaConf.has_resolver("llo_job_device"):
        OmegaConf.register_new_resolver("llo_job_device", job_device)
    if not OmegaConf.has_resolver("llo_samples_dir"):
        OmegaConf.register_new_resolver("llo_samples_dir", lambda: str(bundled_samples_dir()))
    if not OmegaConf.has_resolver("llo_prompts_dir"):
        OmegaConf.register_new_resolver("llo_prompts_dir", lambda: str(bundled_prompts_dir()))
    if not OmegaConf.has_resolver("llo_hf_label"):
        OmegaConf.register_new_resolver("llo_hf_label", hf_label)


def compose_config(config_name: str, *overrides: str, return_hydra_config: bool = False) -> DictConfig:
    """A project config (`stage1`, `stage2`, `analytic`) composed by Hydra outside a command, e.g. in tests."""
    from hydra import compose, initialize_config_module

    register_resolvers()
    with initialize_config_module(version_base="1.3", config_module="llm_perf_opt.conf"):
        return compose(config_name, overrides=list(overrides), return_hydra_config=return_hydra_config)


def run_guarded(job: Callable[[], Any], *, in_sweep: bool = False) -> Any:
    """Run `job`; a UserError becomes one paragraph on stderr and exit 2, Ctrl-C exit 130.

    In a sweep (`in_sweep`), a UserError ends only this job: its folder is already marked failed, the sweep goes on
    and its summary lists the job as skipped with the message.
    """
    try:
        result = job()
    except UserError as exc:
        print(f"\nerror: {exc}", file=sys.stderr)
        if in_sweep:
            return None
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print(
            "\ninterrupted: what was measured so far was written; the run folder is marked interrupted.",
            file=sys.stderr,
        )
        sys.exit(130)
    return result


def print_report_path(run_dir: Path) -> None:
    """The last line a command prints: where its report is."""
    print(f"\nreport: {run_dir / 'report.md'}")
