"""`analytic-report`: Hydra entry point (thin): price a workload from the model config, no weights needed."""

from __future__ import annotations

from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from llm_perf_opt.cli.common import launch, run_guarded
from llm_perf_opt.process_end import ends_process


@hydra.main(version_base="1.3", config_path="pkg://llm_perf_opt.conf", config_name="analytic")
def _main(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)

    def job() -> None:  # the imports guarded too: a broken dependency is a bug reported like any other
        from llm_perf_opt import artifacts
        from llm_perf_opt.config_data import command_config
        from llm_perf_opt.errors import UserError
        from llm_perf_opt.pipeline.analytic import check_workload_model, write_analytic_report
        from llm_perf_opt.progress import Feedback
        from llm_perf_opt.session.adapters.registry import make_adapter

        feedback = Feedback()
        art = artifacts.ArtifactsManager(run_dir, stage="analytic")
        art.start(run_dir.name)
        try:
            config = command_config(cfg)  # the settings, typed and read once
            check_workload_model(config)  # a named workload with another model: one paragraph, before anything else
            model = config.model
            if not make_adapter(model).has_analytic_model:
                raise UserError(
                    f"analytic-report has no static model of {model.name} (adapter {model.adapter}): it prices "
                    "the DeepSeek-OCR models",
                    "Run stage1-run with the same model: dense decoder-only models (Llama, Qwen2, Mistral) get "
                    "analytic FLOPs and bytes per stage in its report",
                )
            with feedback.step("pricing the workload, writing the report", part="pricing and report"):
                report = write_analytic_report(art, config)
        except UserError as exc:
            art.finish(artifacts.FAILED, str(exc))
            raise
        art.finish(artifacts.COMPLETE)
        feedback.summary(f"analytic-report {run_dir.name}: complete", [], str(report), feedback.budget())

    run_guarded(job, run_dir=run_dir, cfg=cfg)


def main() -> None:
    """Console script entry point."""
    launch(_main, "analytic", "analytic-report")


#: The console script (pyproject.toml) and `python -m`: `main`, then the process ends without the module teardown.
console = ends_process(main)

if __name__ == "__main__":
    console()
