"""Paths handed to child commands as Hydra overrides are quoted, so a folder with a space, a non-ASCII letter or a
`,` reaches the child as it is (before: `perf-whatif "hydra.run.dir='OUT/wh at/run'"` failed at the baseline, whose
`hydra.run.dir=<path>` Hydra could not parse)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from helpers import stage2_settings
from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.override_text import quoted_override
from llm_perf_opt.pipeline.stage2 import workload_argv
from llm_perf_opt.pipeline.whatif_hydra import phase_command
from llm_perf_opt.pipeline.whatif_rungs import RungJob, SharedCaches, stage1_arguments

AWKWARD = ("wh at", "tëst, one", "it's", "x=y", "back\\")


def read_back(argv: list[str], key: str) -> str:
    """The value Hydra's override parser reads for `key` in `argv`."""
    parser = OverridesParser.create()
    (found,) = [o for o in parser.parse_overrides([a for a in argv if a.split("=", 1)[0] == key])]
    value = found.value()
    assert isinstance(value, str)
    return value


@pytest.mark.parametrize("name", AWKWARD)
def test_a_value_is_read_back_as_it_is(name: str) -> None:
    assert read_back([quoted_override("k", name)], "k") == name


@pytest.mark.parametrize("name", AWKWARD[:2])
def test_child_commands_quote_their_folders(tmp_path: Path, name: str) -> None:
    root = tmp_path / name
    cache = SharedCaches(model_cache=root / "model_cache")
    job = RungJob("baseline", ("model=deepseek_ocr_tiny",), (), root / "rungs" / "00", root / "00.log", cache.overrides)
    rung = stage1_arguments(job, None)
    assert read_back(rung, "hydra.run.dir") == str(root / "rungs" / "00")
    assert read_back(rung, "model.cache_dir") == str(root / "model_cache")
    phase = phase_command([job], [], root / "rung_configs", root / "rungs")
    assert read_back(phase, "hydra.sweep.dir") == str(root / "rungs")
    cfg = compose_config("stage2", "model=deepseek_ocr_tiny")
    workload = workload_argv(stage2_settings(cfg), [], root, name="nsys", model_cache=root / "model_cache")
    assert read_back(workload, "hydra.run.dir") == str(root / "workload" / "nsys")
    assert read_back(workload, "model.cache_dir") == str(root / "model_cache")
