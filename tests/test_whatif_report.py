"""`whatif.md`, its plots, and the Stage 1 recommendations that cite a what-if run: rendered from hand-built
`WhatIfRecord`s (no model)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
from PIL import Image

from helpers import FIXTURES, run_main
from llm_perf_opt.artifacts import ArtifactsManager
from llm_perf_opt.config_data import command_config, whatif_nodes
from llm_perf_opt.measure.advice import advise
from llm_perf_opt.pipeline.stage1_render import render
from llm_perf_opt.pipeline.whatif_rungs import RungJob, RungOutcome
from llm_perf_opt.records.folders import WHATIF_FILE, load_stage1_metrics
from llm_perf_opt.records.stage1 import Stage1Metrics
from llm_perf_opt.records.whatif import ALONE, FAILED, MEASURED, Rung, RungFigures, WhatIfRecord
from llm_perf_opt.report.recommendations import DECODE_LEVERS, measured_lever_lines
from llm_perf_opt.report.whatif_plots import waterfall_steps, write_whatif_plots
from llm_perf_opt.report.whatif_report import ranked_rungs, whatif_md, write_all
from whatif_fixtures import (
    BATCH,
    copy_stage1_run,
    figures,
    identical,
    minimal,
    realistic,
    speedup,
    whatif_tree,
)

H100_METRICS = FIXTURES / "metrics" / "h100_full_stage1.json"


def _rows(text: str, first_cell: str) -> list[list[str]]:
    """The cells of every Markdown table row of `text` whose first cell is `first_cell`."""
    rows = [
        [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip("|"))]
        for line in text.splitlines()
        if line.startswith("|")
    ]
    return [r for r in rows if r[0] == first_cell]


def _section(text: str, title: str) -> str:
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


# --------------------------------------------------------------------------------------------- whatif.md


def test_the_verdict_paragraph_gives_the_best_rung_its_interval_and_outputs() -> None:
    verdict = _section(whatif_md(realistic()), "Verdict")
    assert "Best: **ladder 2: static_cache + cuda_graphs** (static_cache + cuda_graphs)" in verdict
    assert "24.80 ms/token at baseline → 1.57 ms/token, 15.80× the baseline" in verdict
    assert "95% interval 15.32–16.27×; beyond noise" in verdict
    assert "identical for 32 tokens (1 input); logits max |Δ| 0.0312" in verdict
    assert "Measured on this GPU (NVIDIA H100 80GB HBM3)" in verdict


def test_the_ranked_table_orders_baseline_ladder_levers_then_the_rungs_that_did_not_run() -> None:
    record = realistic()
    assert [r.name for r in ranked_rungs(record)] == [
        "baseline",
        "ladder 1: static_cache",
        "ladder 2: static_cache + cuda_graphs",
        "static_cache",
        "mode_base",  # 1.07× (a workload change still ranks by its speed-up)
        "grouped_mm",
        "cuda_graphs",
        "flash_attention_3",
        "batch_16",
    ]
    text = _section(whatif_md(record), "Rungs, ranked")
    (base,) = _rows(text, "baseline")
    assert base[3:8] == ["180.0", "24.80", "1.03", "1.00× (reference)", "reference"]
    assert base[8:] == ["912", "38%", "reference", "7.10 GiB", "no compilation; 2 warm-up passes", "95 s", "—"]
    (best,) = _rows(text, "**ladder 2: static_cache + cuda_graphs**")
    assert best[4] == "1.57" and best[6] == "15.80× (95% CI 15.32–16.27×)" and best[7] == "beyond noise"
    assert best[8:10] == ["6", "97%"] and best[12] == "compile 41.0 s; 2 warm-up passes"
    (reused,) = _rows(text, "ladder 1: static_cache")
    assert reused[-2] == "not rerun (= static_cache)"
    (workload,) = _rows(text, "mode_base")
    assert "**changes the workload**" in workload[2] and workload[10] == "depart at token 3 of 32 (1 input)"
    (grouped,) = _rows(text, "grouped_mm")
    assert grouped[7] == "within noise"
    assert _rows(text, "batch_16")[0][3].startswith("failed: CUDA out of memory: tried to allocate 12.00 GiB")
    assert _rows(text, "cuda_graphs")[0][3] == "invalid: runtime.compile=decode needs runtime.kv_cache=static"
    assert _rows(text, "flash_attention_3")[0][3].startswith("skipped: needs the flash_attn_interface package")
    assert "aggregate decode tokens/s" not in text  # batch 1 everywhere


def test_a_batched_rung_adds_the_aggregate_throughput_column() -> None:
    record = realistic()
    batched = Rung(
        "batch_16",
        ALONE,
        ("batch_16",),
        BATCH.overrides,
        False,
        MEASURED,
        figures=figures(30.0, kernels=920, busy=0.6, batch_size=16),
        speedup=speedup(24.8, 30.0),
        outputs=identical(),
    )
    record = attrs.evolve(record, rungs=tuple(batched if r.name == "batch_16" else r for r in record.rungs))
    text = whatif_md(record)
    header = next(line for line in text.splitlines() if line.startswith("|rung|phase|"))
    assert "|aggregate decode tokens/s|" in header
    assert _rows(text, "batch_16")[0][6] == "533"  # 16 × 1000 / 30 ms
    assert _rows(text, "baseline")[0][6] == "40"


def test_the_attribution_splits_each_change_into_idle_and_busy() -> None:
    text = _section(whatif_md(realistic()), "Where each gain came from (decode, per step)")
    (ladder,) = _rows(text, "ladder 2: static_cache + cuda_graphs")
    assert ladder[1:8] == ["ladder 1: static_cache", "−16.93", "−9.20", "−7.73", "−899", "0 FLOP", "0 B"]
    assert ladder[8] == "fewer launches: 905 → 6 kernels/step; GPU idle −9.2 ms/step"
    (mode,) = _rows(text, "mode_base")
    assert mode[6:8] == ["−1.1 GFLOP", "−190.73 MiB"]
    assert _rows(text, "grouped_mm")[0][3] == "+0.10"


def test_the_floor_table_goes_from_speed_of_light_to_wall_and_says_what_was_removed() -> None:
    text = _section(whatif_md(realistic()), "Distance to the floor")
    rows = _rows(text, "decode/step")
    assert rows[0][1:] == ["baseline", "0.95", "9.10", "9.42", "24.80", "4%", "37%", "38%"]
    assert rows[1][1:] == ["ladder 2: static_cache + cuda_graphs", "0.95", "1.41", "1.52", "1.57", "61%", "90%", "97%"]
    assert rows[2][1:6] == ["change (best − baseline)", "0.00", "−7.69", "−7.90", "−23.23 (−94%)"]
    assert len(_rows(text, "prefill")) == 3


def test_the_verdicts_list_what_helped_what_did_not_and_what_could_not_run() -> None:
    text = whatif_md(realistic())
    helped, rest = _section(text, "Verdicts").split("### Did not help", 1)
    assert "static_cache: 1.34× (beyond noise)" in helped and "grouped_mm" not in helped
    assert "grouped_mm: 1.01× (within noise)" in rest
    assert "batch_16 (alone) failed: CUDA out of memory" in rest
    assert "flash_attention_3 skipped: flash_attn_interface is not installed." in _section(text, "Notes")


def test_a_run_where_nothing_helped_says_so_with_na_where_nothing_was_measured() -> None:
    text = whatif_md(minimal())
    assert "No rung beat the baseline (40.00 ms/token) with its outputs checked" in text
    assert "Measured on this CPU (AMD EPYC)" in text and "GPU" not in _section(text, "Verdict")
    (lever,) = _rows(_section(text, "Rungs, ranked"), "static_cache")
    assert lever[6:12] == [
        "0.99× (95% CI 0.96–1.02×)",
        "within noise",
        "n/a",
        "n/a",
        "identical for 4 tokens (1 input)",
        "n/a",
    ]
    assert _rows(text, "cuda_graphs")[0][3] == "skipped: needs a CUDA device; this run is on the CPU"
    assert "n/a: the baseline recorded no per-stage floors" in text


def test_a_failed_baseline_is_the_verdict() -> None:
    record = minimal()
    base = attrs.evolve(record.rungs[0], state=FAILED, figures=None, reason="model build failed: no such checkpoint")
    text = whatif_md(attrs.evolve(record, rungs=(base, *record.rungs[1:])))
    assert "The baseline was not measured: model build failed: no such checkpoint." in text
    assert _rows(text, "baseline")[0][3] == "failed: model build failed: no such checkpoint"


# --------------------------------------------------------------------------------------------- plots


def test_write_all_writes_the_report_and_both_plots(tmp_path: Path) -> None:
    art = ArtifactsManager(tmp_path, stage="whatif")
    write_all(art, realistic())
    text = (tmp_path / "whatif.md").read_text()
    for name in ("waterfall", "floor"):
        png = tmp_path / "plots" / f"{name}.png"
        with Image.open(png) as image:
            assert image.format == "PNG" and image.width > 600 and image.height > 300
        assert f"](plots/{name}.png)" in text
    assert {"plots/waterfall.png", "plots/floor.png", "whatif.md"} <= set(art.written)


def test_whatif_md_links_only_the_rung_folders_that_hold_a_report(tmp_path: Path) -> None:
    """A what-if folder copied without most of its rungs (the shipped examples): whatif.md lists the rung folders
    that are there, and no Files entry it did not find."""
    (tmp_path / "rungs" / "00-baseline").mkdir(parents=True)
    (tmp_path / "rungs" / "00-baseline" / "report.md").write_text("# baseline\n")
    (tmp_path / "rungs" / "01-static_cache").mkdir()  # a rung folder without its report
    art = ArtifactsManager(tmp_path, stage="whatif")
    art.written.extend([WHATIF_FILE, "config.yaml"])  # neither is in the folder
    write_all(art, realistic())
    text = (tmp_path / "whatif.md").read_text()
    assert _section(text, "Rung folders").strip() == "- baseline: [rungs/00-baseline](rungs/00-baseline/report.md)"
    assert "config.yaml" not in text and f"[{WHATIF_FILE}]" not in text and "[whatif.md](whatif.md)" in text
    assert "## Rung folders" not in whatif_md(realistic(), rung_folders=())


def test_the_waterfall_runs_from_the_baseline_along_the_ladder_to_the_best() -> None:
    record = realistic()
    assert [r.name for r in waterfall_steps(record)] == [
        "baseline",
        "ladder 1: static_cache",
        "ladder 2: static_cache + cuda_graphs",
    ]
    alone_best = attrs.evolve(record, best="static_cache")
    assert [r.name for r in waterfall_steps(alone_best)] == ["baseline", "static_cache"]
    floor = _section(whatif_md(alone_best), "Distance to the floor")
    assert "The best rung (static_cache) recorded no floors" in floor and len(_rows(floor, "decode/step")) == 1


def test_no_plot_without_a_best_rung_or_floors(tmp_path: Path) -> None:
    assert write_whatif_plots(minimal(), tmp_path) == {}
    assert not (tmp_path / "plots").exists()


# --------------------------------------------------------------------------------------------- recommendations


def _h100(record: WhatIfRecord) -> Stage1Metrics:
    m = load_stage1_metrics(H100_METRICS)
    return attrs.evolve(m, model=attrs.evolve(m.model, name=record.model))


def _cited(m: Stage1Metrics, record: WhatIfRecord) -> list[str]:
    """What "What to try" quotes of the what-if run, before its table."""
    return measured_lever_lines(record, m.device.name, m.model.name)


def test_what_to_try_quotes_the_measured_gain_first_and_what_did_not_help() -> None:
    record = realistic()
    recs = _cited(_h100(record), record)
    assert recs[0].startswith(
        "Measured on this GPU (NVIDIA H100 80GB HBM3) by what-if run `20250101-120000-abcdef` (preset decode): "
        "static_cache + cuda_graphs cut decode ms/token (p50) from 24.80 to 1.57 ms/token (15.8×, beyond noise); "
        "outputs identical for 32 tokens."
    )
    assert "`runtime.kv_cache=static runtime.compile=decode runtime.compile_mode=reduce-overhead`" in recs[0]
    not_helped = next(r for r in recs if r.startswith("Did not help (measured):"))
    assert "grouped_mm: 1.01× (within noise)" in not_helped and "mode_base" in not_helped
    assert any(r.startswith("Not measured in the what-if run:") and "batch_16 failed" in r for r in recs)
    # the advice leaves out the levers the record measured (the cache and compile keys) but keeps batching,
    # whose rung failed; without the record, the CUDA graphs lever is advised too
    kinds = {a.kind for a in advise(_h100(record), record)}
    assert "batch" in kinds and "cuda_graphs" not in kinds
    assert "cuda_graphs" in {a.kind for a in advise(_h100(record))}


def test_generic_advice_whose_levers_were_all_measured_gives_way() -> None:
    record = realistic()
    batch = Rung(
        "batch_16", ALONE, ("batch_16",), BATCH.overrides, False, MEASURED, figures=figures(30.0, kernels=1, busy=1)
    )
    record = attrs.evolve(record, rungs=tuple(batch if r.name == "batch_16" else r for r in record.rungs))
    assert {"runtime.kv_cache", "runtime.compile", "run.batch_size"} == DECODE_LEVERS
    keys = {o.split("=", 1)[0] for a in advise(_h100(record), record) for o in a.overrides}
    assert not keys & DECODE_LEVERS and "model.experts_implementation" not in keys


def test_a_whatif_run_of_another_device_or_model_says_so() -> None:
    record = realistic()
    m = load_stage1_metrics(H100_METRICS)
    line = _cited(attrs.evolve(m, device=attrs.evolve(m.device, name="NVIDIA A100")), record)[0]
    assert line.startswith("Measured on NVIDIA H100 80GB HBM3 (not this run's NVIDIA A100)")
    assert "model deepseek_ocr, not this run's deepseek_ocr2" in line


def test_a_whatif_run_where_nothing_helped_is_cited_as_such() -> None:
    record = minimal()
    m = load_stage1_metrics(H100_METRICS)
    recs = _cited(attrs.evolve(m, device=attrs.evolve(m.device, name="AMD EPYC")), record)
    assert "no lever beat the baseline's 40.00 ms/token (decode ms/token (p50)) with its outputs checked" in recs[0]
    assert recs[1] == "Did not help (measured): static_cache: 0.99× (within noise)."


# --------------------------------------------------------------------------------------------- wiring


def _what_to_try(folder: Path) -> str:
    return _section((folder / "report.md").read_text(), "What to try")


@pytest.mark.slow
def test_stage1_report_cites_the_whatif_folder_given(tmp_path: Path) -> None:
    folder = copy_stage1_run(tmp_path / "run")
    whatif_tree(tmp_path / "wi", realistic(), rungs=())
    # In this process: test_records_stage1 runs the real stage1-report process.
    done = run_main("llm_perf_opt.cli.stage1_report", str(folder), "--whatif", str(tmp_path / "wi"))
    assert done.returncode == 0, done.stderr
    cited = _what_to_try(folder)
    assert "static_cache + cuda_graphs cut decode ms/token (p50) from 24.80 to 1.57 ms/token" in cited
    assert "Did not help (measured): grouped_mm" in cited
    assert "by what-if run `20250101-120000-abcdef`" in (folder / "stakeholder_summary.md").read_text()
    missing = run_main("llm_perf_opt.cli.stage1_report", str(folder), "--whatif", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "holds no whatif.json" in missing.stderr


def test_a_stage1_folder_inside_a_whatif_folder_cites_it(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = whatif_tree(tmp_path / "wi") / "rungs" / "00-baseline"
    render(folder)
    assert "what-if run" not in _what_to_try(folder)  # no whatif.json yet: a rung cites nothing
    whatif_tree(tmp_path / "wi", realistic(), rungs=())  # the record arrives
    render(folder)
    assert "cut decode ms/token (p50) from 24.80 to 1.57 ms/token" in _what_to_try(folder)
    (tmp_path / "wi" / WHATIF_FILE).write_text("{damaged")
    render(folder)  # a damaged enclosing record is left out with a warning, the reports still render
    assert "what-if run" not in _what_to_try(folder)
    assert "do not cite the enclosing what-if run" in caplog.text


@pytest.mark.slow
def test_stage1_run_accepts_report_whatif_dir_and_refuses_a_bad_one_before_measuring(tmp_path: Path) -> None:
    from llm_perf_opt.override_keys import check_override_keys

    check_override_keys("stage1", ["report.whatif_dir=/somewhere"], command="stage1-run")
    done = run_main(
        "llm_perf_opt.cli.stage1",
        "model=deepseek_ocr_tiny",
        "device=cpu",
        f"report.whatif_dir={tmp_path / 'nowhere'}",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert done.returncode == 2 and "holds no whatif.json" in done.stderr
    assert not (tmp_path / "run" / "metrics.json").exists()


# --------------------------------------------------------------------------------------------- Stage 2


EXAMPLE_STAGE2 = Path(__file__).parents[1] / "examples" / "stage2-h100-tiny"


def test_stage2_recommendations_cite_the_whatif_run_and_drop_the_advice_it_measured() -> None:
    from llm_perf_opt.records.folders import load_stage2_metrics
    from llm_perf_opt.report.stage2_reports import stakeholder_md

    m = load_stage2_metrics(EXAMPLE_STAGE2 / "metrics.json")
    generic = "Batch-1 decode keeps the GPU busy only"
    assert generic in stakeholder_md(m)
    cited = stakeholder_md(m, realistic()).split("## Recommendations", 1)[1]
    assert cited.lstrip().startswith("- Measured on this GPU (NVIDIA H100 80GB HBM3) by what-if run")
    assert generic in cited  # its batching lever failed in the what-if run
    batch = Rung("batch_16", ALONE, ("batch_16",), BATCH.overrides, False, MEASURED)
    measured_all = attrs.evolve(realistic(), rungs=(*realistic().rungs, batch))
    assert generic not in stakeholder_md(m, measured_all)


def test_stage2_report_takes_whatif_and_stage2_keeps_it_from_the_workload(tmp_path: Path) -> None:
    from llm_perf_opt.pipeline.stage2 import forwarded_overrides

    assert forwarded_overrides(["model=deepseek_ocr", "report.whatif_dir=/w"]) == ["model=deepseek_ocr"]
    copy = tmp_path / "example"
    shutil.copytree(EXAMPLE_STAGE2, copy)
    whatif_tree(tmp_path / "wi", realistic(), rungs=())
    # In this process: test_stage2_pipeline runs the real stage2-report process.
    done = run_main("llm_perf_opt.cli.stage2_report", str(copy), "--whatif", str(tmp_path / "wi"))
    assert done.returncode == 0, done.stderr
    assert "by what-if run `20250101-120000-abcdef`" in (copy / "stakeholder_summary.md").read_text()
    assert (copy / "report.md").read_text() == (EXAMPLE_STAGE2 / "report.md").read_text()


# ---- rungs of too few passes: no lever called helped or best ----------------------------------------------------


def _single_pass(decode_ms: float) -> RungFigures:
    """A rung's figures from one timed pass (the CPU defaults: one image, run.repeats=1, run.warmup=0)."""
    from llm_perf_opt.measure.stats import summarize

    one = summarize([decode_ms], "ms/token")
    return attrs.evolve(figures(decode_ms, kernels=None, busy=None), objective=one, decode_ms_per_token=one)


def test_single_pass_rungs_name_no_best_and_no_helped_lever(tmp_path: Path) -> None:
    """The record perf-whatif builds on the CPU defaults (one pass per rung): before, the fastest single pass was
    "Best" and every faster lever "Helped"; now their ratios are reported as single measurements, not judged."""
    from llm_perf_opt.config_compose import compose_config
    from llm_perf_opt.measure import whatif as w
    from llm_perf_opt.pipeline.whatif import WhatIfRun
    from llm_perf_opt.records.whatif import BASELINE
    from whatif_fixtures import GROUPED, STATIC

    goal = w.objective("decode_ms_per_token")
    cfg = compose_config("whatif", "whatif.objective=decode_ms_per_token")
    run = WhatIfRun(command_config(cfg), tmp_path, "wi", workload=(), whatif=whatif_nodes(cfg))
    run.levers = (STATIC, GROUPED)
    base = _single_pass(32.0)
    run.rungs = {"baseline": Rung("baseline", BASELINE, (), (), False, MEASURED, figures=base)}
    for lever, ms in ((STATIC, 24.9), (GROUPED, 4.0)):
        run.rungs[lever.name] = Rung(
            lever.name,
            ALONE,
            (lever.name,),
            lever.overrides,
            False,
            MEASURED,
            figures=_single_pass(ms),
            speedup=w.speedup(goal, [32.0], [ms]),
            outputs=identical(tokens=8),
        )
    record = run._record()  # the analysis's record of the rungs as they ran
    assert record.best is None
    assert [(v.lever, v.helped, v.judged) for v in record.verdicts] == [
        ("static_cache", False, False),
        ("grouped_mm", False, False),
    ]
    assert record.verdicts[1].line.startswith(
        "grouped_mm: 8.00× on single passes, not judged (an interval needs ≥ 3 passes per side)"
    )
    md = whatif_md(record)
    verdict = _section(md, "Verdict")
    assert "Best:" not in verdict and "No lever is called helped or best" in verdict and "single passes" in verdict
    assert "### Helped" not in md and "### Did not help" not in md
    assert "### Not judged: too few passes" in md
    assert any("too few timed passes for an interval" in note for note in record.notes)
    cited = " ".join(_cited(load_stage1_metrics(H100_METRICS), record))
    assert "Not judged: the figures of static_cache, grouped_mm and of the baseline are single passes" in cited
    assert "no lever could be judged against the baseline's 32.00 ms (decode ms/token (p50))" in cited
    assert "Levers that helped" not in cited and "Did not help" not in cited and "no lever beat" not in cited


def test_rungs_with_different_warm_ups_are_noted(tmp_path: Path) -> None:
    from llm_perf_opt.config_compose import compose_config
    from llm_perf_opt.pipeline.whatif import WhatIfRun
    from llm_perf_opt.records.whatif import BASELINE

    cfg = compose_config("whatif")
    run = WhatIfRun(command_config(cfg), tmp_path, "wi", workload=(), whatif=whatif_nodes(cfg))
    cold = attrs.evolve(figures(32.0, kernels=None, busy=None), warmup_passes=0)
    warm = attrs.evolve(figures(30.0, kernels=None, busy=None), warmup_passes=1, compile_ms=51_600.0)
    run.rungs = {
        "baseline": Rung("baseline", BASELINE, (), (), False, MEASURED, figures=cold),
        "compiled_decode": Rung("compiled_decode", ALONE, ("compiled_decode",), (), False, MEASURED, figures=warm),
    }
    (note,) = [n for n in run._analysis().notes() if "warm-up" in n]
    assert note.startswith("The rungs ran different warm-up passes per input (baseline 0, compiled_decode 1)")


def _copied_rungs(
    jobs: list[RungJob],
    _devices: object,
    _limit: object,
    done: Callable[[RungOutcome], None],
    _forks: object = None,
    overlap: bool = False,
) -> dict[str, RungOutcome]:
    """Each rung a copy of a finished run folder, which renders its own reports as a rung does."""
    outcomes = {}
    for job in jobs:
        render(copy_stage1_run(job.folder))  # the rung's own reports, citing whatif.json as it is now
        outcomes[job.name] = RungOutcome(job.name, "complete", None, 1.0)
        done(outcomes[job.name])
    return outcomes


@pytest.fixture(scope="module")
def copied_live_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, WhatIfRecord]:
    """One live what-if run whose rungs are copies of a finished run folder, rendered as a rung renders itself (its
    folder and record), with a memory budget and a latency target; shared by the tests below, which only read it."""
    from llm_perf_opt.config_compose import compose_config
    from llm_perf_opt.pipeline import whatif as pipeline

    settings = (
        "whatif_run.exclude=[cuda_graphs]",
        "whatif.memory_budget_gib=40",
        "whatif.latency_target.ttlt_p90_ms=5000",
    )
    cfg = compose_config("whatif", "model=deepseek_ocr_tiny", "device=cpu", *settings)
    folder = tmp_path_factory.mktemp("copied-live") / "wi"
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(pipeline, "run_rungs", _copied_rungs)
        live = pipeline.WhatIfRun(
            command_config(cfg), folder, "wi", ("model=deepseek_ocr_tiny",), whatif=whatif_nodes(cfg)
        ).execute()
    return folder, live


def test_rung_reports_cite_the_whatif_run_as_it_ended(copied_live_run: tuple[Path, WhatIfRecord]) -> None:
    """Each rung writes its reports while later rungs are still pending; the what-if run rebuilds them when it ends."""
    folder, record = copied_live_run
    folders = {r.folder for r in record.rungs if r.folder}
    assert len(folders) == 6  # the baseline and five levers alone
    for rung_folder in folders:
        cited = _what_to_try(folder / str(rung_folder))
        assert "by what-if run `wi`" in cited
        assert "pending" not in cited and "not run yet" not in cited


def test_judging_a_saved_folder_again_gives_the_live_runs_record(
    copied_live_run: tuple[Path, WhatIfRecord], tmp_path: Path
) -> None:
    """A live run and `whatif_judge.rejudge` build the same `WhatIfAnalysis` from the same rung records, so judging
    a finished folder again writes the live run's record and report exactly; a setting given to the re-judge (a
    decode length) is judged anew."""
    from llm_perf_opt.pipeline.whatif_judge import rejudge
    from llm_perf_opt.records.folders import load_whatif

    live_folder, live = copied_live_run
    folder = tmp_path / "wi"
    shutil.copytree(live_folder, folder)  # judged again here; the shared folder stays as the live run left it
    assert any(r.judgements for r in live.rungs) and live.verdicts and live.goodput is not None
    report = (folder / "whatif.md").read_text()
    assert rejudge(folder) == live == load_whatif(folder)
    assert (folder / "whatif.md").read_text() == report
    longer = rejudge(folder, decode_tokens=256, source="--decode-tokens")
    assert longer.decode_tokens == 256 and longer.objective.label == "whole-page latency at 256 decode tokens (p50)"
    assert longer.rungs != live.rungs and longer.created == live.created
