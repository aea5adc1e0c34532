"""Weight quantization through torchao (`runtime.quantize`): the setting, its refusals before any work, what it
quantizes on the tiny model (when torchao is installed; it is no dependency) and the `whatif=quantize` preset."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from torch import nn

from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import stage1_nodes
from llm_perf_opt.errors import UserError
from llm_perf_opt.measure import whatif as w
from llm_perf_opt.pipeline.whatif import read_levers, validate
from llm_perf_opt.records.io import converter, to_plain
from llm_perf_opt.records.stage1 import ModelInfo, RuntimeRecord
from llm_perf_opt.session.runtime import RuntimeSettings
from llm_perf_opt.settings_schema import SCHEMA

CPU = torch.device("cpu")
INT8 = RuntimeSettings(quantize="int8_weight_only")


def test_the_setting_parses_and_labels_the_runtime() -> None:
    settings = RuntimeSettings.from_nodes(stage1_nodes({"runtime": {"quantize": "Int8_Weight_Only"}}))
    assert settings.quantize == "int8_weight_only"
    assert settings.label == "int8 weight-only (torchao), dynamic KV cache, eager, batch 1"
    assert RuntimeSettings.from_nodes(stage1_nodes({})).quantize == "none" and "torchao" not in RuntimeSettings().label
    assert settings.record().quantize == "int8_weight_only"


def test_a_bad_value_is_refused_naming_the_choices() -> None:
    with pytest.raises(UserError, match=r"runtime\.quantize=int4 is not a known value") as e:
        RuntimeSettings.from_nodes(stage1_nodes({"runtime": {"quantize": "int4"}}))
    assert "none, int8_weight_only, float8_weight_only, float8_dynamic" in str(e.value)
    with pytest.raises(UserError, match=r"runtime\.quantize=fp8 is not a known value"):
        SCHEMA["runtime.quantize"].check("runtime.quantize", "fp8")


def test_folders_written_before_the_setting_load() -> None:
    old = to_plain(RuntimeRecord())
    assert isinstance(old, dict)
    del old["quantize"]
    assert converter.structure(old, RuntimeRecord).quantize == "none"
    fields = {f.name for f in attrs.fields(ModelInfo)}
    assert "quantized" in fields and attrs.fields_dict(ModelInfo)["quantized"].default is None


def _without_torchao(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("torchao", "torchao.quantization"):
        monkeypatch.setitem(sys.modules, name, None)  # import torchao then fails as if it were not installed


def test_missing_torchao_is_refused_before_the_model_is_built(
    monkeypatch: pytest.MonkeyPatch, compose_model: Callable[..., Any]
) -> None:
    from llm_perf_opt.session.session import InferenceSession

    _without_torchao(monkeypatch)
    with pytest.raises(UserError, match=r"runtime\.quantize=int8_weight_only quantizes the weights through torchao"):
        INT8.check_device(CPU)
    from llm_perf_opt.session.adapters.deepseek_ocr import DeepseekOcrAdapter

    def build_random(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the model was built before the setting was refused")

    monkeypatch.setattr(DeepseekOcrAdapter, "build_random", build_random)
    with pytest.raises(UserError, match="Install torchao") as e:
        InferenceSession.load(compose_model("model=deepseek_ocr_tiny"), CPU, INT8)
    assert "runtime.quantize=none" in str(e.value)
    RuntimeSettings().check_device(CPU)  # nothing quantized: torchao is not needed


def test_float8_needs_a_gpu_of_compute_capability_8_9(monkeypatch: pytest.MonkeyPatch) -> None:
    for setting in ("float8_weight_only", "float8_dynamic"):
        needs = rf"runtime\.quantize={setting} needs a CUDA GPU of compute capability 8\.9"
        with pytest.raises(UserError, match=needs):
            RuntimeSettings(quantize=setting).check_device(CPU)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(UserError, match=r"but this run has compute capability 8\.0"):
        RuntimeSettings(quantize="float8_dynamic").check_device(torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    _without_torchao(monkeypatch)  # a Hopper passes the device check and reaches the torchao one
    with pytest.raises(UserError, match="through torchao"):
        RuntimeSettings(quantize="float8_dynamic").check_device(torch.device("cuda", 0))


def test_int8_quantizes_the_language_models_linears_and_the_model_still_runs(
    compose_model: Callable[..., Any], page_images: dict[str, Path]
) -> None:
    pytest.importorskip("torchao")
    from llm_perf_opt.session.session import InferenceSession

    session = InferenceSession.load(compose_model("model=deepseek_ocr_tiny"), CPU, INT8)
    model = session.model
    vision = {id(m) for root in session.adapter.stage_modules(model).values() for m in root.modules()}
    linears = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    outside = {name for name, m in linears.items() if id(m) not in vision}
    quantized = session.loaded.quantized
    assert quantized is not None and quantized.setting == "int8_weight_only"
    assert (quantized.layers, quantized.linear_layers) == (len(outside), len(linears))
    assert 0 < len(outside) < len(linears)
    assert "lm_head" in outside and any(".shared_experts." in name for name in outside)
    plain = torch.Tensor
    assert all(type(linears[name].weight.data) is not plain for name in outside)  # torchao's tensor subclass
    assert all(type(m.weight.data) is plain for name, m in linears.items() if name not in outside)  # vision stays
    experts = next(m for name, m in model.named_modules() if name.endswith("mlp.experts"))
    assert all(type(p.data) is plain for p in experts.parameters())  # fused routed experts: no Linear, unquantized
    measured = session.run_image(page_images["small"], 3, nvtx=False)
    assert len(measured.token_ids) == 3
    with pytest.raises(ValueError, match=r"quantized as int8_weight_only, but the runtime has runtime\.quantize=none"):
        session.with_runtime(RuntimeSettings())


def test_the_quantize_preset_composes_on_the_batch_1_graphs_configuration() -> None:
    cfg = compose_config("whatif", "whatif=quantize")
    assert cfg.whatif.name == "quantize" and cfg.whatif.objective in w.objective_names()
    levers = {lever.name: lever for lever in read_levers(cfg.whatif.levers, [])}
    assert list(levers) == ["graphs", "int8_weight_only_graphs", "float8_weight_only_graphs", "float8_dynamic_graphs"]
    graphs = levers["graphs"].overrides
    for name, lever in levers.items():
        assert lever.needs == "cuda" and validate(lever.overrides) is None
        assert set(graphs) <= set(lever.overrides)
        if name != "graphs":
            setting = name.removesuffix("_graphs")
            assert f"runtime.quantize={setting}" in lever.overrides
            assert "changes numerics: judged by token agreement and logits max |Δ|" in lever.about
