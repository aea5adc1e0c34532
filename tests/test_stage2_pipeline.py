"""Stage 2 without a GPU: override forwarding, workload command, and re-rendering from real H100 exports."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

import attrs
import pytest
from omegaconf import DictConfig

from helpers import run_cli, run_main, stage2_run, stage2_settings, unpack_nsys_fixture
from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.errors import UserError
from llm_perf_opt.override_text import quoted_override
from llm_perf_opt.pipeline.stage2 import (
    CAPTURE_FILE,
    TARGETS_FILE,
    forwarded_overrides,
    render,
    workload_argv,
)
from llm_perf_opt.records.common import SCHEMA_VERSION, PeakFigure
from llm_perf_opt.records.folders import (
    METRICS_FILE,
    WORKLOAD_METRICS_FILE,
    load_ncu_targets,
    load_stage1_metrics,
    load_stage2_metrics,
    read_status,
)
from llm_perf_opt.records.io import save
from llm_perf_opt.records.stage1 import Stage1Metrics
from llm_perf_opt.records.stage2 import Stage2Metrics

FIXTURES = Path(__file__).parent / "fixtures"
H100_STAGE1 = FIXTURES / "metrics" / "h100_full_stage1.json"


def compose_stage2(*overrides: str) -> DictConfig:
    return compose_config("stage2", *overrides)


def test_every_workload_override_is_forwarded() -> None:
    task = [
        "model=deepseek_ocr2_tiny",
        "model.dtype=float16",
        "model.preprocess.max_tiles=2",
        "infer.max_new_tokens=9",
        "dataset.root=/data",
        "dataset.subset_filelist=l.txt",
        "stage2.mode=deep",
        "pipeline.ncu.clock_control=base",
        "pipeline/nsys=default",
        "hydra.run.dir=/x",
        "+model.extra=1",
    ]
    assert forwarded_overrides(task) == [
        "model=deepseek_ocr2_tiny",
        "model.dtype=float16",
        "model.preprocess.max_tiles=2",
        "infer.max_new_tokens=9",
        "dataset.root=/data",
        "dataset.subset_filelist=l.txt",
        "+model.extra=1",
    ]


def test_workload_argv_adds_stage2_settings(tmp_path: Path) -> None:
    cfg = compose_stage2()
    argv = workload_argv(stage2_settings(cfg), ["model=deepseek_ocr2_tiny", "run.repeats=3"], tmp_path, name="nsys")
    assert argv[:3] == [sys.executable, "-m", "llm_perf_opt.cli.stage1"]
    assert "model=deepseek_ocr2_tiny" in argv
    assert "pipeline.torch_profiler.enable=false" in argv
    assert "run.repeats=3" in argv and "run.repeats=1" not in argv  # the user's value wins
    assert "run.warmup=1" in argv
    assert argv[-1] == quoted_override("hydra.run.dir", tmp_path / "workload" / "nsys")
    ncu = workload_argv(stage2_settings(cfg), ["infer.max_new_tokens=32"], tmp_path, name="ncu-decode", ncu=True)
    assert "dataset.max_images=1" in ncu and ncu.index("infer.max_new_tokens=4") > ncu.index("infer.max_new_tokens=32")


def test_stage2_config_composes_with_stage1_keys() -> None:
    cfg = compose_stage2("stage2.mode=deep")
    assert cfg.model.name == "deepseek_ocr"  # the default model
    assert cfg.stage2.modes[cfg.stage2.mode].top_kernels == 20
    assert list(cfg.pipeline.nsys.trace) == ["cuda", "nvtx", "osrt"]
    assert cfg.pipeline.ncu.clock_control == "none"


def _stage2_folder(root: Path) -> Path:
    """A Stage 2 folder assembled from the H100 fixtures (as stage2-profile leaves it)."""
    folder = root / "run"
    unpack_nsys_fixture(folder)
    (folder / "ncu" / "decode").mkdir(parents=True)
    shutil.copy(FIXTURES / "ncu" / "h100_tiny_decode_raw.csv", folder / "ncu" / "decode" / "raw.csv")
    (folder / CAPTURE_FILE).write_text(
        json.dumps(
            {
                "run_id": "fixture",
                "mode": "light",
                "ncu_clock_control": "none",
                "tools": {
                    "nsys": {"path": "/opt/nsys", "version": "2025.3.1"},
                    "ncu": {"path": "/opt/ncu", "version": "2025.3.1"},
                },
                "runs": {"nsys_profile": {"seconds": 30.0, "returncode": 0}},
                "forwarded_overrides": ["model=deepseek_ocr2_tiny"],
            }
        )
    )
    (folder / TARGETS_FILE).write_text(
        json.dumps(
            {
                "mode": "light",
                "stages": {
                    "decode": {
                        "kernels": ["indexSelectSmallIndex", "no_such_kernel"],
                        "calls": {"indexSelectSmallIndex": 6},
                        "instances": 6,
                        "rounds": [
                            {
                                "folder": "ncu/decode",
                                "kernels": ["indexSelectSmallIndex", "no_such_kernel"],
                                "launch_skip": 0,
                                "launch_count": 6,
                                "regex": "^(indexSelectSmallIndex|no_such_kernel)$",
                            }
                        ],
                    }
                },
            }
        )
    )
    (folder / "env.json").write_text(json.dumps({"gpu": {"driver": "580.159.04"}}))
    return folder


def stage2_metrics(folder: Path) -> Stage2Metrics:
    return load_stage2_metrics(folder / METRICS_FILE)


def write_workload(
    folder: Path, peak: PeakFigure, bandwidth: PeakFigure, stage_bytes: Mapping[str, float] | None = None
) -> Stage1Metrics:
    """The real H100 Stage 1 metrics, passes dropped, with `peak`, `bandwidth` and (where given) these analytic bytes
    per stage, as the workload metrics of the Stage 2 folder `folder`."""
    base = load_stage1_metrics(H100_STAGE1)
    bytes_of = stage_bytes or {}
    workload = attrs.evolve(
        base,
        records=(),
        flops_per_image={},
        mfu=tuple(attrs.evolve(r, peak=peak) for r in base.mfu),
        efficiency=tuple(attrs.evolve(e, bytes=bytes_of[e.stage]) for e in base.efficiency if e.stage in bytes_of),
        bandwidth_peak=bandwidth,
    )
    save(workload, folder / WORKLOAD_METRICS_FILE)
    return workload


def test_render_from_h100_exports(tmp_path: Path) -> None:
    folder = render(_stage2_folder(tmp_path))
    metrics = stage2_metrics(folder)
    assert metrics.stage == "stage2" and metrics.schema_version == SCHEMA_VERSION
    assert metrics.device.name == "NVIDIA H100 80GB HBM3"
    stages = {s.stage: s for s in metrics.stages}
    assert {"prefill", "decode", "decode/step", "vision/sam", "vision/encoder"} <= set(stages)
    assert 0 < stages["decode"].busy_fraction <= 1
    assert metrics.decode_steps is not None and metrics.decode_steps.steps == 6
    assert metrics.top_kernels and metrics.kernel_count > 1000
    assert any(r.stage == "decode" for r in metrics.ncu_kernels)
    assert any("no_such_kernel" in w for w in metrics.warnings)
    kernels = (folder / "kernels.md").read_text()
    assert "## decode" in kernels and "TFLOP/s (ncu)" in kernels
    report = (folder / "report.md").read_text()
    assert "GPU time per stage" in report and "Decode: 6 steps" in report
    assert (folder / "stakeholder_summary.md").read_text().count("Recommendations") == 1


def test_rerender_command_on_a_copied_folder(tmp_path: Path) -> None:
    copy = tmp_path / "copied"
    shutil.copytree(_stage2_folder(tmp_path), copy)
    done = run_cli("llm_perf_opt.cli.stage2_report", str(copy), timeout=120)
    assert done.returncode == 0, done.stderr
    assert (copy / "kernels.md").is_file() and (copy / "report.md").is_file()


def test_render_rejects_a_folder_without_exports(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not a complete Stage 2 folder"):
        render(tmp_path)
    done = run_main("llm_perf_opt.cli.stage2_report", str(tmp_path))
    assert done.returncode == 2 and "nsys/report.sqlite" in done.stderr


def test_stage2_without_gpu_fails_cleanly(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the no-GPU error")
    out = tmp_path / "s2"
    done = run_main("llm_perf_opt.cli.stage2", "model=deepseek_ocr2_tiny", f"hydra.run.dir={out}")
    assert done.returncode == 2
    assert "GPU" in done.stderr and "Traceback" not in done.stderr
    status = read_status(out)
    assert status.state == "failed" and status.stage == "stage2"


def test_batched_workloads_join_per_batch_not_per_input() -> None:
    """A batch's inputs share one prefill and one decode: Stage 2 sums Stage 1's batch records (one NVTX prefill
    range and one set of decode steps per batch pass), never the per-input records that each repeat the batch's."""
    from llm_perf_opt.measure.aggregate import stage_totals_ms
    from llm_perf_opt.records.folders import load_stage1_metrics

    batched = load_stage1_metrics(FIXTURES / "metrics" / "cpu_tiny_batch2_stage1.json")  # 3 passes of a batch of 2
    assert len(batched.forwards) == 3 and len(batched.records) == 6
    totals = stage_totals_ms(batched.forwards)
    assert totals["prefill"] == pytest.approx(sum(b.prefill_ms for b in batched.batches))
    assert totals["decode/step"] == pytest.approx(sum(sum(b.decode_step_ms) for b in batched.batches))
    assert totals["vision/sam"] == pytest.approx(sum(r.vision_ms["vision/sam"] for r in batched.records))  # per input
    assert totals["prefill"] < sum(r.prefill_ms for r in batched.records)  # the per-input sum counts it twice
    assert batched.flops_of(batched.batches[0]) == batched.flops_per_batch["batch 0"]
    unbatched = load_stage1_metrics(FIXTURES / "metrics" / "cpu_tiny_stage1.json")
    assert unbatched.forwards == unbatched.records
    assert stage_totals_ms(unbatched.forwards)["prefill"] == pytest.approx(sum(r.prefill_ms for r in unbatched.records))


def test_the_ncu_workload_of_a_batch_runs_one_whole_batch(tmp_path: Path) -> None:
    cfg = compose_stage2("run.batch_size=4")
    assert stage2_run(cfg, tmp_path, run_id="x", task_overrides=[]).settings.runtime.batch_size == 4
    ncu = workload_argv(stage2_settings(cfg), ["run.batch_size=4"], tmp_path, name="ncu-prefill", ncu=True)
    assert "dataset.max_images=4" in ncu and "dataset.max_images=1" not in ncu


def test_render_adds_mfu_and_mbu_from_the_workload_metrics(tmp_path: Path) -> None:
    folder = _stage2_folder(tmp_path)
    peak = PeakFigure(value=989.4e12, unit="FLOP/s", dtype_key="bf16", source="datasheet", device_name="H100")
    bandwidth = PeakFigure(value=3.35e12, unit="B/s", dtype_key=None, source="datasheet", device_name="H100")
    write_workload(folder, peak, bandwidth, {"prefill": 2.0e9, "decode": 1.0e9})
    metrics = stage2_metrics(render(folder))
    prefill = metrics.stage_row("prefill")
    assert prefill is not None and prefill.bytes == 2.0e9
    assert prefill.mbu_on_busy_time == pytest.approx(2.0e9 / (prefill.gpu_busy_ms / 1e3) / 3.35e12)
    assert "MBU on busy time" in (folder / "report.md").read_text()


def test_one_ncu_process_takes_the_targets_of_every_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stage 2's targeted kernels with a stand-in ncu: one process over the profiler window for both stages, its
    export (the H100 decode round: launches inside decode/step) holding 2 of decode's 5 targets and none of
    prefill's, each stage's rows told apart by their NVTX ranges."""
    from llm_perf_opt.nsight import tools
    from llm_perf_opt.pipeline import stage2_tools

    def fake_ncu(argv: list[str], *, timeout_s: float, log_path: Path) -> tools.ToolRun:
        if "--import" in argv:
            shutil.copy(FIXTURES / "ncu" / "h100_tiny_decode_raw.csv", log_path)
        else:
            (log_path.parent / "report.ncu-rep").write_bytes(b"ncu report")
        return tools.ToolRun(argv=tuple(argv), returncode=0, seconds=0.1, log_path=log_path, timed_out=False)

    monkeypatch.setattr(stage2_tools, "run_tool", fake_ncu)
    folder = _stage2_folder(tmp_path)
    (folder / TARGETS_FILE).unlink()
    cfg = compose_stage2("pipeline.ncu.bytes_pass=false")
    run = stage2_run(cfg, folder, run_id="fixture", task_overrides=[])
    run.ncu.run(tools.Tool(name="ncu", path=Path("/opt/ncu"), version="2025.3.1"))
    targets = load_ncu_targets(folder)
    assert targets is not None and list(targets.stages) == ["prefill", "decode"]
    (prefill,) = targets.stages["prefill"].rounds
    decode = targets.stages["decode"]
    assert decode.instances == 6 and len(decode.kernels) == 5  # one instance is a decode step
    (round_,) = decode.rounds
    assert prefill.folder == round_.folder == "ncu/targets" and prefill.regex == round_.regex
    assert round_.profiler_window and round_.kernels == decode.kernels and round_.note is None
    wanted = set(targets.stages["prefill"].kernels) | set(decode.kernels)
    assert all(name in round_.regex for name in wanted)  # one regex for every stage's targets
    assert list(run.tools.capture.runs) == ["ncu_targets"]
    cmd = (folder / "ncu" / "targets" / "cmd.txt").read_text()
    assert (
        "--profile-from-start off" in cmd and "--filter-mode per-launch-config --launch-skip 0 --launch-count 1" in cmd
    )
    assert "--nvtx-include" not in cmd and "run.profiler_window=true" in cmd
    run.tools.save()
    metrics = stage2_metrics(render(folder))
    assert {r.stage for r in metrics.ncu_kernels} == {"decode"}
    assert {r.name for r in metrics.ncu_kernels} == {"reduce_kernel", "unrolled_elementwise_kernel"}
    warnings = metrics.warnings
    assert any(w.startswith("Nsight Compute profiled no kernel in prefill") for w in warnings)
    assert any(w.startswith("Nsight Compute did not reach 3 of the 5 targeted kernels in decode") for w in warnings)
    # a target whose launches in its stage all repeat a launch configuration profiled in another stage: that
    # launch stands in, saying where it ran
    stage = targets.stages["prefill"]
    shared = attrs.evolve(stage, kernels=("reduce_kernel", *stage.kernels))
    save(attrs.evolve(targets, stages={**targets.stages, "prefill": shared}), folder / TARGETS_FILE)
    again = stage2_metrics(render(folder))
    (stand_in,) = [r for r in again.ncu_kernels if r.stage == "prefill"]
    assert stand_in.name == "reduce_kernel" and stand_in.nvtx_range == "decode/step"
    assert any(
        w.startswith("prefill: reduce_kernel (profiled in decode/step): Nsight Compute takes each launch configuration")
        for w in again.warnings
    ), again.warnings


def test_every_command_run_in_a_folder_stays_in_its_cmd_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nsys/ holds the profile and the export: its cmd.txt lists both, in order (the export once overwrote the
    profile command, the one that says how the trace was taken)."""
    from llm_perf_opt.nsight import tools
    from llm_perf_opt.pipeline import stage2_tools

    def fake_tool(argv: list[str], *, timeout_s: float, log_path: Path) -> tools.ToolRun:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text("ok\n")
        return tools.ToolRun(argv=tuple(argv), returncode=0, seconds=0.1, log_path=log_path, timed_out=False)

    monkeypatch.setattr(stage2_tools, "run_tool", fake_tool)
    run = stage2_run(compose_stage2(), tmp_path / "s2", run_id="x", task_overrides=[])
    run.tools.timed("nsys_profile", ["nsys", "profile", "--cuda-graph-trace=node"], "nsys/profile.log", 5, "profile")
    run.tools.timed("nsys_export", ["nsys", "export", "--type=sqlite"], "nsys/export.log", 5, "export")
    lines = (tmp_path / "s2" / "nsys" / "cmd.txt").read_text().splitlines()
    assert lines == ["nsys profile --cuda-graph-trace=node", "nsys export --type=sqlite"]
    assert run.art.written.count("nsys/cmd.txt") >= 1


def test_decode_advice_knows_the_step_already_replays_a_cuda_graph() -> None:
    """A launch-bound step under CUDA graphs gets no advice to use CUDA graphs: the waiting is host work around the
    replay, and batching spreads it."""
    from llm_perf_opt.records.stage1 import RunSettings, RuntimeRecord
    from llm_perf_opt.report.stage2_reports import findings

    eager = load_stage2_metrics(Path(__file__).parents[1] / "examples" / "stage2-h100-tiny" / METRICS_FILE)
    assert "CUDA graphs / torch.compile" in findings(eager)[0]
    graphs = RuntimeRecord(kv_cache="static", compile="decode", compile_mode="reduce-overhead")
    base = eager.workload_settings or RunSettings(repeats=1, warmup=1, max_new_tokens=6, max_images=1, sources={})
    settings = attrs.evolve(base, runtime=graphs)
    advice = findings(attrs.evolve(eager, workload_settings=settings))[0]
    assert "already replays a CUDA graph" in advice and "CUDA graphs / torch.compile" not in advice
    assert "run.batch_size" in advice


def test_stage2_refuses_a_bad_batch_size_before_profiling(tmp_path: Path) -> None:
    """run.batch_size ≤ 0 is one paragraph naming the key (exit 2) when the config is composed: no folder is made,
    no Nsight tool runs."""
    out = tmp_path / "s2"
    done = run_main("llm_perf_opt.cli.stage2", "model=deepseek_ocr2_tiny", "run.batch_size=0", f"hydra.run.dir={out}")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "run.batch_size" in done.stderr
    assert not out.exists()
