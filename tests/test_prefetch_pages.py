"""Page files decoded ahead (`runtime.prefetch_pages`): a pass prepared from images decoded while the previous pass
ran gives the same inputs and tokens, its preprocess time holds the wait for them; a prefetch of other pages is
dropped with its threads; none left after close; text prompts decode nothing ahead; the setting is checked and
labelled; the records, the pipeline's passes and report.md say it."""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from PIL import Image

from helpers import SAMPLE_PAGES, sample_pages
from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import command_config, stage1_nodes
from llm_perf_opt.data.prompts import bundled_prompts_dir
from llm_perf_opt.errors import UserError
from llm_perf_opt.measure.throughput import page_throughput
from llm_perf_opt.override_keys import check_override_keys
from llm_perf_opt.pipeline.stage1 import Stage1Run
from llm_perf_opt.records.common import Summary
from llm_perf_opt.records.folders import load_stage1
from llm_perf_opt.records.stage1 import PagePart, PageThroughput
from llm_perf_opt.report.pages import throughput_lines
from llm_perf_opt.session.runtime import RuntimeSettings
from llm_perf_opt.session.session import InferenceSession

CPU = torch.device("cpu")
PREFETCH = RuntimeSettings(batch_size=3, prefetch_pages=True)


@pytest.fixture
def session(v1_session: InferenceSession) -> Iterator[InferenceSession]:
    prefetching = v1_session.with_runtime(PREFETCH)
    yield prefetching
    prefetching.close()


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("llo-prefetch")]


def _decodes(session: InferenceSession, monkeypatch: pytest.MonkeyPatch, pause_s: float = 0.0) -> list[Path]:
    """The paths the session's adapter decodes from now on (each after `pause_s`), in order."""
    seen: list[Path] = []
    real = session.adapter.decode_file

    def decode(path: Path) -> Image.Image | None:
        seen.append(path)
        time.sleep(pause_s)
        return real(path)

    monkeypatch.setattr(session.adapter, "decode_file", decode)
    return seen


def test_prefetched_passes_prepare_the_same_inputs_and_tokens(v1_session: InferenceSession, session: Any) -> None:
    plain = v1_session.with_runtime(RuntimeSettings(batch_size=3))
    try:
        alone, _ = plain._prepare_batch(sample_pages())
    finally:
        plain.close()
    session.prefetch(sample_pages())
    ahead, prefetched = session._prepare_batch(sample_pages())
    assert prefetched
    for (a, _), (b, _) in zip(alone, ahead, strict=True):
        assert a.views == b.views and a.prompt_tokens == b.prompt_tokens
        for key, value in a.model_inputs.items():
            if isinstance(value, torch.Tensor):
                torch.testing.assert_close(b.model_inputs[key], value, rtol=0, atol=0)
    first = session.run_batch(sample_pages(), 2, nvtx=False, next_paths=sample_pages())  # nothing decoded ahead of it
    second = session.run_batch(sample_pages(), 2, nvtx=False)
    assert not first.prefetched and second.prefetched
    # the pass of prefetched pages gives the tokens of the pass that decoded its own (the inputs were compared with
    # the plain session's above)
    assert [p.token_ids for p in second.pages] == [p.token_ids for p in first.pages]
    assert not _prefetch_threads()  # taken: its pool has finished
    record = second.record(0, 0, ("a", "b", "c"))
    assert record.prefetched and not first.record(0, 0, ("a", "b", "c")).prefetched
    pages = second.page_measurements()
    assert all(p.prefetched for p in pages) and pages[0].record("a", 0, (), None).prefetched


def test_the_wait_for_the_decoded_pages_is_preprocessing(session: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """One decoding thread, each page 0.1 s: the pass that starts right away waits for about 0.3 s, and its
    preprocess time holds the wait (a lower bound set by the pauses, not a speed figure); each page a share."""
    _decodes(session, monkeypatch, pause_s=0.1)
    session.prefetch(sample_pages())
    measured = session.run_batch(sample_pages(), 2, nvtx=False)
    assert measured.prefetched
    assert measured.preprocess_ms >= 150.0
    assert len({p.preprocess_ms for p in measured.pages}) == 1  # an equal share each


def test_the_next_paths_of_another_batch_are_decoded_for_it(session: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    this, following = sample_pages(SAMPLE_PAGES[0]), sample_pages(SAMPLE_PAGES[1], SAMPLE_PAGES[2])
    seen = _decodes(session, monkeypatch)
    first = session.run_batch(this, 2, nvtx=False, next_paths=following)
    assert not first.prefetched  # its own page decoded in the pass (not through the prefetch)
    second = session.run_batch(following, 2, nvtx=False)
    assert second.prefetched and seen == following  # prepared from the images decoded ahead
    third = session.run_batch(following, 2, nvtx=False)
    assert not third.prefetched  # nothing asked ahead of it


def test_a_prefetch_of_other_pages_is_dropped_with_its_threads(session: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _decodes(session, monkeypatch, pause_s=0.2)
    session.prefetch(sample_pages())
    measured = session.run_batch(sample_pages(SAMPLE_PAGES[0]), 2, nvtx=False)
    assert not measured.prefetched and session._prefetch is None
    assert not _prefetch_threads()
    # the decodes not started were cancelled
    assert seen == sample_pages()[: len(seen)] and len(seen) < len(SAMPLE_PAGES)


def test_no_thread_is_left_after_close(v1_session: InferenceSession, monkeypatch: pytest.MonkeyPatch) -> None:
    prefetching = v1_session.with_runtime(PREFETCH)
    _decodes(prefetching, monkeypatch, pause_s=0.05)
    prefetching.prefetch(sample_pages())
    assert _prefetch_threads()
    prefetching.close()
    assert not _prefetch_threads() and prefetching._prefetch is None


def test_a_decoding_error_is_raised_by_the_pass_that_takes_it(session: Any, tmp_path: Path) -> None:
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    session.prefetch([broken, *sample_pages(SAMPLE_PAGES[0])])
    with pytest.raises(OSError):
        session.run_batch([broken, *sample_pages(SAMPLE_PAGES[0])], 2, nvtx=False)
    assert not _prefetch_threads() and session._prefetch is None


def _closed(image: Image.Image) -> bool:
    try:
        image.getpixel((0, 0))
    except ValueError:  # "Operation on closed image"
        return True
    return False


@pytest.mark.parametrize("workers", [1, 3], ids=["one after the other", "on threads"])
def test_a_prepare_that_fails_mid_batch_closes_every_page_decoded_ahead(
    v1_session: InferenceSession, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """The second page of a pass decoded ahead fails to prepare: its error is raised by the pass, and every image
    decoded ahead is closed (the page prepared before it, the one that failed, the one never prepared); no thread is
    left and nothing is in flight."""
    prefetching = v1_session.with_runtime(attrs.evolve(PREFETCH, preprocess_workers=workers))
    decoded: list[Image.Image] = []
    real_decode, real_prepare = prefetching.adapter.decode_file, prefetching.adapter.prepare_file

    def decode(path: Path) -> Image.Image | None:
        image = real_decode(path)
        assert image is not None
        decoded.append(image)
        return image

    def prepare(path: Path, tokenizer: Any, image: Image.Image | None = None) -> Any:
        if path.name == SAMPLE_PAGES[1]:
            raise ValueError(f"{path.name} cannot be prepared")
        return real_prepare(path, tokenizer, image)

    monkeypatch.setattr(prefetching.adapter, "decode_file", decode)
    monkeypatch.setattr(prefetching.adapter, "prepare_file", prepare)
    try:
        prefetching.prefetch(sample_pages())
        with pytest.raises(ValueError, match="cannot be prepared"):
            prefetching.run_batch(sample_pages(), 2, nvtx=False)
        assert len(decoded) == len(SAMPLE_PAGES) and all(_closed(image) for image in decoded)
        assert prefetching._prefetch is None and not _prefetch_threads()
        assert not [t for t in threading.enumerate() if t.name.startswith("llo-preprocess")]
    finally:
        prefetching.close()


def test_text_prompts_decode_nothing_ahead(caplog: pytest.LogCaptureFixture) -> None:
    model = compose_config("stage1", "model=hf", "model.config=qwen2_tiny").model
    prompt = bundled_prompts_dir() / "question_short.txt"
    with caplog.at_level(logging.WARNING, logger="llm_perf_opt.session"):
        text = InferenceSession.load(model, CPU, RuntimeSettings(batch_size=2, prefetch_pages=True))
    assert "runtime.prefetch_pages=true" in caplog.text and "nothing is decoded ahead" in caplog.text
    assert text.adapter.decode_file(prompt) is None
    try:
        first = text.run_batch([prompt, prompt], 2, nvtx=False, next_paths=[prompt, prompt])
        assert text._prefetch is None and not first.prefetched
        assert not text.run_batch([prompt, prompt], 2, nvtx=False).prefetched
    finally:
        text.close()


def test_prefetch_pages_is_checked_and_labelled() -> None:
    cfg = compose_config("stage1", "model=deepseek_ocr_tiny", "runtime.prefetch_pages=true", "run.batch_size=4")
    settings = RuntimeSettings.from_nodes(stage1_nodes(cfg))
    assert settings.prefetch_pages and settings.record().prefetch_pages
    assert "next pages decoded ahead" in settings.label
    assert "ahead" not in RuntimeSettings(batch_size=4).label
    with pytest.raises(UserError, match=r"runtime.prefetch_pages"):
        check_override_keys("stage1", ["runtime.prefetch_pages=sometimes"], command="stage1-run")


def _summary(value: float, n: int) -> Summary:
    return Summary(n, value, 0.0, value, value, value, value, None, None, None, "pages/s")


def test_the_pages_section_says_the_pages_were_decoded_ahead() -> None:
    parts = (PagePart("preprocess", 1.0, None), PagePart("decode", 9.0, None))
    p = PageThroughput(2, _summary(4.0, 3), _summary(40.0, 3), _summary(5.0, 3), _summary(9.0, 3), parts, prefetched=3)
    text = " ".join(throughput_lines(p, "pages"))
    assert (
        "Page files decoded ahead while the previous pass ran (runtime.prefetch_pages): the time per page leaves "
        "their decoding out, as in a steady stream of batches" in text
    )
    assert "of the 3 passes" not in text
    some = " ".join(throughput_lines(attrs.evolve(p, prefetched=1), "pages"))
    assert "(1 of the 3 passes; the others decoded their own)" in some
    plain = " ".join(throughput_lines(PageThroughput(2, *[_summary(1.0, 3)] * 4, parts), "pages"))
    assert "decoded ahead" not in plain


@pytest.mark.slow
def test_stage1_run_decodes_the_next_pass_ahead(tmp_path: Path) -> None:
    """stage1-run at batch 2 with one warm-up pass: every timed pass prepared from pages decoded during the pass
    before it (the warm-up decoded its own), said in the records, the runtime label and report.md."""
    root = tmp_path / "pages"
    root.mkdir()
    for page in sample_pages(*SAMPLE_PAGES[:2]):
        shutil.copy(page, root / page.name)
    cfg = compose_config(
        "stage1",
        "model=deepseek_ocr_tiny",
        "device=cpu",
        "run.batch_size=2",
        "run.repeats=2",
        "run.warmup=1",
        "infer.max_new_tokens=2",
        "dataset.max_images=all",
        "dataset.sampling=sorted",
        f"dataset.root={root}",
        "pipeline.torch_profiler.enable=false",
        "runtime.prefetch_pages=true",
    )
    folder = tmp_path / "run"
    Stage1Run(command_config(cfg), folder, run_id=folder.name).execute()
    m = load_stage1(folder).metrics
    assert [b.prefetched for b in m.batches] == [True, True]
    assert m.records and all(r.prefetched for r in m.records)
    assert m.pages is not None and m.pages.prefetched == 2
    assert m.pages == page_throughput(m.forwards, m.efficiency)
    assert "next pages decoded ahead" in m.settings.runtime.label
    assert not _prefetch_threads()  # the last pass asked for nothing ahead
    report = (folder / "report.md").read_text()
    assert "Page files decoded ahead while the previous pass ran (runtime.prefetch_pages)" in report
