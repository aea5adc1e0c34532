"""GPU: kernels per decode step and GPU-busy fraction from the profiled pass, eager and with compiled decode
(reduce-overhead: the step replays a CUDA graph, whose kernels must still be counted). Skips without CUDA."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers import run_cli

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _tiny_run(tmp_path: Path, runtime: tuple[str, ...]) -> Path:
    """A tiny-model stage1-run on the GPU with a profiled pass of 4 decode steps; its folder."""
    out = tmp_path / "run"
    done = run_cli(
        "llm_perf_opt.cli.stage1",
        "model=deepseek_ocr_tiny",
        "device=cuda",
        *runtime,
        "run.repeats=3",
        "infer.max_new_tokens=8",
        "dataset.max_images=1",
        "pipeline.torch_profiler.decode_steps=4",
        f"hydra.run.dir={out}",
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.parametrize(
    "runtime",
    [(), ("runtime.kv_cache=static", "runtime.compile=decode")],
    ids=["eager", "compiled-decode"],
)
def test_profiled_pass_counts_kernels_per_decode_step(tmp_path: Path, runtime: tuple[str, ...]) -> None:
    out = _tiny_run(tmp_path, runtime)
    metrics = json.loads((out / "metrics.json").read_text())
    act = metrics["profiler"]["activity"]
    assert act is not None, "no kernels tied to the profiled decode steps"
    assert act["steps"] == 4
    assert act["kernels_min"] > 0 and act["kernels_mean"] >= act["kernels_min"]
    assert 0 < act["busy_ms_mean"] <= act["wall_ms_mean"] + 1e-6
    assert act["busy_ms_mean"] <= act["kernel_ms_mean"] + 1e-6  # the union never exceeds the sum
    assert 0 < act["busy_fraction"] <= 1
    assert act["prefill"]["kernels"] > act["kernels_max"]  # the prefill (vision + prompt) launches far more
    report = (out / "report.md").read_text()
    assert "GPU activity per decode step (4 steps profiled)" in report
    assert "busy" in (out / "stakeholder_summary.md").read_text()
    if runtime:  # compiled decode: a CUDA graph replay per step, still counted kernel by kernel
        assert metrics["compile"] is not None


@pytest.mark.parametrize(
    "runtime",
    [(), ("runtime.kv_cache=static", "runtime.compile=decode")],
    ids=["eager", "cuda-graph-decode"],
)
def test_kernel_time_is_given_to_modules_eager_and_inside_cuda_graphs(tmp_path: Path, runtime: tuple[str, ...]) -> None:
    out = _tiny_run(tmp_path, runtime)
    modules = json.loads((out / "metrics.json").read_text())["modules"]
    stages = {s["stage"]: s for s in modules["stages"]}
    step = stages["decode/step"]
    attributed = 1 - step["unattributed_ms"] / step["total_ms"]
    # the tiny model's own kernels are few, so the decode loop's (argmax, token copies) weigh more than in the
    # full model, where ≥ 95% is the benchmark's target (docs/benchmarks-history.md)
    assert attributed >= 0.85, step
    expected = "inductor provenance" if runtime else "module ranges"
    assert expected in step["methods"]
    assert 1 - stages["prefill"]["unattributed_ms"] / stages["prefill"]["total_ms"] >= 0.85
    assert "by module" in (out / "report.md").read_text()
    assert (out / "plots" / "modules.png").is_file() and (out / "modules.md").is_file()


def test_device_times_equal_torchs_on_a_real_profile() -> None:
    """The profiled pass's tables read device times through `DeviceTimes` (each event's computed once): on a real
    CUDA profile of nested modules, the same values as torch's `FunctionEvent` properties, event by event."""
    from llm_perf_opt.instruments.torch_profiler import DeviceTimes

    layers = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Sequential(torch.nn.Linear(512, 256), torch.nn.ReLU())
    ).cuda()
    x = torch.randn(64, 256, device="cuda")
    layers(x)
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof, torch.profiler.record_function("outer"):
        for _ in range(3):
            layers(x)
        torch.cuda.synchronize()
    events = list(prof.events())
    times = DeviceTimes()
    with_kernels = 0
    for ev in reversed(events):  # parents before children: the cache must fill in any order
        assert times.total(ev) == pytest.approx(ev.device_time_total, abs=1e-9)
        assert times.own(ev) == pytest.approx(ev.self_device_time_total, abs=1e-9)
        with_kernels += times.total(ev) > 0
    assert with_kernels > 3  # kernels were recorded and summed up the tree
