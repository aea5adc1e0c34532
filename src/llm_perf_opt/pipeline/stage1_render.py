"""`stage1-report`: a Stage 1 folder's Markdown reports and plots rebuilt from its records alone (no model, no GPU,
no torch: the report and record layers import none)."""

from __future__ import annotations

from pathlib import Path

from llm_perf_opt.artifacts import ArtifactsManager
from llm_perf_opt.measure.advice import advise
from llm_perf_opt.records.folders import load_stage1, unfinished_text, whatif_for
from llm_perf_opt.records.stage1 import InputsManifest, Stage1Metrics
from llm_perf_opt.report import stage1_reports


def render(run_dir: Path, whatif: Path | str | None = None, *, images: bool = True) -> Path:
    """Rebuild a Stage 1 folder's Markdown reports and plots from its records (no model, no GPU); `whatif`: a
    perf-whatif folder whose measured levers "What to try" cites (default: the one the folder lies in, if any);
    `images`: False for the Markdown alone (no plots, no predictions gallery)."""
    folder = load_stage1(run_dir)
    evidence = whatif_for(folder.path, whatif)
    art = ArtifactsManager(folder.path, stage="stage1")
    art.written.extend(folder.status.files)
    stage1_reports.write_all(
        art,
        folder.metrics,
        inputs=folder.inputs or no_inputs(folder.metrics),
        operators=folder.operators,
        predictions=folder.predictions,
        advice=advise(folder.metrics, evidence),
        whatif=evidence,
        unfinished=unfinished_text(folder.status),
        images=images,
    )
    return art.run_dir


def no_inputs(m: Stage1Metrics) -> InputsManifest:
    """An inputs manifest for a folder written without inputs.yaml: only the timed inputs are known."""
    return InputsManifest(
        dataset_root="(not recorded)",
        subset_filelist=None,
        discovered=len(m.images),
        sampling="(not recorded)",
        seed=0,
        max_images=m.settings.max_images,
        count=len(m.images),
        kind=m.settings.input_kind,
        chosen_because=None,
        images=(),
        skipped=(),
    )
