"""The analytic settings records: the config parsed once, at the pipeline's edge, into typed values."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import llm_perf_opt.conf
from llm_perf_opt.analytic.settings import AnalyticSettings, PricedModel, WorkloadProfile
from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import command_config
from llm_perf_opt.config_schema import AnalyticSchema
from llm_perf_opt.errors import UserError
from llm_perf_opt.override_keys import check_override_keys
from llm_perf_opt.pipeline.analytic import analytic_settings, build_report
from llm_perf_opt.session.model_settings import ModelSettings


def test_v1_settings_hold_the_mode_the_crop_grid_and_the_sweep_modes() -> None:
    s = analytic_settings(command_config(compose_config("analytic", "model=deepseek_ocr", "workload=ocr1-receipt")))
    assert (s.model.mode_name, s.crop_grid, s.new_tokens, s.dtype_bytes) == ("gundam", (1, 4), 128, 2)
    assert [m.name for m in s.sweep_modes] == ["tiny", "small", "base", "large", "gundam"]
    assert s.grid_sweep[-1] == (3, 3) and s.tile_sweep == () and s.text_tokens == 12
    assert s.profile is not None and s.profile.models == ("deepseek_ocr", "deepseek_ocr_tiny")


def test_ocr2_settings_hold_the_tiles_and_view_sizes() -> None:
    s = analytic_settings(command_config(compose_config("analytic", "model=deepseek_ocr2", "analytic.tiles=3")))
    assert (s.model.mode, s.model.global_size, s.model.tile_size, s.tiles) == (None, 1024, 768, 3)
    assert s.tile_sweep == (0, 2, 3, 4, 5, 6) and s.crop_grid is None and s.profile is None


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("analytic.mode_sweep=[tiny,huge]", "model.mode=huge is not a DeepSeek-OCR mode"),
        ("analytic.grid_sweep=[[2]]", r"analytic.grid_sweep\[\]=\[2\] is not a crop grid"),
        ("analytic.dtype=int3", "analytic.dtype=int3 is not supported"),
    ],
)
def test_bad_values_are_refused_when_parsed(override: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        analytic_settings(command_config(compose_config("analytic", "model=deepseek_ocr", override)))


def test_a_value_out_of_range_is_refused_on_the_command_line() -> None:
    """Typed (config_schema.AnalyticSchema): one paragraph before anything composes."""
    with pytest.raises(UserError, match=r"analytic\.new_tokens=0 is out of range"):
        check_override_keys("analytic", ["analytic.new_tokens=0"], command="analytic-report")


def test_a_workload_profile_checks_its_model_and_keeps_no_batch_size() -> None:
    profile = WorkloadProfile.from_config({"name": "w", "document": "d", "models": ["a", "a_tiny"]})
    assert profile is not None and profile.as_dict() == {"name": "w", "document": "d", "models": ["a", "a_tiny"]}
    profile.check_model("a_tiny")
    with pytest.raises(UserError, match="workload=w is written for model=a or model=a_tiny"):
        profile.check_model("b")
    assert WorkloadProfile.from_config(None) is None
    with pytest.raises(UserError, match="workload_profile has no name"):
        WorkloadProfile.from_config({"document": "d"})  # one paragraph, not a KeyError
    node = {
        "name": "b",
        "adapter": "deepseek_ocr2",
        "architecture": {"layers": 1},
        "preprocess": {"global_size": 1, "tile_size": 1},
    }
    model = PricedModel.from_settings(ModelSettings.from_config(node))
    with pytest.raises(UserError, match="this command runs model=b"):
        AnalyticSettings.from_config(AnalyticSchema(), model, profile)


def test_no_workload_file_sets_a_batch_size_and_the_report_records_none() -> None:
    """`workload_profile.batch_size` was never read (the run's own `run.batch_size` is what batches)."""
    for path in (Path(llm_perf_opt.conf.__file__).parent / "workload").glob("*.yaml"):
        assert "batch_size" not in yaml.safe_load(path.read_text())["workload_profile"], path.name
    report = build_report(command_config(compose_config("analytic", "workload=ocr2-snippet")))
    assert report.workload_profile is not None and set(report.workload_profile) == {"name", "document", "models"}
