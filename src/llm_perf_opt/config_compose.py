"""The project's configs outside a command: the resolvers they use and composing one by name (tests, the
what-if run's validation of a rung, the override-key check)."""

from __future__ import annotations

import secrets
import time

from omegaconf import DictConfig, OmegaConf

from llm_perf_opt.gpu_claim import job_device

_ISSUED_RUN_IDS: set[str] = set()


def new_run_id() -> str:
    """`YYYYMMDD-HHMMSS-xxxxxxxx`: time-sortable; never the same twice in one process, and 32 random bits make
    two processes started in the same second share one with odds of 1 in 4 billion."""
    while True:
        run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(4)}"
        if run_id not in _ISSUED_RUN_IDS:
            _ISSUED_RUN_IDS.add(run_id)
            return run_id


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
