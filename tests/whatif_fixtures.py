"""`WhatIfRecord`s built by hand for the report tests (importable as `whatif_fixtures`): a realistic H100 decode
ladder and a minimal CPU run; and the one builder of what-if folders on disk (`whatif_tree`), whose rungs are copies
of the fixture Stage 1 run (`copy_stage1_run`)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from llm_perf_opt.data.dataset import bundled_samples_dir
from llm_perf_opt.measure.stats import summarize
from llm_perf_opt.records import io
from llm_perf_opt.records.common import SCHEMA_VERSION
from llm_perf_opt.records.folders import WHATIF_FILE
from llm_perf_opt.records.whatif import (
    ALONE,
    BASELINE,
    FAILED,
    INVALID,
    LADDER,
    MEASURED,
    SKIPPED,
    WORKLOAD,
    Attribution,
    Lever,
    Objective,
    OutputAgreement,
    Rung,
    RungFigures,
    Speedup,
    StepFloor,
    Verdict,
    WhatIfRecord,
)

DECODE = Objective(name="decode_ms_per_token", label="decode ms/token (p50)", unit="ms/token", higher_is_better=False)
GIB = 2**30


def _passes(p50: float, spread: float = 0.01) -> list[float]:
    """Five timed passes around `p50` (relative spread `spread`)."""
    return [p50 * (1 + spread * k) for k in (-2, -1, 0, 1, 2)]


def figures(
    decode_ms: float,
    *,
    kernels: float | None,
    busy: float | None,
    ttft_ms: float = 180.0,
    peak_gib: float | None = 7.1,
    compile_ms: float | None = None,
    floors: tuple[StepFloor, ...] = (),
    batch_size: int = 1,
    tokens: int = 32,
) -> RungFigures:
    decode = summarize(_passes(decode_ms), "ms/token")
    ttft = summarize(_passes(ttft_ms), "ms")
    page_s = (ttft_ms + tokens * decode_ms) / 1e3
    return RungFigures(
        objective=decode,
        decode_ms_per_token=decode,
        ttft_ms=ttft,
        pages_per_s=batch_size / page_s,
        aggregate_decode_tokens_per_s=batch_size * 1e3 / decode_ms,
        kernels_per_step=kernels,
        gpu_busy_fraction=busy,
        flops_per_step=6.2e9,
        bytes_per_step=6.4e9,
        bound="memory",
        peak_memory_bytes=None if peak_gib is None else int(peak_gib * GIB),
        compile_ms=compile_ms,
        warmup_passes=2,
        batch_size=batch_size,
        floors=floors,
    )


def speedup(base: float, rung: float, verdict: str = "beyond noise") -> Speedup:
    value = base / rung
    return Speedup(value, value * 0.97, value * 1.03, "Student t on log values (geometric mean)", verdict)


def identical(tokens: int = 32, logits: float | None = 0.0) -> OutputAgreement:
    return OutputAgreement(inputs=1, first_departure=None, compared_tokens=tokens, prefill_logits_max_abs_diff=logits)


BASE_FLOORS = (
    StepFloor("decode/step", speed_of_light_ms=0.95, kernel_ms=9.1, busy_ms=9.42, wall_ms=24.8),
    StepFloor("prefill", speed_of_light_ms=12.0, kernel_ms=61.0, busy_ms=66.0, wall_ms=180.0),
)
BEST_FLOORS = (
    StepFloor("decode/step", speed_of_light_ms=0.95, kernel_ms=1.41, busy_ms=1.52, wall_ms=1.57),
    StepFloor("prefill", speed_of_light_ms=12.0, kernel_ms=60.0, busy_ms=65.0, wall_ms=176.0),
)

STATIC = Lever("static_cache", ("runtime.kv_cache=static",), about="static KV cache")
GRAPHS = Lever(
    "cuda_graphs",
    ("runtime.compile=decode", "runtime.compile_mode=reduce-overhead"),
    about="compiled decode step captured in CUDA graphs",
    needs="cuda",
)
GROUPED = Lever("grouped_mm", ("model.experts_implementation=grouped_mm",), about="fused MoE experts")
FA3 = Lever("flash_attention_3", ("model.attn_implementation=flash_attention_3",), about="FlashAttention 3")
BATCH = Lever("batch_16", ("run.batch_size=16",), about="16 pages per decode step")
MODE = Lever("mode_base", ("model.mode=base",), about="one 1024-px global view, no tiles", changes=WORKLOAD)


def realistic() -> WhatIfRecord:
    """The H100 decode ladder: eager 24.8 ms/token → static cache 18.5 → static cache + CUDA graphs 1.57."""
    base = figures(24.8, kernels=912, busy=0.38, floors=BASE_FLOORS)
    static = figures(18.5, kernels=905, busy=0.5, peak_gib=7.3)
    best = figures(1.57, kernels=6, busy=0.97, peak_gib=7.6, compile_ms=41_000.0, floors=BEST_FLOORS)
    grouped = figures(24.6, kernels=640, busy=0.39)
    mode = figures(23.1, kernels=912, busy=0.38, ttft_ms=95.0, peak_gib=6.8)
    static_attr = Attribution(
        "baseline",
        wall_ms=-6.3,
        idle_ms=-6.13,
        busy_ms=-0.17,
        kernels_per_step=-7,
        flops_per_step=0.0,
        bytes_per_step=-1.2e8,
        cause="no cache growth: GPU idle −6.13 ms/step",
    )
    rungs = (
        Rung("baseline", BASELINE, (), (), False, MEASURED, folder="rungs/00-baseline", wall_s=95.0, figures=base),
        Rung(
            "static_cache",
            ALONE,
            ("static_cache",),
            STATIC.overrides,
            False,
            MEASURED,
            folder="rungs/01-static_cache",
            wall_s=90.0,
            figures=static,
            speedup=speedup(24.8, 18.5),
            outputs=identical(),
            attribution=static_attr,
        ),
        Rung(
            "cuda_graphs",
            ALONE,
            ("cuda_graphs",),
            GRAPHS.overrides,
            False,
            INVALID,
            reason="runtime.compile=decode needs runtime.kv_cache=static",
        ),
        Rung(
            "grouped_mm",
            ALONE,
            ("grouped_mm",),
            GROUPED.overrides,
            False,
            MEASURED,
            folder="rungs/03-grouped_mm",
            wall_s=97.0,
            figures=grouped,
            speedup=speedup(24.8, 24.6, "within noise"),
            outputs=identical(logits=0.0078),
            attribution=Attribution("baseline", -0.2, 0.1, -0.3, -272, 0.0, 0.0, "fewer launches: 912 → 640"),
        ),
        Rung(
            "flash_attention_3",
            ALONE,
            ("flash_attention_3",),
            FA3.overrides,
            False,
            SKIPPED,
            reason="needs the flash_attn_interface package, which is not installed",
        ),
        Rung(
            "batch_16",
            ALONE,
            ("batch_16",),
            BATCH.overrides,
            False,
            FAILED,
            reason="CUDA out of memory: tried to allocate 12.00 GiB (79.1 GiB total, 3.2 GiB free)",
            folder="rungs/05-batch_16",
            wall_s=40.0,
        ),
        Rung(
            "mode_base",
            ALONE,
            ("mode_base",),
            MODE.overrides,
            True,
            MEASURED,
            folder="rungs/06-mode_base",
            wall_s=70.0,
            figures=mode,
            speedup=speedup(24.8, 23.1),
            outputs=OutputAgreement(1, first_departure=3, compared_tokens=32, prefill_logits_max_abs_diff=None),
            attribution=Attribution("baseline", -1.7, -1.0, -0.7, 0, -1.1e9, -2.0e8, "shorter context"),
        ),
        Rung(
            "ladder 1: static_cache",
            LADDER,
            ("static_cache",),
            STATIC.overrides,
            False,
            MEASURED,
            figures=static,
            speedup=speedup(24.8, 18.5),
            outputs=identical(),
            attribution=static_attr,
            reused="static_cache",
        ),
        Rung(
            "ladder 2: static_cache + cuda_graphs",
            LADDER,
            ("static_cache", "cuda_graphs"),
            STATIC.overrides + GRAPHS.overrides,
            False,
            MEASURED,
            folder="rungs/07-ladder-2",
            wall_s=150.0,
            figures=best,
            speedup=speedup(24.8, 1.57),
            outputs=identical(logits=0.03125),
            attribution=Attribution(
                "ladder 1: static_cache",
                wall_ms=-16.93,
                idle_ms=-9.2,
                busy_ms=-7.73,
                kernels_per_step=-899,
                flops_per_step=0.0,
                bytes_per_step=0.0,
                cause="fewer launches: 905 → 6 kernels/step; GPU idle −9.2 ms/step",
            ),
        ),
    )
    return WhatIfRecord(
        schema_version=SCHEMA_VERSION,
        run_id="20250101-120000-abcdef",
        stage="whatif",
        created="2025-01-01T12:00:00+00:00",
        preset="decode",
        objective=DECODE,
        model="deepseek_ocr",
        weights="checkpoint",
        device="NVIDIA H100 80GB HBM3",
        device_type="cuda",
        workload_overrides=("workload=a4_page", "infer.max_new_tokens=32"),
        levers=(STATIC, GRAPHS, GROUPED, FA3, BATCH, MODE),
        rungs=rungs,
        best="ladder 2: static_cache + cuda_graphs",
        verdicts=(
            Verdict("static_cache", True, "static_cache: 1.34× (beyond noise), outputs identical for 32 tokens"),
            Verdict(
                "cuda_graphs",
                True,
                "cuda_graphs (on top of static_cache): 11.8× (beyond noise), outputs identical for 32 tokens",
            ),
            Verdict("grouped_mm", False, "grouped_mm: 1.01× (within noise)"),
            Verdict("mode_base", False, "mode_base: 1.07× but changes the workload (outputs depart at token 3)"),
        ),
        notes=("flash_attention_3 skipped: flash_attn_interface is not installed.",),
    )


def minimal() -> WhatIfRecord:
    """A CPU run: a baseline, one lever that did not help and a CUDA-only lever skipped."""
    base = figures(40.0, kernels=None, busy=None, ttft_ms=300.0, peak_gib=None, tokens=4)
    static = figures(40.4, kernels=None, busy=None, ttft_ms=300.0, peak_gib=None, tokens=4)
    return WhatIfRecord(
        schema_version=SCHEMA_VERSION,
        run_id="20250102-090000-123456",
        stage="whatif",
        created="2025-01-02T09:00:00+00:00",
        preset="decode",
        objective=DECODE,
        model="deepseek_ocr_tiny",
        weights="random",
        device="AMD EPYC",
        device_type="cpu",
        workload_overrides=(),
        levers=(STATIC, GRAPHS),
        rungs=(
            Rung("baseline", BASELINE, (), (), False, MEASURED, folder="rungs/00-baseline", wall_s=12.0, figures=base),
            Rung(
                "static_cache",
                ALONE,
                ("static_cache",),
                STATIC.overrides,
                False,
                MEASURED,
                folder="rungs/01-static_cache",
                wall_s=12.5,
                figures=static,
                speedup=speedup(40.0, 40.4, "within noise"),
                outputs=identical(tokens=4, logits=None),
            ),
            Rung(
                "cuda_graphs",
                ALONE,
                ("cuda_graphs",),
                GRAPHS.overrides,
                False,
                SKIPPED,
                reason="needs a CUDA device; this run is on the CPU",
            ),
        ),
        best=None,
        verdicts=(Verdict("static_cache", False, "static_cache: 0.99× (within noise)"),),
    )


STAGE1_RUN = Path(__file__).parent / "fixtures" / "runs" / "cpu_tiny_v1_stage1"
RECORDED_SAMPLES = "/work/main/src/llm_perf_opt/data/samples"  # where the fixture run read its samples


def copy_stage1_run(target: Path) -> Path:
    """The fixture Stage 1 run copied to `target`, its input paths pointed at this installation's bundled samples."""
    shutil.copytree(STAGE1_RUN, target)
    for name in ("inputs.yaml", "predictions/predictions.jsonl"):
        text = (target / name).read_text()
        (target / name).write_text(text.replace(RECORDED_SAMPLES, str(bundled_samples_dir())))
    return target


def whatif_tree(root: Path, record: WhatIfRecord | None = None, rungs: Sequence[str] = ("00-baseline",)) -> Path:
    """A what-if folder as the runner leaves it: each of `rungs` a copy of the fixture Stage 1 run under
    `rungs/`, and `record` saved as whatif.json (None: not written yet). Returns `root`."""
    for name in rungs:
        copy_stage1_run(root / "rungs" / name)
    if record is not None:
        io.save(record, root / WHATIF_FILE)
    return root
