"""Output settings: their own config group at pipeline.torch_profiler.output, DeepSeek-OCR knobs, legacy keys."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import stage1_nodes
from llm_perf_opt.errors import UserError
from llm_perf_opt.output_settings import LEGACY_KEYS, OutputSettings, output_settings
from llm_perf_opt.override_keys import check_override_keys

OUT = "pipeline.torch_profiler.output"


def settings(*overrides: str, config: str = "stage1") -> OutputSettings:
    cfg = compose_config(config, *overrides)
    return output_settings(cfg, stage1_nodes(cfg).outputs)


def _value(s: OutputSettings, key: str) -> Any:
    """The field of `s` that `key` (a new key under pipeline.torch_profiler.output) sets."""
    path = key.removeprefix(f"{OUT}.").split(".")
    if path[0] == "extra":  # extra.deepseek_ocr.<prediction|visualization>.<knob>: flat in the record
        return getattr(s.extra.deepseek_ocr, path[-1])
    return getattr(getattr(s, path[0]), path[1])


def test_defaults() -> None:
    s = settings()
    assert (s.prediction.enable, s.prediction.save_dir) == (True, "predictions")
    assert (s.visualization.enable, s.visualization.save_dir) == (True, "viz")
    knobs = s.extra.deepseek_ocr
    assert (knobs.strip_special_tokens, knobs.max_images, knobs.thumbnail_width) == (False, 16, 480)


@pytest.mark.parametrize("preset", ["min", "default", "max"])
def test_a_profiler_preset_never_changes_the_outputs(preset: str) -> None:
    cfg = compose_config("stage1", f"pipeline/torch_profiler={preset}")
    assert output_settings(cfg, stage1_nodes(cfg).outputs) == settings()
    assert cfg.pipeline.torch_profiler.output.visualization.enable is True


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        (f"{OUT}.prediction.enable", "false", False),
        (f"{OUT}.prediction.save_dir", "/tmp/preds", "/tmp/preds"),
        (f"{OUT}.visualization.enable", "false", False),
        (f"{OUT}.visualization.save_dir", "gallery", "gallery"),
        (f"{OUT}.extra.deepseek_ocr.prediction.strip_special_tokens", "true", True),
        (f"{OUT}.extra.deepseek_ocr.visualization.max_images", "3", 3),
        (f"{OUT}.extra.deepseek_ocr.visualization.thumbnail_width", "320", 320),
    ],
)
def test_each_key_is_set_without_plus(key: str, value: str, expected: Any, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="llm_perf_opt"):
        s = settings(f"{key}={value}")
    assert _value(s, key) == expected
    assert not caplog.records  # new keys log nothing
    assert _value(settings(f"{key}={value}", config="stage2"), key) == expected  # Stage 2 composes the same


@pytest.mark.parametrize(
    ("legacy", "value", "expected"),
    [
        ("outputs.save_predictions", "false", False),
        ("outputs.visualization.enable", "false", False),
        ("outputs.predictions.strip_special_tokens", "true", True),
        ("outputs.visualization.max_images", "4", 4),
        ("outputs.visualization.thumbnail_width", "256", 256),
    ],
)
def test_each_legacy_key_is_read_with_one_info_line(
    legacy: str, value: str, expected: Any, caplog: pytest.LogCaptureFixture
) -> None:
    new = LEGACY_KEYS[legacy]
    with caplog.at_level(logging.INFO, logger="llm_perf_opt"):
        s = settings(f"{legacy}={value}")
    assert _value(s, new) == expected
    lines = [r for r in caplog.records if r.levelno == logging.INFO]
    said = f"{legacy} is a legacy key (read until its removal on 2027-03-01): use {new}={value}"
    assert [r.getMessage() for r in lines] == [said]


def test_a_legacy_key_wins_over_its_new_key() -> None:
    s = settings(f"{OUT}.visualization.enable=true", "outputs.visualization.enable=false")
    assert s.visualization.enable is False


@pytest.mark.parametrize(
    ("override", "named"),
    [
        (f"{OUT}.prediction.enable=maybe", f"{OUT}.prediction.enable=maybe is not true or false"),
        ("outputs.save_predictions=maybe", "outputs.save_predictions=maybe is not true or false"),
        (f"{OUT}.extra.deepseek_ocr.visualization.max_images=0", "max_images=0 is out of range"),
        ("outputs.visualization.thumbnail_width=8", "outputs.visualization.thumbnail_width=8 is out of range"),
    ],
)
def test_bad_values_name_the_key_given(override: str, named: str) -> None:
    with pytest.raises(UserError, match=named.replace(".", r"\.")):
        check_override_keys("stage1", [override], command="stage1-run")  # the command line, before composing
    if override.endswith("=0"):  # in range of its type: the reader refuses it too (a config of its own)
        with pytest.raises(UserError, match=named.replace(".", r"\.")):
            settings(override)
