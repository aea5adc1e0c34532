"""Shared fixtures: Hydra-composed model configs, one tiny CPU session per test run, synthetic page images."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import DictConfig
from PIL import Image

from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.models.cache_argument import cache_kwargs


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """One worker per core (pytest-xdist's `-n auto`) unless `-n` is given, xdist is not installed (the run stays in
    this process), or the run selects GPU tests (`-m gpu`: they share one device and time it); with workers and no
    `--dist` of the caller's, `WHOLE_MODULES` each on one worker (`pytest_xdist_make_scheduler`)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):  # a worker: its own options come from the controller
        return
    if not hasattr(config.option, "numprocesses"):
        return
    marks = str(config.option.markexpr or "")
    if config.option.numprocesses is None and not ("gpu" in marks and "not gpu" not in marks):
        config.option.numprocesses = "auto"
    if config.option.numprocesses not in (None, 0, "0") and config.option.dist == "no":
        config.option.dist = "loadscope"
        config.stash[_WHOLE_MODULES_KEY] = True


# Modules whose module-scoped fixture takes seconds (a whole stage1 or what-if run, often in a child process): each
# runs on one worker, so the fixture is built once rather than once per worker that gets one of its tests. (xdist's
# own `--dist loadgroup` does not group under pytest 9, which no longer reads the node id xdist rewrites.)
WHOLE_MODULES = (
    "tests/test_batching.py",
    "tests/test_rung_forks.py",
    "tests/test_stage1_batches.py",
    "tests/test_stage1_cli.py",
    "tests/test_whatif_cli.py",
    "tests/test_whatif_hydra.py",
    "tests/test_whatif_report.py",
)
_WHOLE_MODULES_KEY = pytest.StashKey[bool]()


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: without it installed, never called
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With the default distribution: `WHOLE_MODULES` each to one worker (the largest first), every other test on
    its own to whichever worker is free, in collection order."""
    if not config.stash.get(_WHOLE_MODULES_KEY, False):
        return None
    from xdist.scheduler import LoadScopeScheduling

    missing = [m for m in WHOLE_MODULES if not (config.rootpath / m).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py WHOLE_MODULES names modules that are not there: {missing}")

    class WholeModules(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in WHOLE_MODULES else nodeid

    return WholeModules(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules with `slow` tests first, each module's tests still together and in file order: the workers start
    on the long tests and end on short ones, rather than one waiting on the other's last long test."""
    slow_modules = {getattr(item, "module", None) for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: getattr(item, "module", None) not in slow_modules)


if os.environ.get("PYTEST_XDIST_WORKER"):
    # One worker per core (addopts: -n auto): each computes on one thread, as do the processes a test starts; two
    # threads per worker on two cores made the suite slower than one process (1.57x faster this way, 2 cores).
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

# Page sizes (width, height) and the tiles DeepSeek-OCR-2's preprocessing cuts them into (reference §2, §3.4).
PAGE_SIZES: dict[str, tuple[int, int]] = {
    "a4": (1240, 1754),  # 6 tiles, 1121 image tokens
    "square700": (700, 700),  # 0 tiles, 257
    "small": (700, 500),  # 0 tiles, 257 (the cheapest page to run)
    "wide": (3000, 1000),  # 3 tiles, 689
    "two_tiles": (1536, 768),  # 2 tiles, 545 (the cheapest page with tiles)
}


def compose_stage1(*overrides: str) -> DictConfig:
    """The stage1 config composed by Hydra with `overrides`."""
    return compose_config("stage1", *overrides)


@pytest.fixture(scope="session")
def compose_model() -> Callable[..., DictConfig]:
    """`compose_model("model=deepseek_ocr2_tiny", "model.seed=1")` -> the composed `model` node."""
    return lambda *overrides: compose_stage1(*overrides).model


@pytest.fixture(scope="session")
def tiny_model_cfg() -> DictConfig:
    """`model=deepseek_ocr2_tiny` (defaults: sdpa attention, transformers' default experts backend)."""
    return compose_stage1("model=deepseek_ocr2_tiny").model


@pytest.fixture(scope="session")
def full_model_cfg() -> DictConfig:
    """The shipped full-size `model=deepseek_ocr2` config."""
    return compose_stage1("model=deepseek_ocr2").model


@pytest.fixture(scope="session")
def tiny_session(tiny_model_cfg: DictConfig) -> Any:
    """One tiny DeepSeek-OCR-2 (random weights, fp32) on the CPU, shared by every test that runs the model."""
    from llm_perf_opt.session.session import DeepSeekOCRSession

    return DeepSeekOCRSession.load(tiny_model_cfg, torch.device("cpu"))


@pytest.fixture(scope="module")
def v1_session(compose_model: Callable[..., DictConfig]) -> Any:
    """A tiny DeepSeek-OCR v1 (random weights, fp32) on the CPU, one per test module."""
    from llm_perf_opt.session.session import InferenceSession

    return InferenceSession.load(compose_model("model=deepseek_ocr_tiny"), torch.device("cpu"))


@pytest.fixture(scope="session")
def page_images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """White page PNGs of PAGE_SIZES, by name."""
    root = tmp_path_factory.mktemp("pages")
    out = {}
    for name, size in PAGE_SIZES.items():
        out[name] = root / f"{name}.png"
        Image.new("RGB", size, "white").save(out[name])
    return out


def _decode_step_flops(session: Any, cached: int) -> int:
    """FLOPs of one decode forward whose KV cache already holds `cached` positions (its query attends cached + 1
    keys), counted independently of `count_stage_flops`: the cache is filled with zeros, no prefill runs."""
    from transformers import DynamicCache

    from llm_perf_opt.instruments.flops import flop_counter

    text = session.model.config.text_config
    cache = DynamicCache()
    if cached:
        for layer in range(text.num_hidden_layers):
            kv = torch.zeros(1, text.num_key_value_heads, cached, text.head_dim, dtype=session.dtype)
            cache.update(kv, kv.clone(), layer)
    mask = torch.ones(1, cached + 1, dtype=torch.long)
    with torch.inference_mode(), flop_counter() as counter:
        session.model(
            input_ids=torch.tensor([[5]]), attention_mask=mask, use_cache=True, logits_to_keep=1, **cache_kwargs(cache)
        )
    return int(counter.get_total_flops())


@pytest.fixture(scope="session")
def decode_step_flops() -> Callable[[Any, int], int]:
    """`decode_step_flops(session, cached)`: counted FLOPs of one decode step over a `cached`-long KV cache."""
    return _decode_step_flops


@pytest.fixture(autouse=True)
def _logging_restored() -> Any:
    """The root logger's own handlers and level as they were before each test: a test that runs a Hydra entry point
    in its own process leaves Hydra's handlers there, writing to the streams pytest captured for that test, and a
    later test's log lines would then go to a closed stream ("--- Logging error ---" on its stderr). The handlers
    pytest adds and removes around each phase are its own to manage."""
    root = logging.getLogger()
    before, level = set(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in before and not type(handler).__module__.startswith("_pytest"):
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)


@pytest.fixture
def frozen_calibration(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The advice's calibration as the tests' expected predictions were worked out with
    (`fixtures/advice_calibration.yaml`), so that refreshing the shipped one from new runs changes no test."""
    from llm_perf_opt.records.advice import load_calibration

    frozen = load_calibration((Path(__file__).parent / "fixtures" / "advice_calibration.yaml").read_text())
    monkeypatch.setattr("llm_perf_opt.measure.advice.shipped_calibration", lambda: frozen)
    return frozen
