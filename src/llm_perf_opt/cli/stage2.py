"""`stage2-profile`: Hydra entry point (thin). `stage2.rerender=<folder>` rebuilds a folder's artifacts instead."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from llm_perf_opt import artifacts
from llm_perf_opt.cli.common import launch, print_report_path, run_guarded
from llm_perf_opt.config_data import command_config
from llm_perf_opt.heavy_imports import collector_paused
from llm_perf_opt.process_end import ends_process


@hydra.main(version_base="1.3", config_path="pkg://llm_perf_opt.conf", config_name="stage2")
def _main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    if cfg.stage2.rerender:  # no run: the folder the run-folder guard claimed is given back
        artifacts.release(run_dir)
        print_report_path(run_guarded(lambda: _pipeline().render(Path(str(cfg.stage2.rerender)))))
        return
    overrides = list(hydra_cfg.overrides.task)  # the run ends with its summary: the budget, then report.md's path

    def job() -> None:
        pipeline = _pipeline()
        settings = pipeline.Stage2Settings.from_config(command_config(cfg))  # typed, read once for the pipeline
        pipeline.Stage2Run(settings, run_dir, run_id=run_dir.name, task_overrides=overrides).execute()

    run_guarded(job, run_dir=run_dir, cfg=cfg)


def _pipeline() -> ModuleType:
    """The Stage 2 pipeline, imported inside the guarded job: a broken dependency is a bug reported like any other."""
    with collector_paused():
        from llm_perf_opt.pipeline import stage2

    return stage2


def main() -> None:
    """Console script entry point."""
    launch(_main, "stage2", "stage2-profile")


#: The console script (pyproject.toml) and `python -m`: `main`, then the process ends without the module teardown.
console = ends_process(main)

if __name__ == "__main__":
    console()
