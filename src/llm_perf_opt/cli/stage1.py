"""`stage1-run`: Hydra entry point (thin: it composes the config and hands it to the pipeline)."""

from __future__ import annotations

from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from llm_perf_opt.cli.common import launch, run_guarded
from llm_perf_opt.heavy_imports import collector_paused


@hydra.main(version_base="1.3", config_path="pkg://llm_perf_opt.conf", config_name="stage1")
def _main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    in_sweep = hydra_cfg.mode == RunMode.MULTIRUN
    if not in_sweep and _launches_processes(cfg):  # run.data_parallel=N: N stage1-run processes and their summary

        def processes() -> None:
            from llm_perf_opt.pipeline.data_parallel import DataParallelRun

            DataParallelRun(cfg, run_dir, run_dir.name, list(hydra_cfg.overrides.task)).execute()

        run_guarded(processes, run_dir=run_dir, cfg=cfg)
        return

    def job() -> None:  # the pipeline's import guarded too: a broken dependency is a bug reported like any other
        with collector_paused():
            from llm_perf_opt.pipeline.stage1 import Stage1Run

        Stage1Run(cfg, run_dir, run_id=run_dir.name).execute()

    run_guarded(job, run_dir=run_dir, in_sweep=in_sweep, cfg=cfg)


def _launches_processes(cfg: DictConfig) -> bool:
    """`run.data_parallel` > 1 without `run.shard`: this process starts the shards instead of timing one."""
    run = cfg.get("run", {})
    count = run.get("data_parallel", 1)
    return isinstance(count, int) and count > 1 and run.get("shard") is None


def main() -> None:
    """Console script entry point."""
    launch(_main, "stage1", "stage1-run")


if __name__ == "__main__":
    main()
