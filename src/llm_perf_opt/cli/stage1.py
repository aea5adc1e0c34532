"""`stage1-run`: Hydra entry point (thin: it composes the config, reads its typed nodes once and hands both to the
pipeline)."""

from __future__ import annotations

from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from llm_perf_opt.cli.common import launch, run_guarded
from llm_perf_opt.config_data import command_config
from llm_perf_opt.heavy_imports import collector_paused
from llm_perf_opt.process_end import ends_process


@hydra.main(version_base="1.3", config_path="pkg://llm_perf_opt.conf", config_name="stage1")
def _main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    in_sweep = hydra_cfg.mode == RunMode.MULTIRUN

    def job() -> None:  # the pipeline's import guarded too: a broken dependency is a bug reported like any other
        config = command_config(cfg)  # model, dataset, run, infer, ...: typed, read once for the pipeline
        run = config.nodes.run  # run.data_parallel=N without run.shard: this process starts N processes, their summary
        if not in_sweep and run.data_parallel > 1 and run.shard is None:
            from llm_perf_opt.pipeline.data_parallel import DataParallelRun

            DataParallelRun(config, run_dir, run_dir.name, list(hydra_cfg.overrides.task)).execute()
            return
        with collector_paused():
            from llm_perf_opt.pipeline.stage1 import Stage1Run

        Stage1Run(config, run_dir, run_id=run_dir.name).execute()

    run_guarded(job, run_dir=run_dir, in_sweep=in_sweep, cfg=cfg)


def main() -> None:
    """Console script entry point."""
    launch(_main, "stage1", "stage1-run")


#: The console script (pyproject.toml) and `python -m`: `main`, then the process ends without the module teardown.
console = ends_process(main)

if __name__ == "__main__":
    console()
