"""What `pipeline/torch_profiler=max` records shows in operators.md (input shapes, memory, call sites, the trace);
the default preset shows none of it; the GPU-activity line of report.md and the key findings."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

from helpers import run_main
from llm_perf_opt.errors import UserError
from llm_perf_opt.instruments import torch_profiler as tp
from llm_perf_opt.instruments.timing import StageRecorder
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.folders import load_stage1
from llm_perf_opt.records.io import converter, to_plain
from llm_perf_opt.records.stage1 import (
    CallSite,
    DecodeActivity,
    OperatorTable,
    ShapeGroup,
    Stage1Metrics,
    StepActivity,
)
from llm_perf_opt.report.recommendations import key_findings
from llm_perf_opt.report.stage1_reports import operators_md, report_md
from llm_perf_opt.session.runtime import RuntimeSettings

RUN = Path(__file__).parent / "fixtures" / "runs" / "cpu_tiny_v1_stage1"
DETAILS = "## Shapes, memory and call sites"
LONG = "[[" + ", ".join(["4096"] * 40) + "]]"


def _with_details(ops: OperatorTable) -> OperatorTable:
    first = attrs.evolve(
        ops.overall[0],
        shapes=(
            ShapeGroup(shapes="[[1, 64], [64, 64]]", calls=7, self_device_ms=0.0, self_cpu_ms=1.5),
            ShapeGroup(shapes=LONG, calls=2, self_device_ms=0.0, self_cpu_ms=0.5),
        ),
        self_cpu_memory_bytes=3 * 1024**2,
        self_device_memory_bytes=None,
        call_sites=(CallSite(frames=("modeling_x.py(10): forward", "modeling_x.py(99): forward"), calls=6),),
        call_site_count=4,
    )
    return attrs.evolve(ops, overall=(first, *ops.overall[1:]))


def test_recorded_details_render_as_columns_and_round_trip() -> None:
    folder = load_stage1(RUN)
    assert folder.operators is not None
    ops = _with_details(folder.operators)
    assert converter.structure(to_plain(ops), OperatorTable) == ops
    text = operators_md(folder.metrics, ops, 5)
    assert DETAILS in text
    assert "input shapes" in text and "self CPU memory (MiB)" in text and "called from" in text
    assert "self device memory" not in text  # a CPU run: no device column
    assert "`[[1, 64], [64, 64]]`: 7, 1.500" in text and "|3.00|" in text
    assert "`modeling_x.py(10): forward` ← `modeling_x.py(99): forward` (6 calls)<br>+3 other sites" in text
    assert f"`{LONG[:71]}…`: 2, 0.500" in text and LONG not in text  # a long shape list is clipped
    # Without recorded details (the fixture, default preset) the section is absent, not empty.
    assert DETAILS not in operators_md(folder.metrics, folder.operators, 5)


def test_gpu_activity_line_in_report_and_findings() -> None:
    folder = load_stage1(RUN)
    m = folder.metrics
    assert "n/a on CPU" in report_md(m, folder.operators, [])
    assert not any("kernels" in line for line in key_findings(m))
    act = DecodeActivity(
        steps=4,
        kernels_mean=850.0,
        kernels_min=850,
        kernels_max=850,
        kernel_ms_mean=4.2,
        busy_ms_mean=4.0,
        wall_ms_mean=17.0,
        busy_fraction=4.0 / 17.0,
        prefill=StepActivity(kernels=3000, kernel_ms=40.0, busy_ms=38.0, wall_ms=60.0),
        unattributed_kernels=3,
        method="test method",
    )
    assert m.profiler is not None
    gpu = attrs.evolve(
        m,
        device=attrs.evolve(m.device, type="cuda"),
        profiler=attrs.evolve(m.profiler, activity=act),
    )
    assert converter.structure(to_plain(gpu), Stage1Metrics) == gpu  # the new record round-trips in metrics.json
    text = report_md(gpu, folder.operators, [])
    assert "GPU activity per decode step (4 steps profiled): 850.0 kernels (850)" in text
    assert "= 23.5% busy" in text and "prefill: 3,000 kernels" in text and "Method: test method" in text
    assert any("850 kernels and was busy 24%" in line for line in key_findings(gpu))


@pytest.mark.slow
def test_max_preset_operators_show_shapes_memory_and_call_sites(tmp_path: Path) -> None:
    out = tmp_path / "max"
    done = run_main(  # in this process: what the profiler records, not the console script's process
        "llm_perf_opt.cli.stage1",
        "model=deepseek_ocr_tiny",
        "pipeline/torch_profiler=max",
        "pipeline.torch_profiler.decode_steps=2",
        "run.repeats=1",
        "run.warmup=0",
        "infer.max_new_tokens=3",
        "dataset.max_images=1",
        f"hydra.run.dir={out}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    text = (out / "operators.md").read_text()
    assert DETAILS in text
    assert "input shapes (top groups by calls: calls, self ms)" in text and "self CPU memory (MiB)" in text
    assert "modeling_deepseek_ocr2.py(" in text  # call sites name the model's own code
    assert "[torch_profiler/trace.json.gz](torch_profiler/trace.json.gz)" in text
    ops = json.loads((out / "operators.json").read_text())
    mm = next(r for r in ops["overall"] if r["name"] in ("aten::mm", "aten::addmm"))
    assert mm["shapes"] and mm["shapes"][0]["calls"] > 0 and mm["call_sites"]
    assert mm["self_cpu_memory_bytes"] is not None
    assert not any(r["name"].startswith(("torch/", "nn.Module:")) for r in ops["overall"])  # frames are not operators
    assert "n/a on CPU" in (out / "report.md").read_text()


class _FakeSession:
    """Just enough of a session for `profile_image`: one matmul per forward pass on the CPU."""

    device = torch.device("cpu")
    runtime = RuntimeSettings()

    def prepare(self, path: Path) -> None:
        return None

    def caches_sized_for(self, new_tokens: int) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def generate(self, prepared: None, new_tokens: int, recorder: StageRecorder) -> None:
        a = torch.ones(8, 8)
        with recorder.span(vocab.PREFILL):
            a = a @ a
        for _ in range(new_tokens - 1):
            with recorder.span(vocab.DECODE_STEP):
                a = a @ a


def _garbling(failures: int) -> type:
    """A torch.profiler.profile whose first `failures` instances cannot read their events back (as torch's Python
    tracer sometimes leaves an undecodable frame name)."""
    seen = {"n": 0}

    class Garbling(tp.profile):
        def events(self) -> Any:
            seen["n"] += 1
            if seen["n"] <= failures:
                raise UnicodeDecodeError("utf-8", b"\xb0", 0, 1, "invalid start byte")
            return super().events()

    return Garbling


def test_an_unreadable_profile_is_profiled_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tp, "profile", _garbling(1))
    flags = {"record_shapes": True, "profile_memory": False, "with_stack": False, "with_flops": False}
    table = tp.profile_image(_FakeSession(), [Path("x.png")], decode_steps=2, trace_path=None, **flags)
    mm = next(r for r in table.overall if r.name == "aten::mm")
    assert mm.calls == 3 and mm.shapes[0].shapes == "[[8, 8], [8, 8]]"
    assert table.activity is None  # a CPU run: no kernels


def test_the_post_processing_runs_inside_the_gpu_idle_window() -> None:
    """The energy pass measures idle power around the post-processing: entered after the profiled pass, left once
    the tables are built."""
    seen: list[str] = []

    @contextlib.contextmanager
    def idle() -> Iterator[None]:
        seen.append("enter")
        yield
        seen.append("exit")

    flags = {"record_shapes": False, "profile_memory": False, "with_stack": False, "with_flops": False}
    table = tp.profile_image(_FakeSession(), [Path("x.png")], decode_steps=1, trace_path=None, gpu_idle=idle(), **flags)
    assert seen == ["enter", "exit"] and any(r.name == "aten::mm" for r in table.overall)


def test_a_profile_that_stays_unreadable_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tp, "profile", _garbling(tp.PROFILE_ATTEMPTS))
    flags = {"record_shapes": False, "profile_memory": False, "with_stack": True, "with_flops": False}
    with pytest.raises(UserError, match="with_stack=false"):
        tp.profile_image(_FakeSession(), [Path("x.png")], decode_steps=1, trace_path=None, **flags)


def _event(ident: int, name: str, start: int, end: int, **kwargs: Any) -> Any:
    from torch.autograd.profiler_util import FunctionEvent

    return FunctionEvent(ident, name, thread=0, start_us=start, end_us=end, **kwargs)


def test_device_times_are_torchs_computed_once() -> None:
    """The profiled pass's tables read each event's device times through `DeviceTimes`: the same numbers as torch's
    `FunctionEvent` properties (which re-sum the subtree on every read), for nested host operators with kernels of
    their own, an async one, a host event without a device, and a device-side event."""
    from torch.autograd import DeviceType

    root = _event(1, "aten::linear", 0, 100, use_device="cuda")
    mid = _event(2, "aten::addmm", 10, 90, use_device="cuda")
    leaf = _event(3, "aten::copy_", 20, 30, use_device="cuda")
    root.append_kernel("k_root", 0, 5)
    mid.append_kernel("gemm", 0, 40)
    mid.append_kernel("gemm_tail", 0, 3)
    leaf.append_kernel("copy", 0, 7)
    root.append_cpu_child(mid)
    mid.append_cpu_child(leaf)
    async_ev = _event(4, "async", 0, 10, use_device="cuda", is_async=True)
    async_ev.append_kernel("k", 0, 9)
    host_only = _event(5, "aten::add", 0, 10)  # a CPU run: no device
    on_gpu = _event(6, "gemm", 40, 75, use_device="cuda", device_type=DeviceType.CUDA)
    times = tp.DeviceTimes()
    for ev in (leaf, root, mid, async_ev, host_only, on_gpu):  # a parent read before and after its children
        assert times.total(ev) == ev.device_time_total
        assert times.own(ev) == ev.self_device_time_total
    assert (times.total(root), times.own(root), times.own(mid)) == (55.0, 5.0, 43.0)


def test_each_event_is_read_once_for_the_overall_and_the_stage_tables() -> None:
    """The operator tables read each event's figures once (`_measured`) and find its stage through the ancestors
    already looked at: an operator nested under a stage range goes to that stage (decode steps to `decode`), one
    outside every range to none, and the rows carry torch's own host and device times."""
    from llm_perf_opt.instruments.profiler_labels import STAGE_LABEL_PREFIX

    prefill = _event(1, STAGE_LABEL_PREFIX + vocab.PREFILL, 0, 100)
    linear = _event(2, "aten::linear", 10, 60, use_device="cuda")
    addmm = _event(3, "aten::addmm", 20, 50, use_device="cuda")
    step = _event(4, STAGE_LABEL_PREFIX + vocab.DECODE_STEP, 200, 300)
    add = _event(5, "aten::add", 210, 230, use_device="cuda")
    outside = _event(6, "aten::add", 400, 410, use_device="cuda")
    addmm.append_kernel("gemm", 0, 25)
    add.append_kernel("add", 0, 4)
    for parent, child in ((prefill, linear), (linear, addmm), (step, add)):
        parent.append_cpu_child(child)
        child.set_cpu_parent(parent)
    known: dict[int, str | None] = {}
    stages = [tp._stage_of(ev, known) for ev in (linear, addmm, add, outside)]
    assert stages == [vocab.PREFILL, vocab.PREFILL, vocab.DECODE, None]
    assert set(known) == {id(prefill), id(linear), id(step)}  # each ancestor looked at once
    operators = [linear, addmm, add, outside]
    measured = tp._measured(operators, tp.DeviceTimes(), tp.operator_name)
    rows = {r.name: r for r in tp._aggregate(measured, "self_cpu_ms")}
    assert rows["aten::add"].calls == 2
    assert rows["aten::add"].self_cpu_ms == pytest.approx((add.self_cpu_time_total + outside.self_cpu_time_total) / 1e3)
    assert rows["aten::linear"].self_cpu_ms == pytest.approx(linear.self_cpu_time_total / 1e3) == 0.02
    assert rows["aten::linear"].total_device_ms == pytest.approx(0.025)
    assert rows["aten::addmm"].self_device_ms == pytest.approx(0.025)


def test_torchs_own_parsing_time_is_read_from_a_real_profile_and_absent_where_torch_keeps_none() -> None:
    """operators.md says how much of the post-processing was torch's own parsing of the pass into its event tree:
    read from the profiler's statistics after the first `events()` call; None for a profiler without them."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.ones(64, 64) @ torch.ones(64, 64)
    assert tp.torch_parse_s(prof) is None  # nothing parsed yet
    assert len(prof.events()) > 0
    parsed = tp.torch_parse_s(prof)
    assert parsed is not None and 0 < parsed < 60
    assert tp.torch_parse_s(object()) is None
