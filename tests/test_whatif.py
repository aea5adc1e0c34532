"""perf-whatif's figures and plan: speed-ups with intervals and noise verdicts, the ladder order (stacking, levers
already on, conflicting levers), attribution of a decode-step change, lever presets and their bad input."""

from __future__ import annotations

import math

import pytest
from omegaconf import OmegaConf

from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.errors import UserError
from llm_perf_opt.measure import whatif as w
from llm_perf_opt.measure.noise import BEYOND, TOO_FEW, WITHIN
from llm_perf_opt.measure.stats import summarize
from llm_perf_opt.pipeline.whatif import read_levers, validate, workload_overrides
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.whatif import WORKLOAD, Lever, RungFigures, Speedup, StepFloor

DECODE = w.objective("decode_ms_per_token")
THROUGHPUT = w.objective("aggregate_decode_tokens_per_s")


def test_speedup_of_a_lower_is_better_objective() -> None:
    base, fast = [20.0, 20.5, 19.8, 20.2], [2.0, 2.1, 1.9, 2.05]
    s = w.speedup(DECODE, base, fast)
    assert s is not None
    assert s.value == pytest.approx(20.1 / 2.025)
    assert s.ci95_low is not None and s.ci95_high is not None
    assert s.ci95_low < s.value < s.ci95_high
    assert s.verdict == BEYOND


def test_speedup_of_a_higher_is_better_objective_and_noise() -> None:
    base, same = [100.0, 110.0, 90.0], [101.0, 108.0, 93.0]
    s = w.speedup(THROUGHPUT, base, same)
    assert s is not None and s.value == pytest.approx(101.0 / 100.0)
    assert s.verdict == WITHIN
    assert s.ci95_low is not None and s.ci95_low < 1.0 < (s.ci95_high or 0.0)
    assert not w.helped(s)


def test_no_interval_below_three_passes() -> None:
    s = w.speedup(DECODE, [10.0, 11.0], [5.0, 5.5])
    assert s is not None and s.ci95_low is None and s.ci95_high is None and s.ci_method is None
    assert s.verdict == TOO_FEW
    assert not w.judged(s) and not w.helped(s)  # twice as fast on 2 passes each: no interval, no gain claimed


def test_ratio_interval_is_the_inverse_when_swapped() -> None:
    a, b = [10.0, 12.0, 11.0, 10.5], [5.0, 5.5, 6.0, 5.2]
    forward, backward = w.ratio_interval_95(a, b), w.ratio_interval_95(b, a)
    assert forward is not None and backward is not None
    assert forward[0] == pytest.approx(1 / backward[1]) and forward[1] == pytest.approx(1 / backward[0])


def _lever(name: str, *overrides: str) -> Lever:
    return Lever(name=name, overrides=overrides)


def _gain(value: float, verdict: str = BEYOND) -> Speedup:
    return Speedup(value=value, ci95_low=None, ci95_high=None, ci_method=None, verdict=verdict)


def test_ladder_takes_helping_levers_best_first() -> None:
    levers = [
        _lever("static_cache", "runtime.kv_cache=static"),
        _lever(
            "cuda_graphs", "runtime.kv_cache=static", "runtime.compile=decode", "runtime.compile_mode=reduce-overhead"
        ),
        _lever("compiled", "runtime.kv_cache=static", "runtime.compile=decode", "runtime.compile_mode=default"),
        _lever("grouped", "model.experts_implementation=grouped_mm"),
        _lever("eager_attn", "model.attn_implementation=eager"),
        _lever("noise", "model.seed=1"),
    ]
    gains = {
        "static_cache": _gain(1.3),
        "cuda_graphs": _gain(12.0),
        "compiled": _gain(3.0),
        "grouped": _gain(1.1),
        "eager_attn": _gain(0.5),
        "noise": _gain(1.02, WITHIN),
    }
    ranked = w.rank(levers, gains)
    assert [lever.name for lever in ranked] == ["cuda_graphs", "compiled", "static_cache", "grouped"]
    plan = w.plan_ladder(ranked)
    assert [step.levers for step in plan.steps] == [("cuda_graphs",), ("cuda_graphs", "grouped")]
    assert plan.steps[1].overrides == (
        "runtime.kv_cache=static",
        "runtime.compile=decode",
        "runtime.compile_mode=reduce-overhead",
        "model.experts_implementation=grouped_mm",
    )
    reasons = dict(plan.left_out)
    assert "conflict" not in reasons["compiled"] and "runtime.compile_mode" in reasons["compiled"]
    assert reasons["static_cache"] == "already on through cuda_graphs"


def _figures(wall: float, busy: float | None, kernels: float | None, flops: float, moved: float) -> RungFigures:
    steps = [wall * f for f in (0.99, 1.0, 1.01)]
    return RungFigures(
        objective=summarize(steps, "ms"),
        decode_ms_per_token=summarize(steps, "ms"),
        ttft_ms=None,
        pages_per_s=None,
        aggregate_decode_tokens_per_s=None,
        kernels_per_step=kernels,
        gpu_busy_fraction=None if busy is None else busy / wall,
        flops_per_step=flops,
        bytes_per_step=moved,
        bound="memory",
        peak_memory_bytes=None,
        compile_ms=None,
        warmup_passes=2,
        batch_size=1,
        floors=(StepFloor(vocab.DECODE_STEP, 0.5, busy, busy, wall),),
    )


def test_attribution_names_launch_overhead_and_bytes() -> None:
    eager = _figures(20.0, busy=2.0, kernels=900, flops=1e9, moved=1e9)
    graphs = _figures(2.1, busy=1.9, kernels=6, flops=1e9, moved=1e9)
    a = w.attribute(graphs, "baseline", eager)
    assert a is not None
    assert a.wall_ms == pytest.approx(-17.9)
    assert a.idle_ms == pytest.approx(-17.8) and a.busy_ms == pytest.approx(-0.1)
    assert a.kernels_per_step == -894
    assert a.cause.startswith("launch and host overhead") and "900 → 6 kernels/step" in a.cause
    fewer_bytes = _figures(15.0, busy=1.2, kernels=900, flops=1e9, moved=0.5e9)
    b = w.attribute(fewer_bytes, "baseline", _figures(15.5, busy=1.9, kernels=900, flops=1e9, moved=1e9))
    assert b is not None and b.cause.startswith("bytes moved: 0.50×")
    # the same kernels and busy time, only idle moved (seen on the H100: a vision lever "saving" 9 ms per decode step)
    drifted, base = _figures(18.3, 2.47, 901, 1e9, 1e9), _figures(27.4, 2.47, 901, 1e9, 1e9)
    paced = w.attribute(drifted, "baseline", base)
    assert paced is not None and paced.cause.startswith("host time alone: the same 901 kernels/step")
    assert "host's pace drifting" in paced.cause


def test_attribution_without_a_kernel_timeline_says_so() -> None:
    a = w.attribute(_figures(5.0, None, None, 1.0, 1.0), "baseline", _figures(6.0, None, None, 1.0, 1.0))
    assert a is not None and a.idle_ms is None and "not split" in a.cause
    assert math.isclose(a.wall_ms, -1.0)


def test_workload_overrides_leave_out_perf_whatifs_own_keys() -> None:
    task = ["whatif=decode", "model=deepseek_ocr_tiny", "whatif_run.devices=[cuda:0]", "run.repeats=3", "+whatif.x=1"]
    assert workload_overrides(task) == ("model=deepseek_ocr_tiny", "run.repeats=3")


def test_presets_compose_with_their_levers() -> None:
    for preset, expected in (
        ("decode", "cuda_graphs"),
        ("tuning", "max_autotune_graphs"),
        ("vision", "base_mode"),
        ("batch", "batch_8"),
        ("throughput", "batched_vision_graphs"),
    ):
        cfg = compose_config("whatif", f"whatif={preset}")
        levers = read_levers(cfg.whatif.levers, [])
        assert expected in [lever.name for lever in levers]
        assert cfg.whatif.objective in w.objective_names()
    everything = read_levers(compose_config("whatif", "whatif=all").whatif.levers, [])
    assert {"static_cache", "fewer_tiles", "batch_16"} <= {lever.name for lever in everything}
    assert next(lever for lever in everything if lever.name == "base_mode").changes == WORKLOAD
    assert "max_autotune_graphs" not in {lever.name for lever in everything}  # minutes of compiling: its own preset
    tuning = read_levers(compose_config("whatif", "whatif=tuning").whatif.levers, [])
    tuned = next(lever for lever in tuning if lever.name == "max_autotune_graphs")
    assert tuned.needs == "cuda" and "runtime.compile_mode=max-autotune" in tuned.overrides
    assert validate(tuned.overrides) is None  # the overrides compose
    # autotuned compiles stay in tuning: the vision preset's compiled prefill is the default mode, and the autotuned
    # one keeps ATen out of the matmul choices (torch 2.11 trips a device-side assert autotuning grouped_mm)
    prefill = next(lever for lever in everything if lever.name == "compiled_prefill")
    assert "runtime.compile_mode=default" in prefill.overrides
    autotuned = next(lever for lever in tuning if lever.name == "prefill_max_autotune")
    assert "+runtime.compile_options.max_autotune_gemm_backends=TRITON" in autotuned.overrides
    assert validate(autotuned.overrides) is None and "prefill_max_autotune" not in {lever.name for lever in everything}


def test_bad_lever_definitions_are_one_paragraph_each() -> None:
    cfg = compose_config("whatif")
    with pytest.raises(UserError, match=r"whatif_run\.exclude names nope"):
        read_levers(cfg.whatif.levers, ["nope"])
    bad = compose_config("whatif", "+whatif.levers.broken={about: x}")
    with pytest.raises(UserError, match="lever broken has no overrides"):
        read_levers(bad.whatif.levers, [])
    odd = compose_config("whatif", "+whatif.levers.odd={overrides: ['runtime.kv_cache=static'], changes: sometimes}")
    with pytest.raises(UserError, match="changes=sometimes is not known"):
        read_levers(odd.whatif.levers, [])


@pytest.mark.parametrize("name", ["x/../../escaped", "..", "a b", "dotted.name", "/abs", "é"])
def test_a_lever_name_other_than_letters_digits_underscore_dash_is_refused(name: str) -> None:
    spec = {"overrides": ["runtime.kv_cache=static"]}
    with pytest.raises(UserError, match=r"a lever name takes letters, digits, _ and - only\. Rename the lever") as e:
        read_levers(OmegaConf.create({name: spec}), [])
    assert f"the lever {name!r} has a name" in str(e.value)
    assert [lever.name for lever in read_levers(OmegaConf.create({"Static-cache_2": spec}), [])] == ["Static-cache_2"]


def test_validation_refuses_what_stage1_would_refuse() -> None:
    assert validate(["model=deepseek_ocr_tiny", "runtime.kv_cache=static"]) is None
    typo = validate(["model=deepseek_ocr_tiny", "runtime.kv_cahce=static"])
    assert typo is not None and "runtime.kv_cache" in typo  # names the nearest key
    dynamic = validate(["model=deepseek_ocr_tiny", "runtime.compile=decode"])
    assert dynamic is not None and "needs a static KV cache" in dynamic


@pytest.mark.parametrize(
    ("workload", "preset", "refused"),
    [
        (("model=hf", "model.config=qwen2_tiny"), "decode", set()),
        (("model=deepseek_ocr2_tiny",), "decode", set()),
        # OCR-2 has no v1 modes; it preprocesses on the GPU too (models/deepseek_ocr2_views.py)
        (("model=deepseek_ocr2_tiny",), "vision", {"base_mode"}),
        (("model=deepseek_ocr_tiny",), "vision", set()),
        # batched vision at batch 64 (v1 and OCR-2), the prefill compiled at the batch
        (("model=deepseek_ocr_tiny",), "throughput", set()),
        (("model=deepseek_ocr2_tiny",), "throughput", set()),
    ],
)
def test_presets_validate_per_model_family(workload: tuple[str, ...], preset: str, refused: set[str]) -> None:
    """Every lever of a preset is accepted for the model families it fits; one that does not fit is refused with
    stage1-run's own message (it becomes an invalid rung, the others run)."""
    levers = read_levers(compose_config("whatif", f"whatif={preset}").whatif.levers, [])
    reasons = {lever.name: validate([*workload, *lever.overrides]) for lever in levers}
    assert {name for name, why in reasons.items() if why is not None} == refused
    keys = {"base_mode": "model.mode", "gpu_preprocess": "model.preprocess.device"}
    for name in refused:
        assert keys[name] in (reasons[name] or "")


def test_per_step_figures_of_a_batched_rung_count_each_batch_step_once(tmp_path) -> None:
    """A batch's inputs each repeat the batch's decode steps in their records: the rung's FLOPs and bytes per step
    divide by the batch steps, not by every input's copy of them."""
    from pathlib import Path

    from llm_perf_opt.records.folders import Stage1Folder, load_stage1_metrics
    from llm_perf_opt.records.whatif import Objective

    metrics = load_stage1_metrics(Path(__file__).parent / "fixtures" / "metrics" / "cpu_tiny_batch2_stage1.json")
    batch_steps = sum(len(b.decode_step_ms) for b in metrics.batches)
    assert sum(len(r.decode_step_ms) for r in metrics.records) == 2 * batch_steps  # a batch of 2
    folder = Stage1Folder(tmp_path, None, metrics, {}, None, None, ())  # type: ignore[arg-type]
    goal = Objective(name="decode_ms_per_token", label="decode ms/token (p50)", unit="ms", higher_is_better=False)
    figures = w.rung_figures(folder, goal)
    decode = metrics.efficiency_of(vocab.DECODE)
    assert decode is not None and figures.bytes_per_step == pytest.approx(decode.bytes / batch_steps)
    assert figures.flops_per_step == pytest.approx(decode.flops / batch_steps)


def test_the_what_if_parent_reaches_its_fork_server_without_importing_torch() -> None:
    """perf-whatif launches the fork server (which imports torch, transformers and the pipeline for every rung) when
    the run starts; the parent's own imports up to there stay free of torch, so the server starts seconds earlier."""
    import subprocess
    import sys

    code = (
        "import sys, llm_perf_opt.cli.whatif, llm_perf_opt.pipeline.whatif, llm_perf_opt.pipeline.rung_forks; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
