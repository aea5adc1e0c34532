"""runtime.compile=decode|prefill_decode on the CPU: TorchDynamo traces the real step functions (its "eager" backend
stands in for inductor, which takes minutes per graph on two cores); compile events, recompiles and failures are
recorded or turned into UserErrors; per-step timing, vision sub-stages and the routing record stay outside the
graph. tests/test_gpu.py runs mode=reduce-overhead (CUDA graphs) for real."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs
import pytest
import torch

from llm_perf_opt.config_data import command_config, stage1_nodes
from llm_perf_opt.errors import UserError
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.session import compiled
from llm_perf_opt.session.compiled import CompiledStep
from llm_perf_opt.session.runtime import RuntimeSettings
from llm_perf_opt.session.session import DeepSeekOCRSession

#: Drives transformers models: CI also runs it on the oldest supported transformers.
pytestmark = pytest.mark.transformers_api

NEW_TOKENS = 4
DECODE = RuntimeSettings(kv_cache="static", compile="decode", compile_mode="default")
PREFILL_DECODE = RuntimeSettings(kv_cache="static", compile="prefill_decode", compile_mode="default")


def dynamo_eager(fn: Any, _mode: str, _options: Any = (), dynamic: bool | None = None) -> Any:
    """`compiled.compile_function` with Dynamo's "eager" backend in place of the mode's."""
    return torch.compile(fn, backend="eager", **({} if dynamic is None else {"dynamic": dynamic}))


@pytest.fixture(autouse=True)
def traced_by_dynamo(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """torch.compile with the "eager" backend: TorchDynamo traces and guards as for inductor, no code generation. The
    step's `dynamic` is passed on: compiled vision asks for static graphs (a dynamic-shape retrace of SAM for a
    page's second view shape took 23 of this file's 60 s)."""
    torch._dynamo.reset()
    monkeypatch.setattr(compiled, "compile_function", dynamo_eager)
    yield
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def eager_tokens(tiny_session, page_images) -> dict[str, Any]:
    """The eager reference of both pages (the session is shared and left as it was: one reference per module)."""
    return {page: tiny_session.run_image(page_images[page], NEW_TOKENS, nvtx=False) for page in ("small", "two_tiles")}


def test_compiled_decode_gives_the_eager_tokens_and_logs_its_compilation(
    tiny_session, page_images, eager_tokens
) -> None:
    session = tiny_session.with_runtime(DECODE)
    try:
        first = session.run_image(page_images["small"], NEW_TOKENS, nvtx=True)
        steady = session.run_image(page_images["small"], NEW_TOKENS, nvtx=True)
        other = session.run_image(page_images["two_tiles"], NEW_TOKENS, nvtx=False)
        summary = session.compile_summary()
    finally:
        session.close()
    assert first.token_ids == steady.token_ids == eager_tokens["small"].token_ids
    assert other.token_ids == eager_tokens["two_tiles"].token_ids
    # the first pass compiled the decode step once (first call of its shape); the second pass compiled nothing
    assert len(first.compile_events) == 1
    event = first.compile_events[0]
    assert (event.function, event.call, event.recompile) == ("decode", 1, False)
    assert event.shape == (1, 1, first.prompt_tokens + NEW_TOKENS)  # (batch, query, static cache positions)
    assert event.frames >= 1 and event.host_ms > 0
    assert steady.compile_events == ()
    # another page has another cache length: a guard fails, the step recompiles
    assert other.compile_events and all(e.recompile for e in other.compile_events)
    assert summary.events == first.compile_events + other.compile_events
    assert summary.recompiles == len(other.compile_events)
    assert summary.compile_ms == pytest.approx(sum(e.host_ms for e in summary.events))
    # per-step spans (CUDA events and NVTX on a GPU) stay around the compiled call, outside the graph
    for m in (first, steady):
        assert m.stage_calls[vocab.DECODE_STEP] == NEW_TOKENS - 1
        assert all(ms > 0 for ms in m.decode_step_ms)
        assert m.stage_calls["vision/sam"] == 1  # prefill (and vision) eager
    assert steady.output_check is not None and steady.output_check.first_departure is None


@pytest.mark.slow
def test_one_cache_length_means_one_compilation(tiny_session, page_images, eager_tokens) -> None:
    session = tiny_session.with_runtime(
        RuntimeSettings(kv_cache="static", compile="decode", compile_mode="default", static_cache_len=640)
    )
    try:
        runs = [session.run_image(page_images[p], NEW_TOKENS, nvtx=False) for p in ("small", "two_tiles", "small")]
    finally:
        session.close()
    assert [len(m.compile_events) for m in runs] == [1, 0, 0]
    assert [m.token_ids for m in runs] == [eager_tokens[p].token_ids for p in ("small", "two_tiles", "small")]


@pytest.mark.slow
def test_routing_record_through_the_compiled_step(tiny_session, page_images) -> None:
    eager = tiny_session.run_image(page_images["two_tiles"], NEW_TOKENS, nvtx=False).routing
    session = tiny_session.with_runtime(DECODE)
    try:
        traced = [session.run_image(page_images["two_tiles"], NEW_TOKENS, nvtx=False).routing for _ in range(2)]
    finally:
        session.close()
    assert eager is not None and eager.steps == NEW_TOKENS - 1
    assert traced == [eager, eager]


@pytest.mark.slow
def test_compiled_prefill_keeps_vision_eager(tiny_session, page_images, eager_tokens) -> None:
    session = tiny_session.with_runtime(PREFILL_DECODE)
    try:
        m = session.run_image(page_images["two_tiles"], NEW_TOKENS, nvtx=False)
    finally:
        session.close()
    assert m.token_ids == eager_tokens["two_tiles"].token_ids
    assert {e.function for e in m.compile_events} == {"prefill", "decode"}
    prefill = next(e for e in m.compile_events if e.function == "prefill")
    assert prefill.shape == (1, m.prompt_tokens, m.prompt_tokens + NEW_TOKENS)
    assert m.stage_calls["vision/sam"] == 2 and m.stage_calls["vision/encoder"] == 2  # global view + tiles
    assert 0 < sum(m.stage_ms[s] for s in tiny_session.vision_stages) <= m.prefill_ms


def test_compile_failure_is_a_user_error(tiny_session, page_images, monkeypatch) -> None:
    def no_compiler(_gm: Any, _inputs: Any) -> Any:
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(compiled, "compile_function", lambda fn, *_: torch.compile(fn, backend=no_compiler))
    session = tiny_session.with_runtime(DECODE)
    try:
        with pytest.raises(UserError, match=r"runtime\.compile=decode: torch\.compile \(mode default") as info:
            session.run_image(page_images["small"], NEW_TOKENS, nvtx=False)
    finally:
        session.close()
    assert "no C++ compiler found" in info.value.problem
    assert "runtime.compile=none" in info.value.fix


def test_compiled_prefill_needs_inputs_embedded_apart(tiny_session, page_images) -> None:
    class NoEmbedding(type(tiny_session.adapter)):  # type: ignore[misc]
        def embed_prompt(self, model: Any, prepared: Any) -> None:
            return None

    adapter = NoEmbedding(tiny_session.adapter.settings)
    session = DeepSeekOCRSession(adapter, tiny_session.loaded, tiny_session.device, tiny_session.dtype, PREFILL_DECODE)
    try:
        with pytest.raises(UserError, match=r"merges its vision features inside its own forward") as info:
            session.run_image(page_images["small"], 2, nvtx=False)
    finally:
        session.close()
    assert "runtime.compile=none or decode" in info.value.fix


def test_cuda_graph_steps_are_marked(monkeypatch) -> None:
    marks: list[int] = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    step = CompiledStep("decode", lambda x: x + 1, "reduce-overhead", "decode")
    assert step.cuda_graphs
    assert int(step((1, 1, 8), torch.tensor(1))) == 2
    assert int(step((1, 1, 8), torch.tensor(2))) == 3
    assert len(marks) == 2
    assert [e.call for e in step.events] == [1]
    plain = CompiledStep("decode", lambda x: x * 2, "default", "decode")
    plain((1, 1, 8), torch.tensor(1))
    assert len(marks) == 2 and not plain.cuda_graphs
    tuned = CompiledStep("decode", lambda x: x - 1, "max-autotune", "decode")
    tuned((1, 1, 8), torch.tensor(1))
    assert len(marks) == 3 and tuned.cuda_graphs


def test_compiled_prefill_finds_its_static_cache_allocated(tiny_session, page_images, monkeypatch) -> None:
    from transformers.cache_utils import StaticLayer

    lazy = StaticLayer.lazy_initialization
    filled: list[int] = []  # positions in the key tensor each layer was allocated from: 0 = allocated ahead

    def spy(self: Any, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        filled.append(int(key_states.shape[-2]))
        lazy(self, key_states, value_states)

    monkeypatch.setattr(StaticLayer, "lazy_initialization", spy)
    session = tiny_session.with_runtime(PREFILL_DECODE)
    try:
        m = session.run_image(page_images["small"], NEW_TOKENS, nvtx=False)
        (cache,) = session._loop.caches._static.values()
    finally:
        session.close()
    text = tiny_session.model.config.text_config
    shape = (1, text.num_key_value_heads, m.prompt_tokens + NEW_TOKENS, text.head_dim)
    assert all(layer.is_initialized and tuple(layer.keys.shape) == shape for layer in cache.layers)
    assert filled == [0] * text.num_hidden_layers  # before the compiled prefill, not inside it


def test_compiled_steps_run_under_no_grad_not_inference_mode(tiny_session, page_images) -> None:
    """As transformers' compiled generate: CUDA-graph trees get ordinary tensors (no inference tensors)."""
    caches = {}
    for name, runtime in (("compiled", DECODE), ("eager", RuntimeSettings(kv_cache="static"))):
        session = tiny_session.with_runtime(runtime)
        try:
            session.run_image(page_images["small"], 2, nvtx=False)
            (caches[name],) = session._loop.caches._static.values()
        finally:
            session.close()
    assert not caches["compiled"].layers[0].keys.is_inference()
    assert not caches["compiled"].layers[0].keys.requires_grad
    assert caches["eager"].layers[0].keys.is_inference()


# ---- a compiled run gets the warm-up passes that absorb compilation ---------------------------------------------


def test_a_compiled_runtime_raises_run_warmup_and_says_why() -> None:
    from llm_perf_opt.pipeline.stage1 import ResolvedSettings, with_runtime_warmup

    cold = ResolvedSettings(1, 0, 8, 1, "smallest", {"run.warmup": "device default (cpu)"})
    raised = with_runtime_warmup(cold, DECODE)
    assert raised.warmup == 1
    assert raised.sources["run.warmup"].startswith("raised from 0 (device default (cpu)): runtime.compile=decode")
    graphs = RuntimeSettings(kv_cache="static", compile="prefill_decode", compile_mode="reduce-overhead")
    assert with_runtime_warmup(cold, graphs).warmup == 2  # a graph is recorded in its second call
    assert with_runtime_warmup(cold, RuntimeSettings()) is cold  # eager: nothing to absorb
    warm = ResolvedSettings(1, 3, 8, 1, "smallest", {"run.warmup": "config/override"})
    assert with_runtime_warmup(warm, DECODE) is warm


def test_compiled_decode_with_run_warmup_0_times_no_compilation(page_images, tmp_path) -> None:
    """The CPU what-if defaults (run.warmup=0, one timed pass) with a compiled decode: before, the compilation landed
    in the timed pass while the report said the warm-up passes absorbed it."""
    import shutil

    from llm_perf_opt.config_compose import compose_config
    from llm_perf_opt.pipeline.stage1 import Stage1Run
    from llm_perf_opt.records.folders import load_stage1

    root = tmp_path / "pages"
    root.mkdir()
    shutil.copy(page_images["small"], root / "page.png")
    cfg = compose_config(
        "stage1",
        "model=deepseek_ocr2_tiny",
        "device=cpu",
        f"dataset.root={root}",
        "run.warmup=0",
        "run.repeats=1",
        f"infer.max_new_tokens={NEW_TOKENS}",
        "pipeline.torch_profiler.enable=false",
        "runtime.kv_cache=static",
        "runtime.compile=decode",
        "runtime.compile_mode=default",
    )
    Stage1Run(command_config(cfg), tmp_path / "run", run_id="run").execute()
    m = load_stage1(tmp_path / "run").metrics
    assert m.settings.warmup == 1 and m.settings.sources["run.warmup"].startswith("raised from 0")
    assert m.compile is not None and len(m.compile.events) == 1  # compiled once, in the warm-up pass
    assert m.compile.in_timed_passes == ()
    assert any(w.startswith("run.warmup is 1, raised from 0") for w in m.warnings)
    report = (tmp_path / "run" / "report.md").read_text()
    assert "the 1 warm-up pass per input absorbed it: none fell in the timed passes." in report
    assumptions = (tmp_path / "run" / "assumptions.md").read_text()
    assert "Warm-up passes per image (run.warmup): 1 (raised from 0" in assumptions


def test_the_report_says_when_compilation_fell_in_timed_passes() -> None:
    from llm_perf_opt.records.stage1 import CompileEvent, CompileSummary
    from llm_perf_opt.report.stage1_reports import _compile_placement

    event = CompileEvent("decode", (1, 1, 100), 1, 7022.0, 3, 0, False)
    timed = _compile_placement(0, CompileSummary(events=(event,), cudagraph_skips=0, in_timed_passes=(event,)))
    assert timed.startswith("1 of the compiling calls (7.0 s) fell in the timed passes despite 0 warm-up passes")
    older = _compile_placement(0, CompileSummary(events=(event,), cudagraph_skips=0))  # recorded no placement
    assert older == "with no warm-up pass, the first timed pass of each input includes compilation."
    assert "absorb" not in timed + older


VISION = RuntimeSettings(compile_vision="default")


def test_compiled_vision_keeps_its_stage_timing_and_the_eager_tokens(tiny_session, page_images, eager_tokens) -> None:
    from llm_perf_opt.instruments.flops import count_stage_flops

    eager_flops = count_stage_flops(tiny_session, tiny_session.prepare(page_images["two_tiles"]))
    session = tiny_session.with_runtime(VISION)
    stages = session.vision_stages
    sam = session.adapter.stage_modules(session.model)["vision/sam"]
    try:
        assert isinstance(sam.forward, compiled.CompiledForward)  # in place: the stage hooks stay outside
        first = session.run_image(page_images["two_tiles"], NEW_TOKENS, nvtx=False)
        steady = session.run_image(page_images["two_tiles"], NEW_TOKENS, nvtx=False)
        flops = count_stage_flops(session, session.prepare(page_images["two_tiles"]))  # eager under the counter
        summary = session.compile_summary()
    finally:
        session.close()
    assert sam.forward.__func__ is type(sam).forward  # close() gave the module its own forward back
    assert first.token_ids == steady.token_ids == eager_tokens["two_tiles"].token_ids
    assert steady.output_check is not None and steady.output_check.first_departure is None  # against eager vision
    # each vision module compiled once per view shape (tiles, global view) in the first pass, none in the second
    assert {e.function for e in first.compile_events} == set(stages) and steady.compile_events == ()
    assert summary.events == first.compile_events
    for m in (first, steady):
        assert m.stage_calls["vision/sam"] == 2 and m.stage_ms["vision/sam"] > 0  # tiles and global view, timed
    # the same FLOPs: the counter ran the eager forwards (a matmul may count as mm or bmm: no_grad vs inference_mode)
    assert attrs.evolve(flops, by_operator={}) == attrs.evolve(eager_flops, by_operator={})
    assert sum(flops.by_operator.values()) == sum(eager_flops.by_operator.values())


def test_compiled_vision_is_labelled_raises_the_warm_up_and_needs_a_gpu_for_graphs() -> None:
    assert VISION.label == "dynamic KV cache, eager, compiled vision (default), batch 1"
    assert not VISION.is_reference and VISION.checks_outputs and VISION.warmup_needed == 1
    graphs = RuntimeSettings(compile_vision="reduce-overhead")
    assert graphs.warmup_needed == 2
    with pytest.raises(UserError, match=r"runtime\.compile_vision=reduce-overhead captures CUDA graphs"):
        graphs.check_device(torch.device("cpu"))
    with pytest.raises(UserError, match=r"runtime\.compile_vision=fast is not a known value"):
        RuntimeSettings.from_nodes(stage1_nodes({"runtime": {"compile_vision": "fast"}}))


def test_restoring_compiled_forwards_gives_each_module_its_forward_back() -> None:
    """A module that ran its class's forward finds it again (no instance attribute left behind); one whose instance
    forward was patched before gets that patch back."""
    from llm_perf_opt.session.compiled import CompiledForward, compile_forwards, restore_forwards

    plain, patched = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)

    def own(x: torch.Tensor) -> torch.Tensor:
        return x

    patched.forward = own  # type: ignore[method-assign]
    forwards = compile_forwards({"vision/a": plain, "vision/b": patched}, "default")
    assert isinstance(vars(plain)["forward"], CompiledForward) and isinstance(patched.forward, CompiledForward)
    restore_forwards(forwards)
    assert "forward" not in vars(plain) and plain.forward.__func__ is torch.nn.Linear.forward  # type: ignore[attr-defined]
    assert patched.forward is own
