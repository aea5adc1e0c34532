"""The analytic model of DeepSeek-OCR v1 (SAM + CLIP-L + the shared decoder) against the reference numbers
(deepseek-ocr-facts §1, §4) and, exactly, against FlopCounterMode: the full-size vision path on the meta device,
the tiny model end to end on the CPU. Then `analytic-report model=deepseek_ocr`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import DictConfig

from helpers import rope_table_flops, run_main
from llm_perf_opt.analytic import ClipSpec, ModelSpec, Workload, decode_step, prefill, stage_costs, vision_view
from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import command_config, plain
from llm_perf_opt.errors import UserError
from llm_perf_opt.instruments.flops import flop_counter
from llm_perf_opt.models.cache_argument import cache_kwargs, output_cache
from llm_perf_opt.models.deepseek_ocr.configuration import DeepseekOcrConfig
from llm_perf_opt.models.deepseek_ocr.modeling import DeepseekOcrForConditionalGeneration
from llm_perf_opt.models.deepseek_ocr.preprocess import image_token_count, mode_from_config
from llm_perf_opt.pipeline.analytic import build_report

G = 1e9
EXACT = 1e-9  # relative error allowed against FlopCounterMode
V1_STAGES = ("vision/sam", "vision/clip", "vision/projector")


@pytest.fixture(scope="module")
def full_cfg(compose_model) -> DictConfig:
    return compose_model("model=deepseek_ocr")


@pytest.fixture(scope="module")
def full(full_cfg) -> ModelSpec:
    return ModelSpec.from_architecture(plain(full_cfg.architecture))


@pytest.fixture(scope="module")
def meta_model(full_cfg) -> DeepseekOcrForConditionalGeneration:
    """The full-size v1 on the meta device: shapes only, no memory."""
    config = DeepseekOcrConfig.from_architecture(plain(full_cfg.architecture), attn_implementation="sdpa")
    with torch.device("meta"):
        model = DeepseekOcrForConditionalGeneration(config)
    return model.eval()


@pytest.fixture(scope="module")
def tiny_model(compose_model) -> DeepseekOcrForConditionalGeneration:
    """The tiny v1 (random weights, fp32) on the CPU, at the real view sizes."""
    cfg = compose_model("model=deepseek_ocr_tiny")
    config = DeepseekOcrConfig.from_architecture(plain(cfg.architecture), attn_implementation="sdpa")
    torch.manual_seed(0)
    return DeepseekOcrForConditionalGeneration(config).eval()


@pytest.fixture(scope="module")
def tiny(tiny_model) -> ModelSpec:
    return ModelSpec.from_config(tiny_model.config)


def _counted(modules: Any, prefix: str) -> float:
    return sum(m.flops for m in modules if m.counted and m.name.startswith(prefix))


def _relerr(analytic: float, counted: float) -> float:
    return abs(analytic - counted) / counted


# ---- the spec ------------------------------------------------------------------------------------------------
def test_spec_reads_either_config(full, full_cfg, meta_model, tiny, compose_model) -> None:
    assert isinstance(full.encoder, ClipSpec) and full.image_newline
    assert full.vision_stages == V1_STAGES
    assert (full.encoder.hidden, full.encoder.layers, full.encoder.heads, full.encoder.intermediate) == (
        1024,
        24,
        16,
        4096,
    )
    assert (full.projector_in, full.projector_out, full.sam.downsample_channels) == (2048, 1280, (512, 1024))
    assert ModelSpec.from_config(meta_model.config) == full
    assert ModelSpec.from_architecture(plain(compose_model("model=deepseek_ocr_tiny").architecture)) == tiny
    # the OCR-2 config still gives the Qwen2-style encoder and no newlines
    ocr2 = ModelSpec.from_architecture(plain(compose_model("model=deepseek_ocr2").architecture))
    assert ocr2.vision_stages == ("vision/sam", "vision/encoder", "vision/projector") and not ocr2.image_newline


def test_stage_names_match_the_v1_adapter(full) -> None:
    """Stage 1 pairs the analytic stages with the adapter's measured ones by name."""
    from llm_perf_opt.session.adapters.deepseek_ocr import DeepseekOcrAdapter

    assert tuple(DeepseekOcrAdapter.vision_stage_modules) == full.vision_stages


# ---- (1) reference per-view GFLOPs (deepseek-ocr-facts §4) ----------------------------------------------------
# (view side, module-name prefix, GFLOPs as printed, printed decimals)
_REFERENCE_VIEW = [
    (512, "sam.", 228.3, 1),
    (512, "clip.", 39.7, 1),
    (512, "projector", 0.34, 2),
    (512, "", 268.3, 1),
    (640, "sam.", 325.6, 1),
    (640, "clip.", 62.0, 1),
    (640, "projector", 0.52, 2),
    (640, "", 388.2, 1),
    (1024, "sam.", 976.9, 1),
    (1024, "clip.", 161.7, 1),
    (1024, "projector", 1.34, 2),
    (1024, "", 1140.0, 1),
    (1024, "sam.net_3", 2.4, 1),  # v1's net_3 is 512 -> 1024 channels (OCR-2: 896, 2.1)
    (1280, "sam.", 1683.1, 1),
    (1280, "clip.", 258.0, 1),
    (1280, "projector", 2.10, 2),
    (1280, "", 1943.2, 1),
]


@pytest.mark.parametrize(("side", "part", "gflops", "decimals"), _REFERENCE_VIEW)
def test_per_view_gflops_match_the_reference(full, side, part, gflops, decimals) -> None:
    value = _counted(vision_view(full, side), part) / G
    # half a unit of the last printed digit; the 1e-6 relative slack covers the reference rounding its sums
    # (at 640 px the total is 388.1498 GFLOPs, printed 388.2)
    assert abs(value - gflops) <= 0.5 * 10**-decimals + 1e-6 * gflops


def test_decoder_is_the_shared_one(full) -> None:
    """Same decoder as OCR-2 (reference §4): 1.148 GFLOPs/token with lm_head, 61,440 KV bytes/token in bf16."""
    step = decode_step(full, context=1000)
    assert (step.matmul_flops - 4 * full.text.layers * full.text.heads * full.text.head_dim * 1000) / G == (
        pytest.approx(1.148, abs=5e-4)
    )
    assert full.text.kv_bytes_per_token * 2 == 61_440
    assert step.weight_bytes / G == pytest.approx(1.148, abs=1e-3)


# ---- (3) image tokens per mode ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("mode", "tokens"), [("tiny", 73), ("small", 111), ("base", 273), ("large", 421)])
def test_image_tokens_per_mode(full, full_cfg, mode, tokens) -> None:
    work = Workload(text_tokens=12).with_mode(mode_from_config(mode, plain(full_cfg.modes)), (2, 3))
    assert work.tiles == 0  # no crop mode: one view whatever the page
    assert work.image_tokens(full) == tokens
    assert work.prompt_tokens(full) == 1 + tokens + 12


@pytest.mark.parametrize("grid", [(1, 1), (2, 1), (1, 2), (2, 2), (2, 3), (3, 2), (3, 3), (1, 4)])
def test_gundam_image_tokens_follow_the_crop_grid(full, full_cfg, grid) -> None:
    mode = mode_from_config("gundam", plain(full_cfg.modes))
    work = Workload().with_mode(mode, grid)
    n_w, n_h = grid
    expected = 273 + (10 * n_h) * (10 * n_w + 1) if grid != (1, 1) else 273
    assert work.tiles == (n_w * n_h if grid != (1, 1) else 0)
    assert work.image_tokens(full) == expected
    assert work.image_tokens(full) == image_token_count(mode, grid)  # the v1 preprocessing agrees
    # Gundam-M (paper: 1280 global view, 1024 tiles): 421 + (16 n_h)(16 n_w + 1)
    gundam_m = Workload(global_size=1280, tile_size=1024, crop_grid=grid)
    assert gundam_m.image_tokens(full) == 421 + ((16 * n_h) * (16 * n_w + 1) if grid != (1, 1) else 0)


def test_a4_page_in_gundam(full) -> None:
    work = Workload(global_size=1024, tile_size=640, crop_grid=(2, 3), text_tokens=12)
    assert (work.tiles, work.image_tokens(full), work.prompt_tokens(full)) == (6, 903, 916)
    # vision per image (reference §4): 1,140 + 388.2 n GFLOPs -> 3.47 TFLOPs at 6 tiles
    vision = sum(prefill(full, work)[s].matmul_flops for s in V1_STAGES)
    assert vision / G == pytest.approx(1140.0 + 6 * 388.2, rel=1e-4)


def test_workload_rejects_an_inconsistent_grid(full) -> None:
    with pytest.raises(ValueError, match="crop_grid"):
        Workload(crop_grid=(2, 3), tiles=5)
    with pytest.raises(ValueError, match="crop_grid"):
        Workload(crop_grid=(0, 3))
    with pytest.raises(ValueError, match="crop_grid"):
        Workload(tile_size=640, tiles=6).image_tokens(full)  # v1 needs the grid, not only the count


# ---- (2) exact agreement with FlopCounterMode: the full-size vision path on meta ---------------------------------
def _count_views(model: DeepseekOcrForConditionalGeneration, side: int, batch: int) -> dict[str, float]:
    """FLOPs of SAM, CLIP and the projector on `batch` views of `side` px, each counted on its own."""
    inner = model.model
    views = torch.empty(batch, 3, side, side, device=next(model.parameters()).device)
    with torch.inference_mode():
        with flop_counter() as sam_count:
            sam = inner.sam_model(views).last_hidden_state
        with flop_counter() as clip_count:
            clip = inner.vision_model(sam)
        fused = torch.cat([clip[:, 1:], sam.flatten(2).transpose(1, 2)], dim=-1)
        with flop_counter() as projector_count:
            inner.projector(fused)
    counters = (sam_count, clip_count, projector_count)
    return {stage: float(c.get_total_flops()) for stage, c in zip(V1_STAGES, counters, strict=True)}


@pytest.mark.parametrize(("side", "batch"), [(512, 1), (640, 1), (640, 6), (1024, 1), (1280, 1)])
def test_full_size_vision_matches_flop_counter_on_meta(full, meta_model, side, batch) -> None:
    counted = _count_views(meta_model, side, batch)
    modules = vision_view(full, side, batch=batch)
    analytic = dict(zip(V1_STAGES, (_counted(modules, p) for p in ("sam.", "clip.", "projector")), strict=True))
    for stage in V1_STAGES:
        assert _relerr(analytic[stage], counted[stage]) < EXACT, stage


def test_weight_bytes_are_the_real_parameters(full, meta_model) -> None:
    """At 1 byte per parameter, prefill reads every parameter once (global view only) except the embedding (one row
    per prompt token) and CLIP's patch embedding, which v1 never runs."""
    params = {name: p.numel() for name, p in meta_model.named_parameters()}
    assert sum(params.values()) == 3_336_106_240  # reference §1.5
    work = Workload(global_size=1024, text_tokens=12, dtype_bytes=1)
    hidden = full.text.hidden
    unused = params["model.vision_model.embeddings.patch_embedding.weight"]
    expected = sum(params.values()) - full.text.vocab * hidden + work.prompt_tokens(full) * hidden - unused
    assert prefill(full, work)["prefill"].weight_bytes == pytest.approx(expected, rel=1e-9)


# ---- (2) exact agreement with FlopCounterMode: the tiny model end to end ------------------------------------------
_DECODE_STEPS = 3
_TINY_CASES = {
    "gundam 1x1 (no tiles)": Workload(global_size=1024, tile_size=640, crop_grid=(1, 1), text_tokens=6, new_tokens=4),
    "gundam 2x3": Workload(global_size=1024, tile_size=640, crop_grid=(2, 3), text_tokens=6, new_tokens=4),
    "tiny mode": Workload(global_size=512, tile_size=512, text_tokens=6, new_tokens=4),
}
_MODULE_OF_STAGE = {
    "vision/sam": "model.sam_model",
    "vision/clip": "model.vision_model",
    "vision/projector": "model.projector",
}


def _run_tiny(model: DeepseekOcrForConditionalGeneration, spec: ModelSpec, work: Workload) -> dict[str, Any]:
    """Prefill (per stage) and each decode step of `work`, counted; the prompt is laid out by the Workload. The
    rotary table's matmul that older transformers count (helpers.rope_table_flops) is taken out of the totals."""
    config = model.config
    ids = [0] + [config.image_token_id] * work.image_tokens(spec) + [1000 + i for i in range(work.text_tokens)]
    local = torch.randn(work.tiles, 3, work.tile_size, work.tile_size) if work.tiles else None
    inputs = {
        "input_ids": torch.tensor([ids]),
        "pixel_values": torch.randn(1, 3, work.global_size, work.global_size),
        "pixel_values_local": local,
        "crop_grid": work.crop_grid,
    }
    with torch.inference_mode():
        with flop_counter() as counter:
            out = model(**inputs, use_cache=True, logits_to_keep=1)
        by_module = counter.get_flop_counts()
        root = type(model).__name__
        counts: dict[str, Any] = {
            stage: float(sum(by_module[f"{root}.{path}"].values())) for stage, path in _MODULE_OF_STAGE.items()
        }
        decoder = model.model.language_model
        counts["prefill"] = float(counter.get_total_flops() - rope_table_flops(decoder, len(ids)))
        counts["steps"] = []
        for _ in range(_DECODE_STEPS):
            token = out.logits.argmax(-1)
            with flop_counter() as counter:
                out = model(input_ids=token, use_cache=True, logits_to_keep=1, **cache_kwargs(output_cache(out)))
            counts["steps"].append(float(counter.get_total_flops() - rope_table_flops(decoder, 1)))
    return counts


@pytest.fixture(scope="module")
def tiny_counts(tiny_model, tiny) -> dict[str, dict[str, Any]]:
    return {name: _run_tiny(tiny_model, tiny, work) for name, work in _TINY_CASES.items()}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(_TINY_CASES))
def test_tiny_model_matches_flop_counter(tiny, tiny_counts, case) -> None:
    work = _TINY_CASES[case]
    assert work.new_tokens == _DECODE_STEPS + 1  # the first new token comes out of prefill
    counted = tiny_counts[case]
    analytic = stage_costs(tiny, work)
    assert set(analytic) == {*V1_STAGES, "prefill", "decode"}
    for stage in (*V1_STAGES, "prefill"):
        assert _relerr(analytic[stage].matmul_flops, counted[stage]) < EXACT, stage
    prompt = work.prompt_tokens(tiny)
    for i, steps in enumerate(counted["steps"], start=1):
        assert _relerr(decode_step(tiny, prompt + i, work.dtype_bytes).matmul_flops, steps) < EXACT, i
    assert _relerr(analytic["decode"].matmul_flops, sum(counted["steps"])) < EXACT
    assert counted["steps"][1] > counted["steps"][0]  # each step attends one more key


def test_tiles_add_vision_work_and_newlines(tiny, tiny_counts) -> None:
    """2x3 tiles: six more views through SAM and CLIP, and 6·g² tile features + one newline per stitched row."""
    one, six = _TINY_CASES["gundam 1x1 (no tiles)"], _TINY_CASES["gundam 2x3"]
    assert six.image_tokens(tiny) - one.image_tokens(tiny) == (3 * 10) * (2 * 10 + 1)
    # the tiles run as one batch of six 640-px views: six times one such view, on top of the global view
    for stage, prefix in (("vision/sam", "sam."), ("vision/clip", "clip.")):
        added = tiny_counts["gundam 2x3"][stage] - tiny_counts["gundam 1x1 (no tiles)"][stage]
        assert added == 6 * _counted(vision_view(tiny, 640), prefix) > 0, stage
    layout = {m.name: m for m in prefill(tiny, six)["prefill"].modules if m.name.startswith("image_features.")}
    assert set(layout) == {"image_features.newlines", "image_features.masked_scatter"}
    assert layout["image_features.newlines"].weight_bytes == tiny.text.hidden * six.dtype_bytes  # the newline vector


# ---- analytic-report model=deepseek_ocr ------------------------------------------------------------------------
@pytest.mark.slow
def test_report_command_prices_v1(tmp_path: Path) -> None:
    out = tmp_path / "an"
    # In this process: test_analytic_report runs the real analytic-report process.
    done = run_main("llm_perf_opt.cli.analytic", "model=deepseek_ocr", f"hydra.run.dir={out}")
    assert done.returncode == 0, done.stderr[-2000:]
    r = json.loads((out / "static_analysis/analytic_model/report.json").read_text())
    w = r["workload"]
    assert (w["mode"], w["crop_grid"], w["tiles"], w["image_tokens"], w["prompt_tokens"]) == (
        "gundam",
        [2, 3],
        6,
        903,
        916,
    )
    stages = r["stages"]
    assert set(stages) == {*V1_STAGES, "prefill", "decode"}
    # reference §4: the 1024 global view + 6 tiles of 640 px
    for stage, global_view, tile in (("vision/sam", 976.9, 325.6), ("vision/clip", 161.7, 62.0)):
        assert stages[stage]["matmul_flops"] / G == pytest.approx(global_view + 6 * tile, abs=0.05 * 7), stage
    assert stages["vision/projector"]["matmul_flops"] / G == pytest.approx(1.34 + 6 * 0.52, abs=0.005 * 7)
    assert stages["decode"]["weight_bytes"] == pytest.approx(31 * 1.148e9, rel=0.01)  # 31 steps of 1.148 GB
    rows = r["mode_sweep"]["rows"]
    assert "tile_sweep" not in r
    assert [row["label"] for row in rows] == [
        "tiny",
        "small",
        "base",
        "large",
        "gundam 1x1",
        "gundam 2x1",
        "gundam 2x2",
        "gundam 2x3",
        "gundam 3x3",
    ]
    assert [row["image_tokens"] for row in rows] == [73, 111, 273, 421, 273, 483, 693, 903, 1203]
    assert [row["label"] for row in rows if row["configured"]] == ["gundam 2x3"]
    configured = next(row for row in rows if row["configured"])
    assert configured["prefill_flops"] == stages["prefill"]["matmul_flops"]
    assert rows[4]["prefill_flops"] == rows[2]["prefill_flops"]  # a page that fits one tile: Gundam = Base
    gundam = [row["prefill_flops"] for row in rows[4:]]
    assert gundam == sorted(gundam)
    md = (out / "static_analysis/analytic_model/report.md").read_text()
    assert "mode gundam: global view 1024 px + 2x3 tiles of 640 px → 903 image tokens" in md
    assert "What-if: resolution modes and Gundam crop grids" in md and "gundam 2x3 (this workload)" in md
    assert json.loads((out / "run_status.json").read_text())["state"] == "complete"


def test_named_v1_workload_and_modes() -> None:
    r = build_report(command_config(compose_config("analytic", "model=deepseek_ocr", "workload=ocr1-a4-page")))
    assert r.workload_profile is not None and r.workload_profile["name"] == "ocr1-a4-page"
    assert (r.workload.image_tokens, r.workload.new_tokens) == (903, 256)
    base = build_report(command_config(compose_config("analytic", "model=deepseek_ocr", "model.mode=base"))).workload
    assert (base.mode, base.tiles, base.crop_grid, base.image_tokens) == ("base", 0, None, 273)
    with pytest.raises(UserError, match=r"analytic\.crop_grid"):
        build_report(command_config(compose_config("analytic", "model=deepseek_ocr", "analytic.crop_grid=[2]")))
    with pytest.raises(UserError, match=r"model\.mode=huge"):
        build_report(command_config(compose_config("analytic", "model=deepseek_ocr", "model.mode=huge")))
