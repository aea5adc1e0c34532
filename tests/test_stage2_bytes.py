"""Stage 2's bytes pass without a GPU: its launch windows from the H100 nsys trace, the capture with a stand-in ncu
(argv, records, a failure that does not stop the capture), and the render that sets measured bytes beside the
analytic ones in metrics.json and report.md (and says so when a folder has none)."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import attrs
import pytest

from helpers import stage2_run, stage2_settings
from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import plain
from llm_perf_opt.nsight import tools
from llm_perf_opt.nsight.ncu_bytes import BYTES_METRICS
from llm_perf_opt.nsight.ncu_report import DRAM_READ, DRAM_WRITE, DURATION, read_table
from llm_perf_opt.nsight.ncu_windows import BytesWindow
from llm_perf_opt.nsight.nsys_trace import NsysTrace
from llm_perf_opt.override_text import quoted_override
from llm_perf_opt.pipeline import stage2, stage2_tools
from llm_perf_opt.pipeline.stage2 import TARGETS_FILE, render
from llm_perf_opt.records.common import PeakFigure
from llm_perf_opt.records.folders import WORKLOAD_METRICS_FILE, load_capture, load_ncu_targets, load_stage1_metrics
from llm_perf_opt.records.io import save
from llm_perf_opt.records.stage1 import Stage1Metrics, StageEfficiency
from llm_perf_opt.records.stage2 import NcuBytesPass
from test_stage2_pipeline import FIXTURES, H100_STAGE1, _stage2_folder, compose_stage2, stage2_metrics

NCU = tools.Tool(name="ncu", path=Path("/opt/ncu"), version="2025.3.1")
RAW = {"bytes-prefill": "synthetic_bytes_prefill_raw.csv", "bytes-decode": "synthetic_bytes_decode_raw.csv"}
MB = 1e6
PEAK = PeakFigure(value=989.4e12, unit="FLOP/s", dtype_key="bf16", source="datasheet", device_name="H100")
BANDWIDTH = PeakFigure(value=3.35e12, unit="B/s", dtype_key=None, source="datasheet bw", device_name="H100")
# Analytic figures of one timed pass of one image decoding 3 steps (bytes, FLOPs), per Stage 1 efficiency row.
ANALYTIC = {
    "prefill": (30 * MB, 3.6e9),
    "vision/sam": (16 * MB, 2.0e9),
    "vision/encoder": (10 * MB, 1.0e9),
    "vision/projector": (1 * MB, 0.1e9),
    "decode": (3 * 31 * MB, 3 * 0.031e9),
}


def window_export() -> str:
    """One export of the whole profiler window: the synthetic prefill and decode exports in one table (ncu scales
    each export's units apart, so the values are written in base units: bytes and seconds)."""
    lines = ["\n".join(_table_rows(FIXTURES / "ncu" / RAW[name], header=i == 0)) for i, name in enumerate(RAW)]
    return "\n".join(lines) + "\n"


def _table_rows(path: Path, *, header: bool) -> list[str]:
    table, rows = read_table(path.read_text(), str(path))
    out = (
        [
            ",".join(f'"{c}"' for c in table.header),
            ",".join(
                '"second"' if c == DURATION else '"byte"' if c in (DRAM_READ, DRAM_WRITE) else '""'
                for c in table.header
            ),
        ]
        if header
        else []
    )
    for row in rows:
        cells = [repr(table.value(row, c)) if c in BYTES_METRICS else row[table.index[c]] for c in table.header]
        out.append(",".join('"' + cell.replace('"', '""') + '"' for cell in cells))
    return out


def stand_in_ncu(exit_code: int = 0):  # type: ignore[no-untyped-def]
    """A run_tool that acts as ncu: the profile run writes a report, the import run the synthetic export (the
    bytes pass: both stages in one)."""

    def run(argv: list[str], *, timeout_s: float, log_path: Path) -> tools.ToolRun:
        folder = log_path.parent.name
        if "--import" in argv and folder == "bytes":
            log_path.write_text(window_export())
        elif "--import" in argv:
            shutil.copy(FIXTURES / "ncu" / RAW.get(folder, "h100_tiny_decode_raw.csv"), log_path)
        else:
            log_path.write_text("ncu log\n")
            if exit_code == 0:
                (log_path.parent / "report.ncu-rep").write_bytes(b"ncu report")
        return tools.ToolRun(argv=tuple(argv), returncode=exit_code, seconds=0.1, log_path=log_path, timed_out=False)

    return run


def one_pass_workload(base: Stage1Metrics) -> Stage1Metrics:
    """One timed pass of the first image with 3 decode steps, with the ANALYTIC figures."""
    record = attrs.evolve(base.records[0], decode_step_ms=(20.0, 21.0, 22.0))
    blank = dict.fromkeys(("ridge_point", "bound", "mfu", "mbu", "speed_of_light_ms", "gap"))
    efficiency = tuple(
        StageEfficiency(
            stage=stage,
            time_ms=1.0,
            flops=flops,
            bytes=moved,
            arithmetic_intensity=flops / moved,
            flops_source="counted",
            **blank,
        )
        for stage, (moved, flops) in ANALYTIC.items()
    )
    return attrs.evolve(base, records=(record,), efficiency=efficiency)


def bytes_folder(root: Path, *, own_workload: bool = True) -> Path:
    """The H100 Stage 2 folder with both bytes passes done (the synthetic exports), and the workload metrics."""
    folder = _stage2_folder(root)
    base = load_stage1_metrics(H100_STAGE1)
    nsys_workload = attrs.evolve(
        base, mfu=tuple(attrs.evolve(r, peak=PEAK) for r in base.mfu), bandwidth_peak=BANDWIDTH
    )
    save(nsys_workload, folder / WORKLOAD_METRICS_FILE)
    passes = []
    for stage, instance, skip, count in (
        ("prefill", "the prefill of the first image", 0, 16),
        ("decode", "decode step 2 of 3", 4, 4),
    ):
        name = f"bytes-{stage}"
        (folder / "ncu" / name).mkdir(parents=True)
        shutil.copy(FIXTURES / "ncu" / RAW[name], folder / "ncu" / name / "raw.csv")
        if own_workload:
            save(one_pass_workload(nsys_workload), folder / "workload" / f"ncu-{name}" / "metrics.json")
        passes.append(
            NcuBytesPass(
                stage=stage,
                instance=instance,
                folder=f"ncu/{name}",
                workload=f"workload/ncu-{name}",
                launch_skip=skip,
                launch_count=count,
                expected_kernels=count if stage == "decode" else 8,
                cache_control="none",
            )
        )
    targets = load_ncu_targets(folder)
    assert targets is not None
    save(attrs.evolve(targets, bytes_passes=tuple(passes)), folder / TARGETS_FILE)
    return folder


# ---- the launch windows --------------------------------------------------------------------------------------


def test_nsys_counts_the_kernels_of_each_instance() -> None:
    with NsysTrace(FIXTURES / "nsys" / "h100_tiny.sqlite.gz") as trace:
        assert trace.instance_kernels("prefill") == [683, 683]
        assert trace.instance_kernels("vision/sam") == [67, 73, 67, 73]  # the global view, then the tiles
        assert trace.instance_kernels("decode/step") == [217] * 6
        assert trace.instance_kernels("no such range") == []


def test_bytes_windows_name_the_first_prefill_and_the_middle_decode_step(tmp_path: Path) -> None:
    folder = _stage2_folder(tmp_path)
    run = stage2_run(compose_stage2(), folder, run_id="x", task_overrides=[])
    assert run.ncu.bytes_window("prefill") == BytesWindow("the prefill of the first image", 683)
    # 4 new tokens: 3 steps, the middle one is the second
    assert run.ncu.bytes_window("decode") == BytesWindow("decode step 2 of 3", 217)
    longer = stage2_run(compose_stage2("stage2.ncu_workload.max_new_tokens=21"), folder, "x", [])
    assert longer.ncu.bytes_window("decode") == BytesWindow("decode step 10 of 20", 217)  # the mean
    none = stage2_run(compose_stage2("stage2.ncu_workload.max_new_tokens=1"), folder, "x", [])
    assert none.ncu.bytes_window("decode").expected == 0


def test_ncu_workloads_run_one_timed_pass(tmp_path: Path) -> None:
    cfg = compose_stage2()
    argv = stage2.workload_argv(
        stage2_settings(cfg), ["run.repeats=5", "run.warmup=0"], tmp_path, name="ncu-bytes-prefill", ncu=True
    )
    assert argv.index("run.repeats=1") > argv.index("run.repeats=5")  # the ncu workload's own value wins
    assert "run.warmup=0" in argv and "run.warmup=1" not in argv
    assert "dataset.max_images=1" in argv and "infer.max_new_tokens=4" in argv
    assert "run.profiler_window=true" in argv  # ncu --profile-from-start off: the workload opens the window
    nsys = stage2.workload_argv(stage2_settings(cfg), ["run.repeats=5"], tmp_path, name="nsys")
    assert "run.repeats=5" in nsys and "run.repeats=1" not in nsys


# ---- the capture ---------------------------------------------------------------------------------------------


def test_bytes_pass_with_a_stand_in_ncu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stage2_tools, "run_tool", stand_in_ncu())
    folder = _stage2_folder(tmp_path)
    (folder / TARGETS_FILE).unlink()
    cfg = compose_stage2("pipeline.ncu.bytes_pass=true")  # light mode runs none of its own
    run = stage2_run(cfg, folder, run_id="fixture", task_overrides=["model=deepseek_ocr2_tiny"])
    run.ncu.run(NCU)
    targets = load_ncu_targets(folder)
    assert targets is not None
    prefill, decode = targets.bytes_passes  # one process, one export, a record per stage
    assert (prefill.stage, prefill.folder, decode.folder) == ("prefill", "ncu/bytes", "ncu/bytes")
    assert prefill.workload == decode.workload == "workload/ncu-bytes"
    assert (prefill.instance, prefill.expected_kernels) == ("the prefill of the first image", 683)
    assert (decode.instance, decode.expected_kernels) == ("decode step 2 of 3", 217)
    assert prefill.profiler_window and decode.profiler_window and (prefill.launch_skip, prefill.launch_count) == (0, 0)
    assert prefill.cache_control == "none" and prefill.note is None and decode.note is None
    assert (folder / "ncu" / "bytes" / "raw.csv").read_text() == window_export()
    cmd = (folder / "ncu" / "bytes" / "cmd.txt").read_text()
    assert "--cache-control none --profile-from-start off" in cmd and " -k " not in cmd and "--launch-" not in cmd
    assert "--nvtx --metrics" in cmd and "--nvtx-include" not in cmd and "--section" not in cmd
    assert "model=deepseek_ocr2_tiny" in cmd and "run.repeats=1" in cmd and "run.profiler_window=true" in cmd
    assert shlex.quote(quoted_override("hydra.run.dir", folder / "workload" / "ncu-bytes")) in cmd
    assert list(run.tools.capture.runs) == ["ncu_targets", "ncu_bytes"]  # two Nsight Compute processes in all


def test_the_window_export_gives_the_rows_of_one_export_per_stage(tmp_path: Path) -> None:
    """Folders before 2026-11-26 hold one bytes export per stage; the profiler window one for both: same rows."""
    apart = stage2_metrics(render(bytes_folder(tmp_path / "apart"))).measured_bytes
    together = bytes_folder(tmp_path / "together")
    (together / "ncu" / "bytes").mkdir()
    (together / "ncu" / "bytes" / "raw.csv").write_text(window_export())
    targets = load_ncu_targets(together)
    assert targets is not None
    passes = tuple(
        attrs.evolve(p, folder="ncu/bytes", profiler_window=True, launch_skip=0, launch_count=0)
        for p in targets.bytes_passes
    )
    save(attrs.evolve(targets, bytes_passes=passes), together / TARGETS_FILE)
    shutil.rmtree(together / "ncu" / "bytes-prefill")
    shutil.rmtree(together / "ncu" / "bytes-decode")
    joined = stage2_metrics(render(together)).measured_bytes
    assert apart is not None and joined is not None and len(apart.rows) == 5
    for old, new in zip(apart.rows, joined.rows, strict=True):
        assert (new.stage, new.kernels, new.top_kernels) == (old.stage, old.kernels, old.top_kernels)
        assert new.measured_bytes == pytest.approx(old.measured_bytes)
        assert new.kernel_ms == pytest.approx(old.kernel_ms)


def test_a_failed_bytes_pass_is_recorded_and_the_capture_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stage2_tools, "run_tool", stand_in_ncu(exit_code=1))
    folder = _stage2_folder(tmp_path)
    run = stage2_run(compose_stage2(), folder, run_id="fixture", task_overrides=[])
    done = run.ncu.bytes_pass(NCU, ["prefill", "decode"])
    assert [p.note for p in done] == ["ncu exited with code 1 (see ncu/bytes/profile.log)"] * 2
    assert run.tools.capture.runs["ncu_bytes"].returncode == 1
    targets = load_ncu_targets(folder)
    assert targets is not None
    save(attrs.evolve(targets, bytes_passes=done), folder / TARGETS_FILE)
    metrics = stage2_metrics(render(folder))
    assert metrics.measured_bytes is not None and metrics.measured_bytes.rows == ()
    assert "No measured bytes for the prefill of the first image: ncu exited with code 1" in " ".join(metrics.warnings)
    assert "The bytes pass gave no figures" in (folder / "report.md").read_text()


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ((), False),  # light: nsys and the targeted kernels only
        (("stage2.mode=deep",), True),
        (("pipeline.ncu.bytes_pass=true",), True),
        (("stage2.mode=deep", "pipeline.ncu.bytes_pass=false"), False),
    ],
)
def test_the_mode_chooses_the_bytes_pass_unless_set(overrides: tuple[str, ...], expected: bool, tmp_path: Path) -> None:
    assert stage2_run(compose_stage2(*overrides), tmp_path, "x", []).settings.ncu.bytes_pass is expected


def test_a_bad_bytes_pass_setting_is_refused() -> None:
    """Typed (config_schema.NcuSchema): refused on the command line, in one paragraph, before anything composes."""
    from llm_perf_opt.errors import UserError
    from llm_perf_opt.override_keys import check_override_keys

    with pytest.raises(UserError, match=r"pipeline\.ncu\.bytes_pass=sometimes is not true or false"):
        check_override_keys("stage2", ["pipeline.ncu.bytes_pass=sometimes"], command="stage2-profile")


def test_light_mode_runs_no_bytes_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stage2_tools, "run_tool", stand_in_ncu())
    folder = _stage2_folder(tmp_path)
    cfg = compose_stage2()
    run = stage2_run(cfg, folder, run_id="fixture", task_overrides=[])
    run.ncu.run(NCU)
    targets = load_ncu_targets(folder)
    assert targets is not None and targets.bytes_passes == ()
    assert not any(k.startswith("ncu_bytes") for k in run.tools.capture.runs)
    run.tools.save()
    assert load_capture(folder).runs.keys() == run.tools.capture.runs.keys()


# ---- the render ----------------------------------------------------------------------------------------------


def test_render_sets_measured_bytes_beside_the_analytic_ones(tmp_path: Path) -> None:
    folder = render(bytes_folder(tmp_path))
    measured = stage2_metrics(folder).measured_bytes
    assert measured is not None and measured.cache_control == "none" and measured.l2_cache_bytes == 52428800
    assert measured.bandwidth_peak == BANDWIDTH and measured.ridge_point == pytest.approx(989.4 / 3.35)
    rows = {r.stage: r for r in measured.rows}
    assert list(rows) == ["prefill", "vision/sam", "vision/encoder", "vision/projector", "decode/step"]
    assert rows["prefill"].ratio == pytest.approx(1.2) and rows["vision/sam"].ratio == pytest.approx(22 / 16)
    assert rows["vision/encoder"].ratio == pytest.approx(0.5) and rows["vision/projector"].ratio == pytest.approx(1.0)
    step = rows["decode/step"]
    assert step.analytic_bytes == pytest.approx(31 * MB) and step.measured_bytes == pytest.approx(31 * MB)
    assert step.flops == pytest.approx(0.031e9) and step.measured_intensity == pytest.approx(1.0)
    assert all(r.measured_bytes > 0 and r.kernels > 0 for r in measured.rows)
    source = rows["prefill"].analytic_source
    assert source is not None and "workload/ncu-bytes-prefill/metrics.json: page_landscape.png, 1 timed pass" in source
    assert rows["vision/encoder"].why is not None and "fits in the 50 MiB L2" in rows["vision/encoder"].why
    assert rows["vision/projector"].why is None and step.why is None

    report = (folder / "report.md").read_text()
    assert "## Measured DRAM bytes per stage instance (Nsight Compute)" in report
    assert "|measured bytes|analytic bytes|measured / analytic|" in report
    assert (
        "|prefill|the prefill of the first image|8|0.30|23.37 MiB|10.97 MiB|34.33 MiB|28.61 MiB|1.20×|100.0 / 120.0|"
        "memory / memory|3.58% / 2.99%|"
    ) in report
    assert "|decode/step|decode step 2 of 3|4|0.10|" in report
    assert "`--cache-control none`" in report and "295 FLOP/byte" in report
    assert "- vision/encoder (0.50×): DRAM counters see only L2 misses" in report
    assert "- vision/sam (1.38×): traffic the analytic model does not count" in report
    assert "- vision/sam: `nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN` 9.54 MiB (45%, 1 launch)" in report
    assert (
        "Measured DRAM bytes (Nsight Compute, one instance each) against the analytic count: prefill 1.20×, "
        "vision/sam 1.38×, vision/encoder 0.50×, vision/projector 1.00×, decode/step 1.00×."
    ) in report
    assert "Commands: each tool folder's `cmd.txt` (listed below)" in report
    assert "against the analytic count" in (folder / "stakeholder_summary.md").read_text()


def test_render_falls_back_to_the_nsys_workload_averages(tmp_path: Path) -> None:
    measured = stage2_metrics(render(bytes_folder(tmp_path, own_workload=False))).measured_bytes
    assert measured is not None
    prefill = next(r for r in measured.rows if r.stage == "prefill")
    h100 = load_stage1_metrics(H100_STAGE1)
    efficiency = h100.efficiency_of("prefill")
    assert efficiency is not None and prefill.analytic_bytes == pytest.approx(efficiency.bytes / 25)
    source = prefill.analytic_source
    assert source is not None and "averaged over its 25 timed passes of 5 image(s)" in source


def test_a_folder_without_a_bytes_pass_says_it_was_not_collected(tmp_path: Path) -> None:
    folder = render(_stage2_folder(tmp_path))
    assert stage2_metrics(folder).measured_bytes is None
    report = (folder / "report.md").read_text()
    assert "## Measured DRAM bytes per stage instance (Nsight Compute)\n\n\nNot collected" in report
    assert "against the analytic count" not in report


def test_render_prices_the_analytic_bytes_with_the_current_model(tmp_path: Path) -> None:
    """With the profiled workload's config.yaml, the analytic bytes are the current analytic model's for the inputs
    the workload ran (here: full-size OCR-2, 6 tiles, bf16), not the figures its Stage 1 metrics stored; the
    counted FLOPs stay Stage 1's."""
    from omegaconf import OmegaConf

    from llm_perf_opt.analytic import ModelSpec, Workload, stage_costs
    from llm_perf_opt.records.vocabulary import DECODE

    folder = bytes_folder(tmp_path)
    cfg = compose_config("stage1", "model=deepseek_ocr2")
    for name in ("bytes-prefill", "bytes-decode"):
        (folder / "workload" / f"ncu-{name}" / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    measured = stage2_metrics(render(folder)).measured_bytes
    assert measured is not None
    rows = {r.stage: r for r in measured.rows}
    record = load_stage1_metrics(H100_STAGE1).records[0]
    work = Workload(
        global_size=1024,
        tile_size=768,
        tiles=record.tiles,
        text_tokens=record.prompt_tokens - 1 - record.image_tokens,
        new_tokens=record.new_tokens,
        dtype_bytes=2,
    )
    costs = stage_costs(ModelSpec.from_architecture(plain(cfg.model.architecture)), work)
    for stage in ("prefill", "vision/sam", "vision/encoder", "vision/projector"):
        assert rows[stage].analytic_bytes == pytest.approx(costs[stage].bytes), stage
        assert rows[stage].flops == pytest.approx(ANALYTIC[stage][1]), stage
    assert rows["decode/step"].analytic_bytes == pytest.approx(costs[DECODE].bytes / 3)  # the pass's 3 steps
    source = rows["vision/sam"].analytic_source
    assert source is not None and source.startswith("the analytic model priced on the inputs of the profiled")
    assert "workload/ncu-bytes-prefill/config.yaml and metrics.json" in source


def test_mbu_on_busy_time_uses_the_current_model_when_the_nsys_workload_has_its_config(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    from llm_perf_opt.analytic import ModelSpec, Workload, stage_costs

    folder = bytes_folder(tmp_path)
    before = {r.stage: r.bytes for r in stage2_metrics(render(folder)).stages}
    cfg = compose_config("stage1", "model=deepseek_ocr2")
    (folder / WORKLOAD_METRICS_FILE).with_name("config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    after = {r.stage: r for r in stage2_metrics(render(folder)).stages}
    spec = ModelSpec.from_architecture(plain(cfg.model.architecture))
    records = load_stage1_metrics(H100_STAGE1).records
    sam = sum(
        stage_costs(
            spec,
            Workload(
                tiles=r.tiles,
                text_tokens=r.prompt_tokens - 1 - r.image_tokens,
                new_tokens=r.new_tokens,
                dtype_bytes=2,
            ),
        )["vision/sam"].bytes
        for r in records
    )
    row = after["vision/sam"]
    assert row.bytes == pytest.approx(sam) and row.bytes != pytest.approx(before["vision/sam"])
    assert row.mbu_on_busy_time is not None and row.mbu_on_busy_time > 0


def test_workload_configs_are_parsed_in_the_pipeline_and_handed_down_typed(tmp_path: Path) -> None:
    """render() reads each workload folder's config.yaml into a PricedModel: a model the analytic model does not
    price (hf) and a folder without a config are left out; a DeepSeek-OCR config without its architecture is a
    warning naming the file, and Stage 1's bytes stand."""
    from omegaconf import OmegaConf

    folder = bytes_folder(tmp_path)
    targets = load_ncu_targets(folder)
    cfg = compose_config("stage1", "model=deepseek_ocr2")
    broken = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(broken, dict)
    del broken["model"]["architecture"]
    (folder / "workload" / "ncu-bytes-prefill" / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    (folder / "workload" / "ncu-bytes-decode" / "config.yaml").write_text(OmegaConf.to_yaml(broken))
    (folder / WORKLOAD_METRICS_FILE).with_name("config.yaml").write_text("model: {adapter: hf, name: gpt2}\n")
    models = stage2.workload_models(folder, targets)
    assert set(models) == {"workload/ncu-bytes-prefill", "workload/ncu-bytes-decode"}
    priced = models["workload/ncu-bytes-prefill"].model
    assert priced is not None and (priced.name, priced.mode, priced.global_size, priced.tile_size) == (
        "deepseek_ocr2",
        None,
        1024,
        768,
    )
    unread = models["workload/ncu-bytes-decode"]
    assert unread.model is None and "architecture" in str(unread.problem)
    warnings = stage2_metrics(render(folder)).warnings
    unpriced = "workload/ncu-bytes-decode/config.yaml: the analytic model could not price"
    assert any(w.startswith(unpriced) for w in warnings)
