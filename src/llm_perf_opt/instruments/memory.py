"""The memory pass: one untimed pass after the timed ones with the allocator's peaks recorded per stage, the KV
cache measured at each stage boundary, and (CUDA) the allocator's history kept for PyTorch's memory viewer.

`MemoryRecorder` is a `StageRecorder` that, at every span boundary, reads the allocator (allocated, reserved and
the peaks since the previous boundary), folds the peak into every open span and resets the peak counters, so each
span's peak is exact however spans nest; `measure.memory_figures` turns what it saw into the report's figures.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import attrs
import torch

from llm_perf_opt.config_schema import MemorySchema
from llm_perf_opt.instruments.measured_session import MeasuredSession, P
from llm_perf_opt.instruments.timing import StageRecorder
from llm_perf_opt.measure.memory_figures import kv_bytes_per_token
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.memory import GraphPools, MemoryPass, MemorySample, StagePeak

MIB = 2**20
SNAPSHOT_FILE = "memory/snapshot.pickle"


class DecoderConfigs(Protocol):
    """What the memory pass asks a session's model adapter (`session.adapters.base.ModelAdapter`)."""

    def decoder_config(self, model: torch.nn.Module) -> Any:
        """The text decoder's transformers config (None: none to read)."""


class MemorySession(MeasuredSession[P], Protocol[P]):
    """What `memory_pass` drives (`session.session.InferenceSession`): a pass, its KV cache seen as it grows."""

    @property
    def model(self) -> torch.nn.Module: ...

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def adapter(self) -> DecoderConfigs: ...

    def observe_cache(self, observer: Callable[[object], None]) -> AbstractContextManager[None]:
        """Within the block, `observer` sees each pass's KV cache when it is made and after the prefill."""


class AllocatorState(Protocol):
    """What the recorder reads of an allocator (the CUDA caching allocator, or a fake in tests)."""

    def read(self) -> tuple[int, int, int, int]:
        """(allocated, reserved, peak allocated, peak reserved) since the last reset, in bytes."""

    def reset(self) -> None:
        """Reset the peaks to the current values."""


@attrs.frozen
class CudaAllocator:
    """The CUDA caching allocator of one device."""

    device: torch.device

    def read(self) -> tuple[int, int, int, int]:
        d = self.device
        return (
            torch.cuda.memory_allocated(d),
            torch.cuda.memory_reserved(d),
            torch.cuda.max_memory_allocated(d),
            torch.cuda.max_memory_reserved(d),
        )

    def reset(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)


@attrs.define
class _Open:
    stage: str
    peak: int
    reserved: int
    kv: int


@attrs.define
class _Stage:
    spans: int = 0
    peak: int = 0
    reserved: int = 0
    kv: int = 0


class MemoryRecorder(StageRecorder):
    """A stage recorder that samples the allocator and the KV cache at every span boundary (no NVTX)."""

    def __init__(self, device: torch.device, allocator: AllocatorState, kv_bytes: Callable[[], int]) -> None:
        super().__init__(device, nvtx=False)
        self.allocator = allocator
        self.kv_bytes = kv_bytes
        self.samples: list[MemorySample] = []
        self._stack: list[_Open] = []
        self._stages: dict[str, _Stage] = {}
        self._t0 = time.perf_counter()

    def _boundary(self, event: str, stage: str) -> MemorySample:
        allocated, reserved, peak, peak_reserved = self.allocator.read()
        kv = self.kv_bytes()
        for span in self._stack:  # the interval since the last boundary lies in every open span
            if peak > span.peak:
                span.peak, span.kv = peak, kv
            elif peak == span.peak:
                span.kv = max(span.kv, kv)
            span.reserved = max(span.reserved, peak_reserved)
        t_ms = (time.perf_counter() - self._t0) * 1e3
        self.samples.append(MemorySample(t_ms, event, stage, allocated, reserved, kv))
        self.allocator.reset()
        return self.samples[-1]

    def begin(self, name: str) -> None:
        sample = self._boundary("begin", name)
        super().begin(name)
        self._stack.append(_Open(name, sample.allocated_bytes, sample.reserved_bytes, sample.kv_bytes))

    def end(self, name: str) -> None:
        super().end(name)
        self._boundary("end", name)
        index = max(i for i, span in enumerate(self._stack) if span.stage == name)
        span = self._stack.pop(index)
        stage = self._stages.setdefault(name, _Stage())
        stage.spans += 1
        if span.peak >= stage.peak:
            stage.peak, stage.kv = span.peak, span.kv
        stage.reserved = max(stage.reserved, span.reserved)

    def peaks(self) -> tuple[StagePeak, ...]:
        """Each stage's largest peak over its spans, in first-seen order."""
        return tuple(StagePeak(name, s.spans, s.peak, s.reserved, s.kv) for name, s in self._stages.items())


def _tensors(obj: object, depth: int = 0) -> Iterator[torch.Tensor]:
    """The tensors of a KV cache: transformers' `Cache` (`layers[i].keys/values`, or `key_cache/value_cache`) or a
    legacy tuple of (key, value) per layer."""
    if isinstance(obj, torch.Tensor):
        yield obj
        return
    if obj is None or depth > 4:
        return
    if isinstance(obj, list | tuple):
        for item in obj:
            yield from _tensors(item, depth + 1)
        return
    layers = getattr(obj, "layers", None)
    if isinstance(layers, list | tuple):
        for layer in layers:
            for name in ("keys", "values"):
                yield from _tensors(getattr(layer, name, None), depth + 1)
        return
    for name in ("key_cache", "value_cache"):
        yield from _tensors(getattr(obj, name, None), depth + 1)


def _storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of `tensors`, each storage (data pointer) once."""
    by_storage: dict[int, int] = {}
    for t in tensors:
        by_storage.setdefault(t.data_ptr(), t.numel() * t.element_size())
    return sum(by_storage.values())


def cache_bytes(cache: object) -> int:
    """Bytes of a KV cache's tensors (each storage once)."""
    return _storage_bytes(t for t in _tensors(cache) if t.numel())


@attrs.define
class CacheWatch:
    """Follows the pass's KV cache (`MemorySession.observe_cache`): its bytes now, and those it held when first
    seen (a reused static cache is allocated before the pass)."""

    cache: object = None
    preexisting: int | None = None

    def __call__(self, cache: object) -> None:
        if self.preexisting is None:
            self.preexisting = cache_bytes(cache)
        if cache is not None:
            self.cache = cache

    def bytes(self) -> int:
        return cache_bytes(self.cache) if self.cache is not None else 0


def model_bytes(model: torch.nn.Module) -> int:
    """Parameter and buffer bytes of `model` (each storage once: tied weights count once)."""
    return _storage_bytes(t for t in (*model.parameters(), *model.buffers()) if t.device.type != "meta")


def free_memory(device: torch.device) -> int | None:
    """Bytes this process may still allocate on `device`: the device's free memory (`torch.cuda.mem_get_info`) +
    the blocks its allocator holds cached; None off CUDA (no check there)."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(free) + max(0, int(cached))


def graph_pools(snapshot: Mapping[str, Any]) -> tuple[GraphPools | None, str]:
    """Memory in CUDA-graph private pools, from the snapshot's segments (`segment_pool_id` other than (0, 0))."""
    segments = snapshot.get("segments") or []
    if segments and not all("segment_pool_id" in s for s in segments):
        return None, "this torch's snapshot names no segment pools: CUDA-graph pools are included in reserved"
    private = [s for s in segments if tuple(s.get("segment_pool_id") or (0, 0)) != (0, 0)]
    pools = GraphPools(
        segments=len(private),
        reserved_bytes=sum(int(s.get("total_size", 0)) for s in private),
        allocated_bytes=sum(int(s.get("allocated_size", 0)) for s in private),
    )
    expandable = sum(1 for s in segments if s.get("is_expandable"))
    note = "segments with segment_pool_id ≠ (0, 0) in the allocator snapshot" + (
        f"; {expandable} expandable segment(s)" if expandable else ""
    )
    return pools, note


def snapshot_bytes(snapshot: object, max_mib: float) -> tuple[bytes | None, str]:
    """The pickled snapshot when it is at most `max_mib` MiB, and a note either way."""
    if max_mib <= 0:
        return None, "not saved (pipeline.memory.snapshot_max_mib=0)"
    data = pickle.dumps(snapshot)
    size = len(data) / MIB
    if size > max_mib:
        return None, f"not saved: {size:,.1f} MiB > pipeline.memory.snapshot_max_mib={max_mib:g} MiB"
    return data, f"{size:,.1f} MiB; open it at https://pytorch.org/memory_viz"


@attrs.frozen
class MemoryOutcome:
    measured: MemoryPass
    snapshot: bytes | None


def memory_pass(
    session: MemorySession[P], paths: Sequence[Path], key: str, new_tokens: int, settings: MemorySchema
) -> MemoryOutcome:
    """One untimed pass of `paths` (one input or a batch) under a `MemoryRecorder`, with the allocator's history
    recorded for the snapshot. CUDA only."""
    device = session.device
    torch.cuda.synchronize(device)
    watch = CacheWatch()
    recorder = MemoryRecorder(device, CudaAllocator(device), watch.bytes)
    if session.routing is not None:
        session.routing.begin_pass()
    torch.cuda.memory._record_memory_history(max_entries=settings.max_entries, stacks="python")
    try:
        baseline = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        with session.observe_cache(watch), recorder.span(vocab.E2E):
            with recorder.span(vocab.PREPROCESS):
                prepared = [session.prepare(path) for path in paths]
            session.generate_batch(prepared, new_tokens, recorder)
        torch.cuda.synchronize(device)
        snapshot = torch.cuda.memory._snapshot(device)
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
        if session.routing is not None:
            session.routing.begin_pass()
    free, total = torch.cuda.mem_get_info(device)
    measured = _pass_record(session, prepared, key, new_tokens, recorder, watch, baseline)
    pools, pools_note = graph_pools(snapshot)
    data, note = snapshot_bytes(snapshot, settings.snapshot_max_mib)
    measured = attrs.evolve(
        measured,
        total_memory_bytes=int(torch.cuda.get_device_properties(device).total_memory),
        outside_allocator_bytes=max(0, int(total) - int(free) - torch.cuda.memory_reserved(device)),
        graph_pools=pools,
        graph_pools_note=pools_note,
        snapshot=SNAPSHOT_FILE if data is not None else None,
        snapshot_note=note,
    )
    return MemoryOutcome(measured, data)


def _pass_record(
    session: MemorySession[P],
    prepared: Sequence[P],
    key: str,
    new_tokens: int,
    recorder: MemoryRecorder,
    watch: CacheWatch,
    baseline: int,
) -> MemoryPass:
    """What `memory_pass` measured, before the device-wide figures are added."""
    context = max(p.prompt_tokens for p in prepared) + new_tokens - 1
    config = session.adapter.decoder_config(session.model)
    per_token = kv_bytes_per_token(config, session.dtype.itemsize)
    positions = getattr(config, "max_position_embeddings", None)
    kv_end = watch.bytes()
    source = "model config: 2 (K, V) × layers × KV heads × head dim × dtype bytes"
    if per_token is None and kv_end:
        per_token = None if not context else round(kv_end / context / len(prepared))
        source = "measured: KV-cache bytes at the end of the pass / positions written / batch"
    return MemoryPass(
        input=key,
        batch_size=len(prepared),
        new_tokens=new_tokens,
        context_tokens=context,
        weights_bytes=model_bytes(session.model),
        baseline_allocated_bytes=baseline,
        preexisting_kv_bytes=watch.preexisting or 0,
        total_memory_bytes=0,
        outside_allocator_bytes=0,
        kv_bytes_per_token=per_token,
        kv_per_token_source=source if per_token is not None else "unknown: no decoder config and no cache seen",
        peaks=recorder.peaks(),
        samples=tuple(recorder.samples),
        max_positions=int(positions) if isinstance(positions, int) else None,
    )
