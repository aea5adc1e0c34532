"""Kernels per decode step, summed kernel time, GPU-busy time and busy fraction: the arithmetic on synthetic
kernels, and the tie from profiler events to steps through launch correlation ids (never through GPU times)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from torch.autograd import DeviceType

from llm_perf_opt.instruments.torch_profiler import kernel_activity
from llm_perf_opt.measure.kernel_activity import busy_us, decode_activity, step_activities


def test_busy_time_is_the_union_of_overlapping_kernels_clipped_to_the_window() -> None:
    assert busy_us([(0, 10), (5, 15), (20, 30)], 0, 100) == 25  # [0,15] + [20,30]
    assert busy_us([(0, 10), (2, 3), (10, 12)], 0, 100) == 12  # nested and touching
    assert busy_us([(0, 10), (20, 30)], 5, 25) == 10  # clipped: [5,10] + [20,25]
    assert busy_us([], 0, 10) == 0


def test_steps_with_overlaps_gaps_and_no_kernels() -> None:
    host = {0: (0.0, 50.0), 1: (100.0, 110.0), 2: (120.0, 130.0), 3: (200.0, 205.0)}
    kernels = [
        (0, 10.0, 40.0),  # prefill
        (1, 105.0, 115.0),  # step 1: two overlapping kernels, then a gap
        (1, 110.0, 120.0),
        (1, 140.0, 150.0),
        (3, 201.0, 203.0),  # step 2 launches nothing
    ]
    per = step_activities(kernels, host)
    assert per[0].kernels == 1 and per[0].kernel_ms == pytest.approx(0.030) and per[0].wall_ms == pytest.approx(0.050)
    s1 = per[1]
    assert s1.kernels == 3
    assert s1.kernel_ms == pytest.approx(0.030)  # 10 + 10 + 10 µs, overlap counted each
    assert s1.busy_ms == pytest.approx(0.025)  # [105,120] + [140,150]
    assert s1.wall_ms == pytest.approx(0.050)  # host start 100 -> last kernel end 150
    s2 = per[2]  # its host span ran while step 1's kernels were still queued: its window starts at 150
    assert s2.kernels == 0 and s2.kernel_ms == 0 and s2.busy_ms == 0
    assert s2.wall_ms == 0  # the host span [120,130] ended before step 1's GPU work did
    assert per[3].wall_ms == pytest.approx(0.005) and per[3].busy_ms == pytest.approx(0.002)

    act = decode_activity(kernels, host, unattributed=2, method="synthetic")
    assert act is not None and act.steps == 3
    assert (act.kernels_min, act.kernels_max) == (0, 3)
    assert act.kernels_mean == pytest.approx(4 / 3)
    assert act.busy_fraction == pytest.approx((25 + 0 + 2) / (50 + 0 + 5))
    assert act.prefill is not None and act.prefill.kernels == 1
    assert act.unattributed_kernels == 2 and act.method == "synthetic"


def test_a_queued_step_starts_where_the_previous_one_ended() -> None:
    # The host runs ahead: both steps were launched by t=20, the GPU runs them back to back.
    host = {1: (0.0, 10.0), 2: (10.0, 20.0)}
    kernels = [(1, 5.0, 100.0), (2, 100.0, 200.0)]
    per = step_activities(kernels, host)
    assert per[1].wall_ms == pytest.approx(0.100) and per[1].busy_ms == pytest.approx(0.095)
    assert per[2].wall_ms == pytest.approx(0.100) and per[2].busy_ms == pytest.approx(0.100)  # starts at 100, not 10
    act = decode_activity(kernels, host, unattributed=0, method="m")
    assert act is not None and act.busy_fraction == pytest.approx(195 / 200)


def test_no_decode_step_means_no_record() -> None:
    assert decode_activity([(0, 1.0, 2.0)], {0: (0.0, 3.0)}, unattributed=0, method="m") is None


def _ev(name: str, start: float, end: float, *, device: DeviceType = DeviceType.CPU, **kw: Any) -> SimpleNamespace:
    fields = {"id": 0, "activity_type": "cpu_op", "linked_correlation_id": 0} | kw
    return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end), **fields)


def _kernel(start: float, end: float, corr: int, linked: int = 0) -> SimpleNamespace:
    return _ev("k", start, end, device=DeviceType.CUDA, id=corr, activity_type="kernel", linked_correlation_id=linked)


def test_profiler_events_tie_kernels_to_steps_by_their_launch_not_their_gpu_time() -> None:
    ann = "user_annotation"
    events = [
        _ev("stage:prefill", 0, 100, activity_type=ann),
        _ev("stage:decode/step", 200, 210, activity_type=ann),
        _ev("stage:decode/step", 220, 230, activity_type=ann),
        # GPU-side copy of a label: an annotation, not a kernel
        _ev("stage:decode/step", 500, 600, device=DeviceType.CUDA, activity_type="gpu_user_annotation"),
        _ev("cudaLaunchKernel", 10, 11, id=901, activity_type="cuda_runtime"),
        _kernel(20, 150, 901),  # prefill's kernel runs past the prefill's host span
        _ev("cudaLaunchKernel", 205, 206, id=902, activity_type="cuda_runtime"),
        _kernel(215, 300, 902),  # launched in step 1, runs during step 2's host span: still step 1
        _ev("cudaGraphLaunch", 222, 224, id=903, activity_type="cuda_driver"),
        *(_kernel(300 + 10 * i, 305 + 10 * i, 903) for i in range(3)),  # one graph replay, three kernels
        _ev("aten::mm", 226, 228, id=77),
        _kernel(400, 410, 904, linked=77),  # no runtime event kept: tied through its CPU op
        _ev("cudaLaunchKernel", 240, 241, id=905, activity_type="cuda_runtime"),
        _kernel(420, 430, 905),  # launched outside every span
        _ev("cudaMemcpyAsync", 225, 226, id=906, activity_type="cuda_runtime"),
        _ev("Memcpy DtoH", 440, 450, device=DeviceType.CUDA, id=906, activity_type="gpu_memcpy"),
    ]
    act = kernel_activity(events)
    assert act is not None and act.steps == 2
    assert act.prefill is not None and act.prefill.kernels == 1
    assert act.prefill.wall_ms == pytest.approx(0.150)
    assert (act.kernels_min, act.kernels_max) == (1, 4)  # step 1: 1 kernel; step 2: 3 graph kernels + 1
    assert act.unattributed_kernels == 1
    assert "correlation id" in act.method


def test_no_kernels_no_record() -> None:
    assert kernel_activity([_ev("stage:decode/step", 0, 1, activity_type="user_annotation")]) is None


def test_a_kernel_named_like_a_host_range_is_kept_when_a_launch_made_it() -> None:
    """torch 2.11 events carry no activity type. Inductor wraps each triton kernel's launch in a host range of the
    kernel's own name: that kernel stays; a GPU copy of a host range that no launch made (e.g. inductor's
    "## Call CompiledFxGraph … ##") is dropped."""
    from llm_perf_opt.instruments.torch_profiler import kernel_filter

    def event(name: str, device: DeviceType, id: int) -> SimpleNamespace:
        return SimpleNamespace(name=name, device_type=device, id=id, time_range=SimpleNamespace(start=0, end=1))

    triton = "triton_poi_fused_add_0"
    call = "## Call CompiledFxGraph abc ##"
    events = [
        event(call, DeviceType.CPU, 1),
        event(triton, DeviceType.CPU, 2),  # inductor's range around the launch
        event("cuLaunchKernel", DeviceType.CPU, 3),
        event(triton, DeviceType.CUDA, 3),  # the kernel, correlated with its launch
        event(call, DeviceType.CUDA, 1),  # the range's device-side copy
    ]
    is_kernel = kernel_filter(events)
    assert [ev.name for ev in events if ev.device_type == DeviceType.CUDA and is_kernel(ev)] == [triton]


def test_a_host_ranges_gpu_copy_is_dropped_even_when_its_id_equals_a_launchs() -> None:
    """The H100 rung of 2026-11-27 with SAM compiled by max-autotune without CUDA graphs: the GPU copy of inductor's
    "## Call CompiledFxGraph … ##" range carried an id equal to some launch's correlation id (host ranges and launches
    are numbered apart), so it was counted as a 12.4 ms kernel beside the kernels inside it, doubling SAM's kernel
    time. A GPU event under a host range's name that spans a kernel of another name is that range's copy; a triton
    kernel under its own wrapper's name, spanning nothing else, stays."""
    from llm_perf_opt.instruments.torch_profiler import kernel_filter

    def event(name: str, device: DeviceType, id: int, start: float, end: float) -> SimpleNamespace:
        return SimpleNamespace(name=name, device_type=device, id=id, time_range=SimpleNamespace(start=start, end=end))

    call, triton, gemm = "## Call CompiledFxGraph abc ##", "triton_poi_fused_add_0", "nvjet_sm90_tst_128x72"
    events = [
        event(call, DeviceType.CPU, 7, 0, 50),
        event(triton, DeviceType.CPU, 8, 1, 2),
        event("cuLaunchKernel", DeviceType.CPU, 3, 1, 2),
        event("cudaLaunchKernel", DeviceType.CPU, 4, 3, 4),
        event("cudaLaunchKernel", DeviceType.CPU, 7, 5, 6),  # a launch whose correlation id equals the range's id
        event(triton, DeviceType.CUDA, 3, 10, 20),
        event(gemm, DeviceType.CUDA, 4, 20, 30),
        event(call, DeviceType.CUDA, 7, 10, 30),  # the range's device-side copy, spanning both kernels
    ]
    is_kernel = kernel_filter(events)
    assert [ev.name for ev in events if ev.device_type == DeviceType.CUDA and is_kernel(ev)] == [triton, gemm]
    step = [event("stage:decode/step", DeviceType.CPU, 2, 0, 60)]
    activity = kernel_activity([*step, *events], kernel_filter([*step, *events]))
    assert activity is not None and activity.kernels_mean == 2  # the copy is not a third kernel of the step
