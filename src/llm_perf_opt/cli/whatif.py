"""`perf-whatif`: Hydra entry point (thin: it composes the config, reads its typed nodes once and hands both to the
pipeline)."""

from __future__ import annotations

from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from llm_perf_opt.cli.common import launch, run_guarded
from llm_perf_opt.config_data import command_config, whatif_nodes
from llm_perf_opt.heavy_imports import collector_paused
from llm_perf_opt.process_end import ends_process
from llm_perf_opt.settings_schema import check_config


@hydra.main(version_base="1.3", config_path="pkg://llm_perf_opt.conf", config_name="whatif")
def _main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    task_overrides = list(hydra_cfg.overrides.task)

    def job() -> None:  # the pipeline's import guarded too: a broken dependency is a bug reported like any other
        with collector_paused():
            from llm_perf_opt.pipeline.whatif import WhatIfRun, whatif_config, workload_overrides

        # whatif, whatif_run: typed, read once for the pipeline; whatif=advised: the workload of whatif.from_run under
        # the command line's, and the objective of its advice where none is set
        whatif, workload = whatif_nodes(cfg), workload_overrides(task_overrides)
        composed, whatif, workload, advised = whatif_config(cfg, whatif, workload)
        config = command_config(composed)  # model, run, infer, ...: the settings of that config, typed
        # the run ends with its summary: the rungs, the best lever, the time budget, then whatif.md's path
        WhatIfRun(config, run_dir, run_dir.name, workload, whatif=whatif, advised=advised).execute()

    run_guarded(job, run_dir=run_dir, cfg=cfg)


def main() -> None:
    """Console script entry point. SIGTERM (a scheduler's or `timeout`'s stop) ends the run like Ctrl-C: the rungs
    still running are stopped (each writes what it measured) and the rungs so far are written."""
    launch(_main, "whatif", "perf-whatif", check=_check)


def _check(cfg: DictConfig) -> None:
    """Every setting's type, then perf-whatif's own settings (levers, devices, launcher), before anything starts."""
    from llm_perf_opt.pipeline.whatif import check_whatif_settings

    check_config(cfg)
    check_whatif_settings(command_config(cfg), whatif_nodes(cfg))


#: The console script (pyproject.toml) and `python -m`: `main`, then the process ends without the module teardown.
console = ends_process(main)

if __name__ == "__main__":
    console()
