"""`runtime:` and `run.batch_size`: composed from the shipped config, checked into RuntimeSettings, every bad value a
UserError naming the key and the fix."""

from __future__ import annotations

import attrs
import pytest
import torch

from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import stage1_nodes
from llm_perf_opt.errors import UserError
from llm_perf_opt.override_keys import check_override_keys
from llm_perf_opt.session.runtime import RuntimeSettings


def settings(*overrides: str) -> RuntimeSettings:
    """As stage1-run reads them: the overrides checked first (a value of the wrong type is refused there, before the
    typed schema would refuse it while composing), then the composed config's typed nodes."""
    check_override_keys("stage1", overrides, command="stage1-run")
    return RuntimeSettings.from_nodes(stage1_nodes(compose_config("stage1", *overrides)))


def test_shipped_defaults_are_the_eager_reference() -> None:
    s = settings()
    assert s == RuntimeSettings()
    assert (s.kv_cache, s.compile, s.compile_mode, s.batch_size) == ("dynamic", "none", "reduce-overhead", 1)
    assert s.is_reference
    assert not s.checks_outputs  # auto: nothing to compare against itself
    assert s.label == "dynamic KV cache, eager, batch 1"


def test_static_compiled_batched_settings() -> None:
    s = settings(
        "runtime.kv_cache=static", "runtime.compile=decode", "run.batch_size=4", "runtime.static_cache_len=2048"
    )
    assert s.compiles_decode and not s.compiles_prefill
    assert s.uses_cuda_graphs
    assert not s.is_reference and s.checks_outputs
    assert s.label == "static KV cache of 2048 positions, compiled decode (reduce-overhead), batch 4"
    record = s.record()  # what metrics.json saves: the same fields, and the label
    assert (record.batch_size, record.static_cache_len, record.label) == (4, 2048, s.label)
    assert attrs.asdict(record) == {**attrs.asdict(s), "label": s.label}
    both = settings("runtime.kv_cache=static", "runtime.compile=prefill_decode", "runtime.compile_mode=default")
    assert both.compiles_prefill and both.compiles_decode and not both.uses_cuda_graphs


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("runtime.kv_cache=paged", "runtime.kv_cache=paged"),
        ("runtime.compile=all", "runtime.compile=all"),
        ("runtime.compile_mode=fast", "runtime.compile_mode=fast"),
        ("runtime.output_check=sometimes", "runtime.output_check=sometimes"),
        ("runtime.record_routing=maybe", "runtime.record_routing=maybe"),
        ("run.batch_size=0", "run.batch_size=0"),
        ("run.batch_size=-2", "run.batch_size=-2"),
        ("run.batch_size=two", "run.batch_size=two"),
        ("runtime.static_cache_len=1", "runtime.static_cache_len=1"),
    ],
)
def test_bad_values_name_the_key(override: str, key: str) -> None:
    with pytest.raises(UserError) as info:
        settings("runtime.kv_cache=static", override) if "static_cache_len" in override else settings(override)
    assert key in info.value.problem
    assert key.split("=")[0] in info.value.fix


def test_compile_needs_a_static_cache() -> None:
    with pytest.raises(UserError, match=r"runtime\.compile=decode needs a static KV cache") as info:
        settings("runtime.compile=decode")
    assert "runtime.kv_cache=static" in info.value.fix


def test_cache_length_needs_a_static_cache() -> None:
    with pytest.raises(UserError, match=r"runtime\.static_cache_len=64 is set") as info:
        settings("runtime.static_cache_len=64")
    assert "runtime.kv_cache=static" in info.value.fix


def test_output_check_switch() -> None:
    assert settings("runtime.output_check=always").checks_outputs
    assert not settings("run.batch_size=2", "runtime.output_check=never").checks_outputs
    assert settings("run.batch_size=2").checks_outputs


def test_cuda_graphs_need_a_cuda_device() -> None:
    s = settings("runtime.kv_cache=static", "runtime.compile=decode")
    with pytest.raises(UserError, match=r"reduce-overhead captures CUDA graphs") as info:
        s.check_device(torch.device("cpu"))
    assert "runtime.compile_mode=default" in info.value.fix
    settings("runtime.kv_cache=static", "runtime.compile=decode", "runtime.compile_mode=default").check_device(
        torch.device("cpu")
    )
    RuntimeSettings().check_device(torch.device("cpu"))  # nothing compiled: nothing to check


def test_max_autotune_replays_cuda_graphs_too() -> None:
    """runtime.compile_mode=max-autotune (the max_autotune_graphs lever) captures CUDA graphs like reduce-overhead:
    two warm-up passes, a CUDA device required; max-autotune-no-cudagraphs does not."""
    tuned = settings("runtime.kv_cache=static", "runtime.compile=decode", "runtime.compile_mode=max-autotune")
    assert tuned.uses_cuda_graphs and tuned.warmup_needed == 2
    assert tuned.record().uses_cuda_graphs  # the saved record says the same
    assert "compiled decode (max-autotune)" in tuned.label
    with pytest.raises(UserError, match=r"max-autotune captures CUDA graphs"):
        tuned.check_device(torch.device("cpu"))
    plain = attrs.evolve(tuned, compile_mode="max-autotune-no-cudagraphs")
    assert not plain.uses_cuda_graphs and plain.warmup_needed == 1


def test_compile_unsupported_by_torch_is_a_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch._dynamo

    monkeypatch.setattr(torch._dynamo, "is_dynamo_supported", lambda: False)
    s = settings("runtime.kv_cache=static", "runtime.compile=decode", "runtime.compile_mode=default")
    with pytest.raises(UserError, match=r"torch\.compile is not supported") as info:
        s.check_device(torch.device("cpu"))
    assert "runtime.compile=none" in info.value.fix


def test_compile_options_are_checked_labelled_and_set_on_top_of_the_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """runtime.compile_options: inductor options by name (the coordinate_descent_graphs lever), checked against this
    torch's inductor config, in the label and the record; compiled with the mode's own options under them."""
    from llm_perf_opt.records.io import converter, to_plain
    from llm_perf_opt.records.stage1 import RuntimeRecord
    from llm_perf_opt.session import compiled

    tuned = settings(
        "runtime.kv_cache=static", "runtime.compile=decode", "+runtime.compile_options.coordinate_descent_tuning=true"
    )
    assert tuned.compile_options == (("coordinate_descent_tuning", True),)
    assert "compiled decode (reduce-overhead, coordinate_descent_tuning=True)" in tuned.label
    record = tuned.record()
    assert converter.structure(to_plain(record), RuntimeRecord) == record
    for override, message in (
        ("+runtime.compile_options.no_such_option=1", "is not an option of torch"),
        ("runtime.compile_options=3", "is not a mapping"),
    ):
        with pytest.raises(UserError, match=message):
            settings("runtime.kv_cache=static", "runtime.compile=decode", override)
    with pytest.raises(UserError, match="nothing is compiled"):
        settings("+runtime.compile_options.coordinate_descent_tuning=true")
    seen: list[dict[str, object]] = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(kw) or fn)
    compiled.compile_function(abs, "reduce-overhead", tuned.compile_options)
    compiled.compile_function(abs, "reduce-overhead")
    assert seen == [
        {"options": {"triton.cudagraphs": True, "coordinate_descent_tuning": True}},
        {"mode": "reduce-overhead"},
    ]


def test_inductor_compile_workers_are_started_before_the_function_is_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch starts its compile workers only when the first graph reaches inductor (compiling Triton kernels one by one
    in the process until they are up); compile_function starts them when the compiled function is made."""
    import torch._inductor.async_compile as async_compile

    from llm_perf_opt.session import compiled

    calls: list[str] = []
    monkeypatch.setattr(async_compile, "maybe_warm_pool", lambda: calls.append("workers started"))
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: calls.append(f"compiled ({kw['mode']})") or fn)
    compiled.warm_compile_workers.cache_clear()  # an earlier test of this process may have started them
    assert compiled.compile_function(abs, "default") is abs
    assert compiled.compile_function(abs, "reduce-overhead") is abs
    assert calls == ["workers started", "compiled (default)", "compiled (reduce-overhead)"]  # started once
