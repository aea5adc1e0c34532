"""A batch larger than memory allows is refused before its first pass, naming the largest that fits
(`measure.batch_fit`, `pipeline.stage1_batch_fit`): the arithmetic, the tiny model's analytic terms, and stage1-run on
the CPU with a fake free-memory figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llm_perf_opt.analytic.model import ModuleCost, StageCost
from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import command_config
from llm_perf_opt.errors import UserError
from llm_perf_opt.instruments import memory as device_memory
from llm_perf_opt.measure.batch_fit import ACTIVATION_MARGIN, BatchFit, activation_terms
from llm_perf_opt.measure.memory_figures import kv_bytes_per_token
from llm_perf_opt.pipeline import stage1_batch_fit
from llm_perf_opt.pipeline.stage1 import Stage1Run
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.folders import read_status

GIB = 2**30
MIB = 2**20


def _fit(
    batch: int, free_gib: float, *, kv_mib: float = 100.0, decoder_mib: float = 50.0, vision_mib: float = 0.0
) -> BatchFit:
    """6 GiB of weights and `free_gib` free beside them; per page about `kv_mib` of KV cache (1,000 positions) and
    `decoder_mib` of decoder activations; `vision_mib` for one page's vision."""
    return BatchFit(
        batch_size=batch,
        free_bytes=int(free_gib * GIB),
        weights_bytes=6 * GIB,
        kv_bytes_per_token=int(kv_mib * MIB / 1000),
        context_tokens=1000,
        decoder_activation_bytes=decoder_mib * MIB,
        vision_activation_bytes=vision_mib * MIB,
        activation_source="test",
    )


def test_the_largest_batch_is_the_free_memory_over_the_per_page_cost() -> None:
    fit = _fit(128, 10.0)  # 10 GiB free, ~150 MiB per page: 68 fit
    per_page = fit.kv_bytes_per_page + fit.decoder_activation_bytes
    assert fit.max_batch == int(10 * GIB // per_page) == 68
    assert fit.needed_bytes(fit.max_batch) <= fit.available_bytes < fit.needed_bytes(fit.max_batch + 1)
    assert fit.available_bytes == 16 * GIB  # the loaded weights + what is free beside them
    assert not fit.fits and _fit(fit.max_batch, 10.0).fits


def test_vision_runs_one_page_at_a_time_so_its_activations_do_not_grow_with_the_batch() -> None:
    fit = _fit(4, 2.0, kv_mib=100.0, decoder_mib=10.0, vision_mib=1024.0)  # a large SAM activation, once
    assert fit.activation_bytes(4) == 1024.0 * MIB  # max(4 × 10 MiB, 1 GiB)
    assert fit.activation_bytes(200) == 200 * 10.0 * MIB
    assert fit.max_batch == int((2 * GIB - GIB) // (100.0 * MIB / 1000 * 1000))  # (free − vision) / KV per page
    assert _fit(1, 0.5, vision_mib=1024.0).max_batch == 0  # not even one page


def test_the_activation_terms_are_the_largest_prefill_modules_vision_apart() -> None:
    prefill = StageCost(
        vocab.PREFILL,
        (
            ModuleCost("global/sam.blocks.0.attn", "attention", activation_bytes=900.0),
            ModuleCost("tiles/sam.blocks.0.attn", "attention", activation_bytes=1200.0),
            ModuleCost("decoder.layers.0.mlp", "matmul", activation_bytes=300.0),
            ModuleCost("lm_head", "matmul", activation_bytes=40.0),
        ),
    )
    decode = StageCost(vocab.DECODE, (ModuleCost("decoder.layers.0.mlp", "matmul", activation_bytes=5e9),))
    assert activation_terms([{vocab.PREFILL: prefill, vocab.DECODE: decode}]) == (300.0, 1200.0)  # decode: summed steps


@pytest.fixture
def tiny_cfg(page_images: dict[str, Path], tmp_path: Path) -> Any:
    pages = tmp_path / "pages"
    pages.mkdir()
    (pages / "a.png").write_bytes(page_images["small"].read_bytes())
    return compose_config(
        "stage1",
        "model=deepseek_ocr_tiny",
        "device=cpu",
        f"dataset.root={pages}",
        "run.repeats=1",
        "run.warmup=0",
        "infer.max_new_tokens=3",
        "run.batch_size=4",
        "run.fill_batches=true",
        "pipeline.torch_profiler.enable=false",
    )


def refuse(cfg: Any, folder: Path) -> tuple[str, Stage1Run]:
    """stage1-run's refusal (its text) and the run, whose folder must be marked failed with nothing measured."""
    run = Stage1Run(command_config(cfg), folder, run_id=folder.name)
    with pytest.raises(UserError) as refused:
        run.execute()
    assert read_status(folder).state == "failed"
    assert not (folder / "metrics.json").exists()  # refused before any pass: nothing measured
    return " ".join(str(refused.value).split()), run


def test_the_tiny_model_estimate_and_its_refusal(
    tiny_cfg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the CPU with a fake free-memory figure: stage1-run refuses batch 4 before any pass, from the tiny model's
    analytic numbers; with room for exactly 2 pages, it names 2."""
    monkeypatch.setattr(device_memory, "free_memory", lambda device: 0)
    text, run = refuse(tiny_cfg, tmp_path / "none")
    assert "run.batch_size=4 does not fit" in text and "not even one page fits" in text

    session = run.session
    assert session is not None
    page = [Path(tiny_cfg.dataset.root) / "a.png"]
    fit = stage1_batch_fit.estimate(session, page, 3, 4, 0)
    assert fit is not None
    config = session.adapter.decoder_config(session.model)
    prepared = session.prepare(page[0])
    assert fit.kv_bytes_per_token == kv_bytes_per_token(config, session.dtype.itemsize)
    assert fit.context_tokens == prepared.prompt_tokens + 3
    decoder, vision = activation_terms(
        [session.adapter.analytic_costs(session.model, prepared, 3, session.dtype.itemsize)]
    )
    assert decoder > 0 and vision > 0 and "analytic model" in fit.activation_source
    assert (fit.decoder_activation_bytes, fit.vision_activation_bytes) == (
        decoder * ACTIVATION_MARGIN,
        vision * ACTIVATION_MARGIN,
    )

    two = fit.needed_bytes(2) - fit.weights_bytes  # exactly what 2 pages need beside the weights
    monkeypatch.setattr(device_memory, "free_memory", lambda device: int(two))
    text, _ = refuse(tiny_cfg, tmp_path / "two")
    assert "the largest batch that fits is 2" in text and "Set run.batch_size=2 or less" in text
    assert "run.check_batch_fit=false" in text and "KV cache 4 ×" in text and "analytic model" in text
    assert stage1_batch_fit.check(session, page, 3, 2, enabled=True) is not None  # 2 pass
    assert stage1_batch_fit.check(session, page, 3, 4, enabled=False) is None  # run.check_batch_fit=false
    assert tiny_cfg.run.check_batch_fit is True  # on by default
