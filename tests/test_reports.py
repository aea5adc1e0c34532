"""Report building blocks: number formats and tables, grounding boxes and thumbnails, and the findings and
recommendations derived from (synthetic) measured numbers."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest
from PIL import Image

from llm_perf_opt.hardware.table import PeakFigure
from llm_perf_opt.measure.advice import advise
from llm_perf_opt.measure.aggregate import stage_stats
from llm_perf_opt.measure.mfu import mfu_by_stage
from llm_perf_opt.measure.stage_flops import StageFlops
from llm_perf_opt.measure.throughput import throughput
from llm_perf_opt.measure.variation import stage_variation
from llm_perf_opt.records import io
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.folders import load_stage1_metrics
from llm_perf_opt.records.stage1 import DeviceInfo, ImageRecord, ModelFamily, ModelInfo, RunSettings, Stage1Metrics
from llm_perf_opt.records.vocabulary import E2E, TTFT
from llm_perf_opt.report import gallery, markdown
from llm_perf_opt.report.recommendations import key_findings, notes
from llm_perf_opt.session.adapters.registry import make_adapter

# ---- markdown ------------------------------------------------------------------------------------------------


def test_flops_format() -> None:
    assert markdown.flops(1.5e12) == "1.5 TFLOP"
    assert markdown.flops(2.5e9) == "2.5 GFLOP"
    assert markdown.flops(3.389e15) == "3.39 PFLOP"
    assert markdown.flops(1_234_000.0) == "1.23 MFLOP"
    assert markdown.flops(999) == "999 FLOP"
    assert markdown.flops(0) == "0 FLOP"
    assert markdown.flops(-2e9) == "-2 GFLOP"
    assert markdown.flops(None) == "n/a"


def test_flops_format_at_a_unit_boundary() -> None:
    text = markdown.flops(999.9e9)
    assert "e+" not in text
    assert text.endswith(" TFLOP")


def test_pct_ms_and_bytes_formats() -> None:
    assert markdown.pct(0.1234) == "12.3%"
    assert markdown.pct(0.5, digits=0) == "50%"
    assert markdown.pct(None) == "n/a"
    assert markdown.ms(1234.56) == "1,234.6"
    assert markdown.ms(0.123, digits=3) == "0.123"
    assert markdown.ms(None) == "n/a"
    assert markdown.num_bytes(100) == "100 B"
    assert markdown.num_bytes(1536) == "1.50 KiB"
    assert markdown.num_bytes(5 * 2**20) == "5.00 MiB"
    assert markdown.num_bytes(6.78e9) == "6.31 GiB"
    assert markdown.num_bytes(None) == "n/a"


def _gfm_cells(line: str) -> list[str]:
    """The cells of one GFM table row, split the way GitHub does: a backslash escapes the next character."""
    cells, cell, i = [], "", 1 if line.startswith("|") else 0
    while i < len(line):
        char = line[i]
        if char == "\\" and i + 1 < len(line):
            cell += line[i : i + 2]
            i += 2
            continue
        if char == "|":
            cells.append(cell)
            cell = ""
        else:
            cell += char
        i += 1
    if cell:
        cells.append(cell)
    return cells


def test_doc_structure_and_table() -> None:
    doc = markdown.Doc("Stage 1 report")
    doc.h2("Timings")
    doc.table(["stage", "p50 (ms)"], [["prefill", markdown.ms(12.0)], ["decode", "3.0"]])
    doc.h3("Nothing")
    doc.table(["stage"], [])
    doc.bullets(["first", "second"])
    doc.para("closing words")
    text = doc.text()
    assert text.startswith("# Stage 1 report\n")
    assert "\n## Timings\n" in text
    assert "\n### Nothing\n" in text
    assert "|stage|p50 (ms)|" in text
    assert "|prefill|12.0|" in text
    assert "_(none)_" in text
    assert "- first\n- second" in text
    assert text.endswith("closing words\n")


def test_doc_table_escapes_pipes() -> None:
    doc = markdown.Doc("t")
    doc.table(["name", "value"], [["a|b", "1"]])
    row = next(line for line in doc.text().splitlines() if line.startswith("|a"))
    assert "a|b|" not in row  # the pipe is escaped, not left bare
    assert "\\|" in row


def test_doc_table_pipe_stays_in_one_cell() -> None:
    doc = markdown.Doc("t")
    doc.table(["name", "value"], [["a|b", "1"]])
    row = next(line for line in doc.text().splitlines() if line.startswith("|a"))
    assert _gfm_cells(row) == ["a\\|b", "1"]


# ---- gallery ------------------------------------------------------------------------------------------------

GROUNDING = "<|ref|>title<|/ref|><|det|>[[10, 20, 500, 80]]<|/det|>"


def test_parse_boxes_grounding_string() -> None:
    (box,) = gallery.parse_boxes(GROUNDING)
    assert box == gallery.GroundingBox("title", 10.0, 20.0, 500.0, 80.0)
    text = (
        "# Heading\n<|ref|> text <|/ref|><|det|>[[1, 2, 3, 4], [5.5, 6, 7, 8]]<|/det|>\nbody\n"
        "<|ref|>table<|/ref|>\n<|det|>[[100, 200, 900, 950]]<|/det|>"
    )
    boxes = gallery.parse_boxes(text)
    assert [(b.label, b.x1, b.y2) for b in boxes] == [("text", 1.0, 4.0), ("text", 5.5, 8.0), ("table", 100.0, 950.0)]
    assert gallery.count_boxes(text) == 3


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "plain text without grounding",
        "<|ref|>title<|/ref|><|det|>[[10, 20, 500]]<|/det|>",  # three coordinates
        "<|ref|>title<|/ref|><|det|>[[10, 20, 500, 80<|/det|>",  # unclosed list
        "<|ref|>title<|/ref|><|det|>[['a', 'b', 'c', 'd']]<|/det|>",  # not numbers
        "<|ref|>title<|/ref|><|det|>[[10, 20, 500, 80]]",  # no closing det tag
        "<|ref|>title<|/ref|><|det|>__import__('os')<|/det|>",  # never evaluated
    ],
)
def test_parse_boxes_malformed(text) -> None:
    assert gallery.parse_boxes(text) == []
    assert gallery.count_boxes(text) == 0


def test_parse_boxes_keeps_good_boxes_next_to_bad_ones() -> None:
    text = "<|ref|>a<|/ref|><|det|>[[1, 2]]<|/det|> <|ref|>b<|/ref|><|det|>[[1, 2, 3, 4], [9]]<|/det|>"
    assert gallery.parse_boxes(text) == [gallery.GroundingBox("b", 1.0, 2.0, 3.0, 4.0)]


def _is_red(pixel: tuple[int, int, int]) -> bool:
    r, g, b = pixel
    return r > 150 and g < 120 and b < 120


def test_thumbnail_with_boxes_draws_red_box(tmp_path: Path) -> None:
    page = tmp_path / "page.png"
    Image.new("RGB", (1000, 500), "white").save(page)
    target = gallery.thumbnail_with_boxes(page, GROUNDING, tmp_path / "thumbs" / "page.png")
    assert target == tmp_path / "thumbs" / "page.png"
    with Image.open(target) as image:
        assert image.format == "PNG"
        assert image.size == (gallery.THUMB_WIDTH, 240) == (480, 240)
        rgb = image.convert("RGB")
    # The box spans x 10/999..500/999 and y 20/999..80/999 of the thumbnail: about (4.8, 4.8)-(240, 19).
    assert _is_red(rgb.getpixel((120, 5)))  # top edge
    assert _is_red(rgb.getpixel((120, 19)))  # bottom edge
    assert _is_red(rgb.getpixel((5, 12)))  # left edge
    assert _is_red(rgb.getpixel((240, 12)))  # right edge
    assert rgb.getpixel((200, 12)) == (255, 255, 255)  # inside, past the label
    red = [(x, y) for x in range(rgb.width) for y in range(rgb.height) if _is_red(rgb.getpixel((x, y)))]
    assert red
    assert all(3 <= x <= 242 and 3 <= y <= 21 for x, y in red)  # nothing drawn outside the box


def test_thumbnail_without_boxes_is_just_the_page(tmp_path: Path) -> None:
    page = tmp_path / "page.png"
    Image.new("RGB", (960, 1200), "white").save(page)
    target = gallery.thumbnail_with_boxes(page, "no boxes here", tmp_path / "t.png")
    with Image.open(target) as image:
        assert image.size == (480, 600)
        assert image.convert("RGB").getcolors() == [(480 * 600, (255, 255, 255))]


# ---- findings and recommendations ---------------------------------------------------------------------------

VISION = ("vision/sam", "vision/encoder", "vision/projector")
STAGES = (vocab.PREFILL, *VISION, vocab.DECODE)


def _record(pre, vision, prefill, steps, repeat=0, image="page.png") -> ImageRecord:
    decode = sum(steps)
    return ImageRecord(
        image=image,
        repeat=repeat,
        preprocess_ms=pre,
        prefill_ms=prefill,
        vision_ms=dict(zip(VISION, vision, strict=True)),
        decode_ms=decode,
        decode_step_ms=tuple(steps),
        new_tokens=len(steps) + 1,
        prompt_tokens=1128,
        image_tokens=1121,
        tiles=6,
        peak_memory_bytes=None,
    )


def _metrics(records, device, flops, peak, experts="grouped_mm", efficiency=()) -> Stage1Metrics:
    fields = dict(
        schema_version="1.0",
        run_id="test",
        stage="stage1",
        created="2025-01-01T00:00:00",
        model=ModelInfo(
            name="deepseek_ocr2",
            adapter="deepseek_ocr2",
            class_name="DeepseekOcr2ForConditionalGeneration",
            parameters=3_389_119_360,
            dtype="bfloat16",
            attn_implementation="sdpa",
            experts_implementation=experts,
            weights="random",
            weights_detail="random weights",
            config_source="test",
            preprocess={},
        ),
        device=device,
        settings=RunSettings(repeats=5, warmup=2, max_new_tokens=32, max_images=None, sources={}),
        records=tuple(records),
        stages=stage_stats(records, VISION),
        variation=stage_variation(records, VISION),
        per_image={},
        throughput=throughput(records),
        mfu=mfu_by_stage(records, {"page.png": flops}, STAGES, peak),
        efficiency=tuple(efficiency),
        flops_per_image={},
        top_operators=(),
        operator_sort_key=None,
        warnings=(),
        config_digest="0",
    )
    # Fields the recommendations do not read (e.g. profiler details) are left empty.
    fields.update(
        {f.name: None for f in attrs.fields(Stage1Metrics) if f.name not in fields and f.default is attrs.NOTHING}
    )
    return Stage1Metrics(**fields)


H100 = DeviceInfo(type="cuda", name="NVIDIA H100 80GB HBM3", index=0, timing_method="CUDA events")
H100_PEAK = PeakFigure(
    value=989e12, unit="FLOP/s", dtype_key="bf16", source="datasheet (test)", device_name="NVIDIA H100"
)
GPU_FLOPS = StageFlops(
    prefill=6.0e12,
    vision={"vision/sam": 4.0e12, "vision/encoder": 1.0e12, "vision/projector": 1.0e9},
    decode_step_base=1.148e9,
    decode_step_per_ctx=61440.0,
    prompt_tokens=1128,
    by_operator={},
)


@pytest.fixture
def gpu_decode_bound() -> Stage1Metrics:
    """Per pass: preprocess 20 ms, prefill 100 ms (vision 30 + 9 + 1), 31 decode steps of 20 ms: e2e 740 ms."""
    records = [_record(20.0, (30.0, 9.0, 1.0), 100.0, [20.0] * 31, repeat=r) for r in range(3)]
    return _metrics(records, H100, GPU_FLOPS, H100_PEAK)


def test_aggregates_of_the_synthetic_run(gpu_decode_bound) -> None:
    m = gpu_decode_bound
    by_name = {s.stage: s for s in m.stages}
    assert list(by_name) == [vocab.PREPROCESS, vocab.PREFILL, *VISION, TTFT, vocab.DECODE, vocab.DECODE_STEP, E2E]
    assert by_name["vision/sam"].nested_in == vocab.PREFILL
    assert by_name[vocab.DECODE_STEP].nested_in == vocab.DECODE
    assert by_name[vocab.PREFILL].nested_in is None
    assert by_name[vocab.DECODE_STEP].summary.n == 3  # one value per pass (its mean step), not one per step
    assert by_name[E2E].summary.p50 == pytest.approx(740.0)
    assert by_name[TTFT].summary.p50 == pytest.approx(120.0)
    assert m.throughput.decode_tokens_per_s == pytest.approx(50.0)
    assert m.throughput.e2e_images_per_s == pytest.approx(1 / 0.740)
    assert m.throughput.e2e_tokens_per_s == pytest.approx(32 / 0.740)
    mfu = {r.stage: r for r in m.mfu}
    assert list(mfu) == list(STAGES)
    assert mfu[vocab.PREFILL].flops_total == pytest.approx(3 * 6.0e12)
    assert mfu[vocab.PREFILL].time_total_ms == pytest.approx(300.0)
    assert mfu[vocab.PREFILL].achieved_tflops == pytest.approx(60.0)
    assert mfu[vocab.PREFILL].mfu == pytest.approx(60e12 / 989e12)
    assert mfu[vocab.DECODE].flops_total == pytest.approx(3 * GPU_FLOPS.decode_total(32))


def test_key_findings_gpu_decode_bound(gpu_decode_bound) -> None:
    findings = key_findings(gpu_decode_bound)
    assert len(findings) == 3
    where, vision, efficiency = findings
    assert where.startswith("Where time goes: 740.0 ms end to end per image (mean over passes; median 740.0 ms)")
    # Largest share first.
    assert re.search(
        r"decode 84% \(620\.0 ms, 20\.00 ms/token\), prefill 14% \(100\.0 ms\), preprocess 3% \(20\.0 ms\)", where
    )
    assert "vision takes 40% (sam 30%, encoder 9%, projector 1%)" in vision
    assert "other 60%" in vision
    decode_tflops = GPU_FLOPS.decode_total(32) / 0.62 / 1e12
    assert f"prefill runs at 60.0 TFLOP/s = {60e12 / 989e12:.1%} MFU" in efficiency
    assert f"decode at {decode_tflops:,.2f} TFLOP/s = {decode_tflops * 1e12 / 989e12:.2%} MFU" in efficiency


def test_advice_gpu_decode_bound(gpu_decode_bound) -> None:
    """No floors priced and no profiled pass: only a larger batch (memory headroom) is advised; the host's 20 ms of
    preprocessing are under 5% of the page's 740 ms; the experts already run grouped_mm, so no experts advice."""
    advice = advise(gpu_decode_bound)
    assert {a.kind for a in advice} == {"batch"}
    batch = next(a for a in advice if a.kind == "batch")
    assert batch.overrides == ("run.batch_size=8", "run.fill_batches=true")  # one input: copies fill the batch
    assert batch.bound_ms == pytest.approx(620.0 * (1 - 1 / 8))
    assert not any("experts_implementation" in a.lever for a in advice)
    assert not any(n.startswith("Run-to-run variation") for n in notes(gpu_decode_bound))  # identical repeats


AHEAD = ("overlap_preprocess", "runtime.prefetch_pages=true")


@pytest.mark.usefixtures("frozen_calibration")  # the rules, not today's calibration (which may rule a kind out)
@pytest.mark.parametrize(
    ("device", "expected"),
    [
        (None, [AHEAD]),
        ("cpu", [("gpu_preprocess", "model.preprocess.device=cuda"), AHEAD]),
        ("cuda", [AHEAD]),  # the views on the GPU already: the page files are still decoded on the host
    ],
)
def test_preprocess_advice_follows_where_the_views_were_made(device, expected) -> None:
    """Preprocessing 200 ms of a 900 ms page: made on the GPU where the adapter offers it; wherever it is made, the
    page files decoded ahead while the GPU runs the previous pass (`runtime.prefetch_pages`), unless that was on."""
    records = [_record(200.0, (30.0, 9.0, 1.0), 100.0, [20.0] * 31, repeat=r) for r in range(3)]
    m = _metrics(records, H100, GPU_FLOPS, H100_PEAK)
    m = attrs.evolve(m, model=attrs.evolve(m.model, preprocess={} if device is None else {"device": device}))
    found = [a for a in advise(m) if a.acts_on == (vocab.PREPROCESS,)]
    assert [(a.kind, a.lever) for a in found] == expected
    assert all(a.bound_ms == pytest.approx(200.0) for a in found)
    on = attrs.evolve(m.settings, runtime=attrs.evolve(m.settings.runtime, prefetch_pages=True))
    assert AHEAD not in [(a.kind, a.lever) for a in advise(attrs.evolve(m, settings=on))]


def test_noise_is_a_note_not_a_lever() -> None:
    prefill = (100.0, 140.0, 70.0)
    records = [_record(20.0, (30.0, 9.0, 1.0), p, [20.0] * 31, repeat=r) for r, p in enumerate(prefill)]
    noisy = next(n for n in notes(_metrics(records, H100, GPU_FLOPS, H100_PEAK)) if n.startswith("Run-to-run"))
    assert "prefill" in noisy
    assert "decode/step" not in noisy  # every step took 20 ms


CPU = DeviceInfo(type="cpu", name="Intel Xeon (test)", index=None, timing_method="time.perf_counter (CPU)")
CPU_FLOPS = StageFlops(
    prefill=3.0e10,
    vision={"vision/sam": 2.5e10, "vision/encoder": 3.0e9, "vision/projector": 1.0e7},
    decode_step_base=1.7e7,
    decode_step_per_ctx=768.0,
    prompt_tokens=1128,
    by_operator={},
)


@pytest.fixture
def cpu_vision_bound() -> Stage1Metrics:
    """Preprocess 50 ms, prefill 2000 ms (vision 1300 + 290 + 10 = 80%), 3 decode steps of 30 ms: e2e 2140 ms."""
    records = [_record(50.0, (1300.0, 290.0, 10.0), 2000.0, [30.0] * 3)]
    return _metrics(records, CPU, CPU_FLOPS, None)


def test_key_findings_cpu(cpu_vision_bound) -> None:
    where, vision, efficiency = key_findings(cpu_vision_bound)
    assert "2,140.0 ms end to end" in where
    assert re.search(r"prefill 93% \(2,000\.0 ms\), decode 4% \(90\.0 ms, 30\.00 ms/token\), preprocess 2%", where)
    assert "vision takes 80% (sam 65%, encoder 14%, projector 0%)" in vision
    assert efficiency.startswith("How efficient: MFU is n/a on Intel Xeon (test) (no dense peak known)")
    assert "prefill achieved 0.015 TFLOP/s" in efficiency


def test_a_cpu_run_gets_notes_and_no_levers(cpu_vision_bound) -> None:
    assert advise(cpu_vision_bound) == ()  # no GPU peaks, so no floors; the GPU levers need a GPU
    first, vision = notes(cpu_vision_bound)
    assert first.startswith("This is a CPU run") and "device=cuda" in first
    assert vision.startswith("Vision is 80% of prefill, mostly SAM (81% of vision)")
    assert "max_tiles" in vision


@pytest.mark.parametrize(
    ("preprocess", "hint"),
    [
        ({"tile_size": 768}, "each 768-px tile adds a full SAM + encoder pass."),
        (
            {"mode": "gundam", "image_size": 640, "crop_mode": True},
            "each 640-px tile adds a full SAM + CLIP pass; model.mode=base runs the global view alone.",
        ),
        ({"mode": "large", "image_size": 1280, "crop_mode": False}, "A smaller mode than model.mode=large cuts it"),
    ],
)
def test_vision_hint_follows_the_preprocessing(cpu_vision_bound, preprocess: dict, hint: str) -> None:
    m = attrs.evolve(cpu_vision_bound, model=attrs.evolve(cpu_vision_bound.model, preprocess=preprocess))
    vision = next(r for r in notes(m) if r.startswith("Vision is"))
    assert hint in vision


def test_short_kernel_names() -> None:
    from llm_perf_opt.kernel_names import short_kernel_name

    assert (
        short_kernel_name("void at::native::elementwise_kernel<128, 4, F>(int, F)") == "at::native::elementwise_kernel"
    )
    assert (
        short_kernel_name("void at::native::(anonymous namespace)::indexSelectSmallIndex<c10::BFloat16>(T)")
        == "at::native::indexSelectSmallIndex"
    )
    assert (
        short_kernel_name("cudnn_generated_fort_native_sdpa_sm90_kernel0_0")
        == "cudnn_generated_fort_native_sdpa_sm90_kernel0_0"
    )
    assert len(short_kernel_name("x" * 500)) == 90


def test_decode_far_from_its_speed_of_light_points_to_launch_overhead() -> None:
    from llm_perf_opt.hardware.table import peak_bandwidth, peak_compute
    from llm_perf_opt.measure.efficiency import efficiency_by_stage

    records = [_record(20.0, (30.0, 9.0, 1.0), 100.0, [20.0] * 31, repeat=r) for r in range(3)]
    compute = peak_compute("NVIDIA H100 80GB HBM3", "bfloat16")
    bandwidth = peak_bandwidth("NVIDIA H100 80GB HBM3")

    class Cost:
        def __init__(self, moved: float) -> None:
            self.bytes = moved

    costs = {"page.png": {"decode": Cost(31 * 1.2e9), "prefill": Cost(3e9)}}
    per_image = {"page.png": {"decode": GPU_FLOPS.decode_total(32), "prefill": GPU_FLOPS.prefill}}
    eff = efficiency_by_stage(records, per_image, costs, ["prefill", "decode"], compute, bandwidth, "counted")
    decode = next(e for e in eff if e.stage == "decode")
    # Three passes of 31 steps, 1.2 GB each at 3.35 TB/s: 33.3 ms of memory traffic against 1,860 ms measured.
    assert decode.bound == "memory"
    assert decode.time_ms == pytest.approx(3 * 620.0)
    assert decode.speed_of_light_ms == pytest.approx(3 * 31 * 1.2e9 / 3.35e12 * 1e3, rel=1e-6)
    assert decode.gap == pytest.approx(decode.time_ms / decode.speed_of_light_ms)
    assert decode.mbu == pytest.approx(3 * 31 * 1.2e9 / 1.86 / 3.35e12)
    prefill = next(e for e in eff if e.stage == "prefill")
    assert prefill.bound == "compute"  # 6 TFLOP / 3 GB = 2000 FLOP/byte, above the H100's ridge of ~295
    # No profiled pass: CUDA graphs are advised on decode's time above its floor, per page.
    graphs = next(
        a for a in advise(_metrics(records, H100, GPU_FLOPS, compute, efficiency=eff)) if a.kind == "cuda_graphs"
    )
    assert graphs.basis == "time above floor"
    assert graphs.bound_ms == pytest.approx(620.0 - decode.speed_of_light_ms / 3)
    assert graphs.overrides == (
        "runtime.kv_cache=static",
        "runtime.compile=decode",
        "runtime.compile_mode=reduce-overhead",
    )


def _image_sources(markdown_text: str) -> list[str]:
    """The `src` of every image a CommonMark parser finds in `markdown_text`."""
    from markdown_it import MarkdownIt

    found = []
    for token in MarkdownIt("commonmark").parse(markdown_text):
        found += [child.attrs["src"] for child in token.children or () if child.type == "image"]
    return [str(src) for src in found]


def test_gallery_links_a_page_with_spaces_in_its_name(tmp_path: Path) -> None:
    """`my page (1).png` gets a thumbnail whose image link a Markdown parser reads and that points at the file."""
    from urllib.parse import unquote

    from llm_perf_opt.artifacts import ArtifactsManager
    from llm_perf_opt.records.folders import load_stage1
    from llm_perf_opt.records.stage1 import Prediction
    from llm_perf_opt.report.stage1_reports import write_gallery

    folder = load_stage1(Path(__file__).parent / "fixtures" / "runs" / "cpu_tiny_v1_stage1")
    name = "my page (1).png"
    page = tmp_path / "pages" / name
    page.parent.mkdir()
    Image.new("RGB", (400, 300), "white").save(page)
    m = attrs.evolve(folder.metrics, records=tuple(attrs.evolve(r, image=name) for r in folder.metrics.records))
    prediction = Prediction(image=name, path=str(page), token_ids=(1, 2), tokens=2, text="text", weights="random")
    art = ArtifactsManager(tmp_path / "run", stage="stage1")
    write_gallery(art, m, [prediction], m.settings.outputs)
    viz = tmp_path / "run" / "viz"
    (source,) = _image_sources((viz / "predictions.md").read_text())
    assert (viz / unquote(source)).is_file()
    assert markdown.link_target("viz/my page (1).png") == "viz/my%20page%20%281%29.png"
    assert markdown.link("a b.png", "a b.png") == "[a b.png](a%20b.png)"


def test_a_gallery_read_on_another_machine_says_its_input_is_not_there(tmp_path: Path) -> None:
    """stage1-report on a folder copied from another machine: no thumbnail for an input it cannot find, and no
    link to one."""
    from llm_perf_opt.artifacts import ArtifactsManager
    from llm_perf_opt.records.folders import load_stage1
    from llm_perf_opt.records.stage1 import Prediction
    from llm_perf_opt.report.stage1_reports import write_gallery

    folder = load_stage1(Path(__file__).parent / "fixtures" / "runs" / "cpu_tiny_v1_stage1")
    m = folder.metrics
    gone = "/elsewhere/src/llm_perf_opt/data/samples/" + m.records[0].image
    prediction = Prediction(image=m.records[0].image, path=gone, token_ids=(1,), tokens=1, text="t", weights="random")
    write_gallery(ArtifactsManager(tmp_path, stage="stage1"), m, [prediction], m.settings.outputs)
    text = (tmp_path / "viz" / "predictions.md").read_text()
    assert f"No thumbnail: the input is not at ${{llo_samples_dir:}}/{m.records[0].image} on this machine" in text
    assert not _image_sources(text) and not list((tmp_path / "viz").glob("*.png"))


def test_a_gallery_input_without_a_timed_pass_says_so(tmp_path: Path) -> None:
    """An input whose output is kept but whose timed records are not (a trimmed copy of a folder): its output is
    shown and the gallery says it has no timing, rather than failing."""
    from llm_perf_opt.artifacts import ArtifactsManager
    from llm_perf_opt.records.folders import load_stage1
    from llm_perf_opt.records.stage1 import Prediction
    from llm_perf_opt.report.stage1_reports import write_gallery

    m = load_stage1(Path(__file__).parent / "fixtures" / "runs" / "cpu_tiny_v1_stage1").metrics
    page = tmp_path / "late.png"
    Image.new("RGB", (64, 48), "white").save(page)
    prediction = Prediction(image="late.png", path=str(page), token_ids=(1,), tokens=1, text="late", weights="random")
    write_gallery(ArtifactsManager(tmp_path / "run", stage="stage1"), m, [prediction], m.settings.outputs)
    text = (tmp_path / "run" / "viz" / "predictions.md").read_text()
    assert "- no timed pass of this input in the record, 1 tokens\n" in text
    assert "```text\nlate\n```" in text


def test_links_to_files_that_are_not_there_are_dropped(tmp_path: Path) -> None:
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "a b.png").write_bytes(b"")
    (tmp_path / "metrics.json").write_text("{}")
    text = (
        "- [metrics.json](metrics.json)\n- [config.yaml](config.yaml)\n\n![there](plots/a%20b.png)\n"
        "![gone](plots/gone.png)\n[site](https://example.org/x) [top](#files) [me](report.md) "
        "`[code](span.md)`\n```text\n[model output](fenced.md)\n```\n"
    )
    assert markdown.present_links(text, tmp_path, own="report.md") == (
        "- [metrics.json](metrics.json)\n- config.yaml\n\n![there](plots/a%20b.png)\n"
        "\n[site](https://example.org/x) [top](#files) [me](report.md) "
        "`[code](span.md)`\n```text\n[model output](fenced.md)\n```\n"
    )
    assert markdown.present(tmp_path, ["metrics.json", "config.yaml", "plots/a b.png", "metrics.json"]) == [
        "metrics.json",
        "plots/a b.png",
    ]


def test_the_bundled_samples_read_the_same_on_every_machine() -> None:
    assert markdown.bundled_samples(
        "under `/srv/x/src/llm_perf_opt/data/samples`, list /a/llm_perf_opt/data/samples/l.txt"
    ) == ("under `${llo_samples_dir:}`, list ${llo_samples_dir:}/l.txt")
    assert markdown.bundled_samples("/data/my_pages") == "/data/my_pages"  # a user's own folder is theirs to see


@pytest.mark.parametrize(
    ("family", "hint"),
    [
        (ModelFamily("hf"), ": fewer image tokens (a smaller input resolution in the processor) cut it in proportion."),
        (
            ModelFamily("deepseek_ocr2", tiled_views=True, tiling=True, tile_px=768),
            "each 768-px tile adds a full SAM + encoder pass.",
        ),
        (
            ModelFamily("deepseek_ocr2", tiled_views=True, tiling=False, tile_px=768),
            "The pages ran as one global view each (no tiles)",
        ),
        (
            ModelFamily("deepseek_ocr", tiled_views=True, has_modes=True, mode="large", encoder="CLIP"),
            "A smaller mode than model.mode=large cuts it",
        ),
    ],
)
def test_vision_hint_follows_the_described_family_not_the_preprocessing_keys(
    cpu_vision_bound, family: ModelFamily, hint: str
) -> None:
    """A folder whose adapter described its family: the hint reads those facts, whatever the preprocessing dict
    holds (here v1's keys, which an older folder's probing would take for v1 Gundam with tiles)."""
    v1_keys = {"mode": "gundam", "image_size": 640, "crop_mode": True}
    model = attrs.evolve(cpu_vision_bound.model, preprocess=v1_keys, family=family)
    records = [attrs.evolve(r, tiles=2) for r in cpu_vision_bound.records]
    m = attrs.evolve(cpu_vision_bound, model=model, records=records)
    vision = next(r for r in notes(m) if r.startswith("Vision is"))
    assert hint in vision


def test_an_older_folder_probes_its_family_from_the_preprocessing_keys() -> None:
    v1 = ModelFamily.probed("deepseek_ocr", {"mode": "gundam", "image_size": 640, "crop_mode": True})
    assert v1 == ModelFamily("deepseek_ocr", True, True, 640, True, "gundam", "CLIP")
    v2 = ModelFamily.probed("deepseek_ocr2", {"tile_size": 768, "crop_to_patches": True})
    assert v2 == ModelFamily("deepseek_ocr2", True, True, 768, False, None, "encoder")
    assert ModelFamily.probed("hf", {"mode": "base"}) == ModelFamily("hf")


@pytest.mark.parametrize("model", ["deepseek_ocr_tiny", "deepseek_ocr2_tiny", "deepseek_ocr", "deepseek_ocr2", "hf"])
def test_adapters_describe_the_family_older_folders_are_probed_as(compose_model, model: str) -> None:
    """A new run's family facts equal what the reports guessed from the same run's preprocessing keys (the
    shipped configs), so a run re-rendered from an older folder says the same thing as a new one."""
    adapter = make_adapter(compose_model(f"model={model}"))
    described = adapter.model_family()
    assert described == ModelFamily.probed(adapter.settings.adapter, adapter.preprocess_settings())


def test_the_model_family_round_trips(cpu_vision_bound, tmp_path: Path) -> None:
    family = ModelFamily("deepseek_ocr2", tiled_views=True, tiling=True, tile_px=768)
    m = attrs.evolve(cpu_vision_bound, model=attrs.evolve(cpu_vision_bound.model, family=family))
    assert load_stage1_metrics(io.save(m, tmp_path / "metrics.json")).model.family == family
