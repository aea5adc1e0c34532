"""Executed FLOPs per stage, counted on the real modules with `torch.utils.flop_counter.FlopCounterMode`.

Convention: 1 multiply-add = 2 FLOPs (FlopCounterMode counts 2·M·N·K). Counted: matmuls, convolutions and
attention (elementwise ops, norms, softmax and routing are not counted). Attention kernels are counted over the
full score matrix, as FlopCounterMode does (a causal kernel may skip up to half of it). The MoE experts count
only the rows actually routed (active parameters), whatever experts implementation runs.

PyTorch's counter lacks formulas for ops these models run, so we add them:
- `aten._grouped_mm` (transformers' default "grouped_mm" experts backend) and transformers' own
  `transformers::grouped_mm_fallback` (same arguments, a loop of `mm` that the counter cannot see into), which
  that backend runs where `torch._grouped_mm` cannot (older torch, pre-Ampere GPUs, some CPU builds),
- `aten._scaled_dot_product_flash_attention_for_cpu` (SDPA on the CPU),
- grouped-query attention in every SDPA op (`enable_gqa`: fewer key/value heads than query heads), which the
  counter of torch < 2.12 rejects: QKᵀ and AV are counted over the query heads, the key/value heads broadcast.

Inputs of the same shapes execute the same FLOPs, so a run counts once per distinct input signature
(:class:`FlopCounts`): the count depends on the inputs' shapes (every tensor's shape and dtype, the crop grid, the
prompt length), never on their values. The MoE layers are no exception: each token goes to its top-k routed experts
(and the shared ones), so the routed rows are tokens x k whichever experts they are, and every expert has the same
shape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol, TypeVar

import torch
from torch.utils.flop_counter import FlopCounterMode

from llm_perf_opt.instruments.measured_session import P, PreparedInput
from llm_perf_opt.instruments.timing import StageRecorder
from llm_perf_opt.measure.stage_flops import ANALYTIC_SOURCE, StageFlops
from llm_perf_opt.records import vocabulary as vocab

log = logging.getLogger(__name__)


class PricedStage(Protocol):
    """What the FLOP counts read of an analytic stage cost (`analytic.model.StageCost`)."""

    @property
    def matmul_flops(self) -> float: ...


# The prepared input a session's methods take (they only take it, so a protocol over them is contravariant in it).
P_in = TypeVar("P_in", bound=PreparedInput, contravariant=True)


class CostedAdapter(Protocol[P_in]):
    """What the FLOP counts ask of a session's model adapter (`session.adapters.base.ModelAdapter`)."""

    @property
    def has_analytic_model(self) -> bool: ...

    def stage_modules(self, model: torch.nn.Module) -> Mapping[str, torch.nn.Module]: ...

    def analytic_costs(
        self, model: torch.nn.Module, prepared: P_in, new_tokens: int, dtype_bytes: int
    ) -> Mapping[str, PricedStage] | None: ...

    def analytic_batch_costs(
        self, model: torch.nn.Module, batch: Sequence[P_in], new_tokens: int, dtype_bytes: int
    ) -> Mapping[str, PricedStage] | None: ...


class CountedSession(Protocol[P_in]):
    """What the FLOP counts drive (`session.session.InferenceSession`): its model, adapter and reference passes."""

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def model(self) -> torch.nn.Module: ...

    @property
    def adapter(self) -> CostedAdapter[P_in]: ...

    @property
    def vision_stages(self) -> tuple[str, ...]: ...

    def generate_batch(
        self,
        batch: Sequence[P_in],
        max_new_tokens: int,
        recorder: StageRecorder,
        around_step: Callable[[int], AbstractContextManager[object]] | None = None,
        *,
        reference: bool = False,
    ) -> object: ...


def _sdpa_flops(
    query_shape: Sequence[int], key_shape: Sequence[int], value_shape: Sequence[int], *args: object, **kwargs: object
) -> int:
    """QKᵀ + AV over the query heads: 2·b·h_q·s_q·s_k·d + 2·b·h_q·s_q·s_k·d_v (key/value heads broadcast under GQA)."""
    batch, heads, s_q, d_qk = query_shape
    s_k, d_v = key_shape[-2], value_shape[-1]
    return 2 * batch * heads * s_q * s_k * (d_qk + d_v)


def _grouped_mm_flops(
    mat_a: torch.Tensor, mat_b: torch.Tensor, offs: torch.Tensor | None = None, *args: object, **kwargs: object
) -> int:
    """2·rows·K·N over the rows the offsets cover (sentinel rows past offs[-1] are not computed)."""
    if mat_a.dim() == 2 and mat_b.dim() == 3:  # [T, K] x [E, K, N], rows grouped by expert
        rows = int(offs[-1]) if offs is not None and offs.device.type != "meta" else mat_a.shape[0]
        return 2 * rows * mat_a.shape[1] * mat_b.shape[2]
    if mat_a.dim() == 3 and mat_b.dim() == 3:  # batched [G, M, K] x [G, K, N]
        return 2 * mat_a.shape[0] * mat_a.shape[1] * mat_a.shape[2] * mat_b.shape[2]
    if mat_a.dim() == 2 and mat_b.dim() == 2:  # [M, K] x [K, N], groups along K
        k = int(offs[-1]) if offs is not None and offs.device.type != "meta" else mat_a.shape[1]
        return 2 * mat_a.shape[0] * k * mat_b.shape[1]
    # [G, M, K] x [K, N] with groups along N: group g multiplies its own slice of columns
    n = int(offs[-1]) if offs is not None and offs.device.type != "meta" else mat_b.shape[-1]
    return 2 * mat_a.shape[1] * mat_a.shape[2] * n


_grouped_mm_flops._get_raw = True  # type: ignore[attr-defined]  # FlopCounterMode passes tensors, not shapes


def _extra_formulas() -> dict[Any, Callable[..., int]]:
    formulas: dict[Any, Callable[..., int]] = {}
    aten = torch.ops.aten
    if hasattr(aten, "_grouped_mm"):
        formulas[aten._grouped_mm] = _grouped_mm_flops
    # Registered when transformers' MoE integration is imported; an op that is not registered cannot have run.
    if hasattr(torch.ops.transformers, "grouped_mm_fallback"):
        formulas[torch.ops.transformers.grouped_mm_fallback] = _grouped_mm_flops
    for name in (
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
    ):
        if hasattr(aten, name):
            formulas[getattr(aten, name)] = _sdpa_flops
    return formulas


def flop_counter() -> FlopCounterMode:
    """A FlopCounterMode that also knows grouped_mm (and transformers' fallback op), CPU SDPA and grouped-query SDPA."""
    return FlopCounterMode(display=False, custom_mapping=_extra_formulas())


@contextmanager
def _stage_counters(modules: Mapping[str, torch.nn.Module], totals: dict[str, float]) -> Iterator[None]:
    """Count each call of each stage module under its own counter (nested inside the step's), adding its FLOPs to
    `totals[stage]`: a module's FLOPs whether it runs inside the model's forward or on its own (a batch embeds
    each input's vision outside the model's forward, where the step counter's module names do not reach it)."""
    running: dict[str, FlopCounterMode] = {}
    handles = []
    for stage, module in modules.items():
        totals[stage] = 0.0

        def enter(_module: torch.nn.Module, _args: tuple[object, ...], stage: str = stage) -> None:
            running[stage] = flop_counter()
            running[stage].__enter__()

        def leave(_module: torch.nn.Module, _args: tuple[object, ...], _out: object, stage: str = stage) -> None:
            counter = running.pop(stage)
            counter.__exit__(None, None, None)
            totals[stage] += float(counter.get_total_flops())

        handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def count_stage_flops(session: CountedSession[P], prepared: P | Sequence[P]) -> StageFlops:
    """Count prefill (with vision sub-stages) and two decode steps of `prepared` on `session`'s model. `prepared` is one
    input, or a sequence of inputs run as one batch (vision per input, the decoder batched with left padding): then the
    counts are the batch's, padding positions included (a padded prompt position is computed like a token, and every
    decode step attends the padded prompt), and `prompt_tokens` is the padded prompt length, so `decode_step(context)`
    is the whole batch's step."""
    counters: dict[int, FlopCounterMode] = {}

    @contextmanager
    def around(step: int) -> Iterator[None]:
        counters[step] = flop_counter()
        with counters[step]:
            yield

    recorder = StageRecorder(session.device, nvtx=False)
    batch = list(prepared) if isinstance(prepared, Sequence) else [prepared]
    vision: dict[str, float] = {}
    with _stage_counters(session.adapter.stage_modules(session.model), vision):
        session.generate_batch(batch, 3, recorder, around_step=around, reference=True)
    prompt_tokens = max(p.prompt_tokens for p in batch)
    step1, step2 = counters[1].get_total_flops(), counters[2].get_total_flops()
    per_ctx = float(step2 - step1)
    return StageFlops(
        prefill=float(counters[0].get_total_flops()),
        vision=vision,
        decode_step_base=float(step1) - per_ctx * (prompt_tokens + 1),
        decode_step_per_ctx=per_ctx,
        prompt_tokens=prompt_tokens,
        by_operator={str(op): float(n) for op, n in counters[0].get_flop_counts().get("Global", {}).items()},
    )


def input_signature(prepared: PreparedInput | Sequence[PreparedInput]) -> Hashable:
    """What a FLOP count of `prepared` (one input, or a sequence run as one batch) depends on: each model input's
    shape and dtype (tensors) or value (the crop grid, other plain values), and the prompt length, in input order."""

    def value(item: object) -> Hashable:
        if isinstance(item, torch.Tensor):
            return ("tensor", tuple(item.shape), str(item.dtype))
        if isinstance(item, list | tuple):
            return tuple(value(part) for part in item)
        return item if isinstance(item, Hashable) else repr(item)

    def one(single: PreparedInput) -> Hashable:
        inputs = tuple(sorted((name, value(item)) for name, item in single.model_inputs.items()))
        return (single.prompt_tokens, inputs)

    if isinstance(prepared, Sequence):
        return ("batch", tuple(one(single) for single in prepared))
    return ("input", one(prepared))


# Relative difference within which two counts agree: a millionth changes no figure a report prints (3-4 significant
# digits). The full-size v1 differs by ~1e-8 between its analytic model and the count, and between a batch of two and
# twice one input (H200, 2026-11-28); a stricter rule counted every batch of 64 with FlopCounterMode instead.
_AGREE = 1e-6


def priced_stage_flops(session: CountedSession[P], prepared: P | Sequence[P]) -> StageFlops | None:
    """The FLOPs of `prepared` (one input, or a sequence run as one batch) from the adapter's analytic model, in the
    counted figures' form (two decode steps give the affine step); None where the model has no analytic model."""
    adapter = session.adapter
    if not adapter.has_analytic_model:
        return None
    itemsize = session.dtype.itemsize
    batched = isinstance(prepared, Sequence)
    batch = list(prepared) if isinstance(prepared, Sequence) else [prepared]

    def costs(new_tokens: int) -> Mapping[str, PricedStage] | None:
        if batched:
            return adapter.analytic_batch_costs(session.model, batch, new_tokens, itemsize)
        return adapter.analytic_costs(session.model, batch[0], new_tokens, itemsize)

    one_step, two_steps = costs(2), costs(3)
    if one_step is None or two_steps is None:
        return None
    prompt_tokens = max(p.prompt_tokens for p in batch)
    step1 = float(one_step[vocab.DECODE].matmul_flops)
    step2 = float(two_steps[vocab.DECODE].matmul_flops) - step1
    per_ctx = step2 - step1
    return StageFlops(
        prefill=float(one_step[vocab.PREFILL].matmul_flops),
        vision={stage: float(one_step[stage].matmul_flops) for stage in session.vision_stages if stage in one_step},
        decode_step_base=step1 - per_ctx * (prompt_tokens + 1),
        decode_step_per_ctx=per_ctx,
        prompt_tokens=prompt_tokens,
        by_operator={},
        source=ANALYTIC_SOURCE,
    )


def _differences(a: StageFlops, b: StageFlops, new_tokens: int = 64) -> list[str]:
    """Which figures of count `a` differ from count `b` (prefill, the decode steps, each of `b`'s vision stages, the
    prompt length) beyond rounding, each with its relative difference."""
    pairs = {
        "prefill": (a.prefill, b.prefill),
        f"decode, {new_tokens} tokens": (a.decode_total(new_tokens), b.decode_total(new_tokens)),
        **{stage: (a.vision.get(stage), value) for stage, value in b.vision.items()},
    }
    out = [
        f"{name} {x / y - 1:+.2e}" if x is not None and y else f"{name} {x} against {y}"
        for name, (x, y) in pairs.items()
        if x is None or abs(x - y) > _AGREE * max(abs(x), abs(y), 1.0)
    ]
    if a.prompt_tokens != b.prompt_tokens:
        out.append(f"prompt tokens {a.prompt_tokens} against {b.prompt_tokens}")
    return out


def _agree(priced: StageFlops, counted: StageFlops, new_tokens: int = 64) -> bool:
    """The priced figures equal the counted ones (prefill, every vision stage, the decode steps, the prompt)."""
    return not _differences(priced, counted, new_tokens)


class FlopCounts:
    """A run's FLOP counts by input signature: an input (or batch) whose shapes were counted already reuses that
    count instead of counting again (each count is an untimed pass under the FLOP counter, seconds on a full-size
    model); a batch of one shape is that many times one input where a batch of two was twice one input; and where
    the analytic model agreed with the first input's count (within `_AGREE`), other shapes are priced by it."""

    def __init__(self) -> None:
        self._counted: dict[Hashable, tuple[str, StageFlops]] = {}
        self.counted = 0  # counts actually run
        self.reused = 0  # counts taken from an input of the same shapes
        self.priced = 0  # counts priced by the analytic model
        self.analytic_agrees: bool | None = None  # None until the first count was checked against the analytic model
        self.scaling_exact: bool | None = None  # None until a batch of two of one shape was checked against one input

    def count(
        self, session: CountedSession[P], prepared: P | Sequence[P], name: str, doing: str = "counting FLOPs (untimed)"
    ) -> StageFlops:
        """The FLOPs of `prepared` (named `name` in the log): counted (`doing` logged), reused from the first input
        of the same signature, or priced by the analytic model once it agreed with a count."""
        if isinstance(prepared, Sequence) and len(prepared) > 1 and len({input_signature(p) for p in prepared}) == 1:
            scaled = self._scaled(session, prepared, name, doing)
            if scaled is not None:
                return scaled
        signature = input_signature(prepared)
        known = self._counted.get(signature)
        if known is not None:
            log.info("%s: reused the FLOP count of %s (same shapes)", name, known[0])
            self.reused += 1
            return known[1]
        if self.analytic_agrees and (priced := priced_stage_flops(session, prepared)) is not None:
            log.info("%s: FLOPs priced by the analytic model (it agreed with the count of the first input)", name)
            self._counted[signature] = (name, priced)
            self.priced += 1
            return priced
        log.info("%s: %s", name, doing)
        flops = count_stage_flops(session, prepared)
        self._counted[signature] = (name, flops)
        self.counted += 1
        if self.analytic_agrees is None and (priced := priced_stage_flops(session, prepared)) is not None:
            self.analytic_agrees = _agree(priced, flops)
            if not self.analytic_agrees:
                log.info(
                    "%s: the analytic model's FLOPs differ from the count (%s): every input shape is counted",
                    name,
                    ", ".join(_differences(priced, flops)),
                )
        return flops

    def _scaled(self, session: CountedSession[P], batch: Sequence[P], name: str, doing: str) -> StageFlops | None:
        """A batch of one shape (run.fill_batches, or pages of one size: equal prompts, no padding) as that many times
        one input's count, seconds where the batch's count is minutes, once a batch of two counted equals twice one
        input (checked on the run's first such batch); None where it did not, and the batch is counted."""
        one = self.count(session, batch[0], f"{name}, one input", doing)
        if self.scaling_exact is None:
            log.info("%s: counting two of its inputs as a batch, to check that a batch is that many times one", name)
            pair = count_stage_flops(session, list(batch[:2]))
            self.counted += 1
            self._counted[input_signature(list(batch[:2]))] = (f"{name}, two inputs", pair)
            self.scaling_exact = _agree(one.scaled(2), pair)
            if not self.scaling_exact:
                log.info(
                    "%s: a batch of two is not twice one input (%s): batches are counted",
                    name,
                    ", ".join(_differences(one.scaled(2), pair)),
                )
        if not self.scaling_exact:
            return None
        log.info("%s: %d inputs of one shape: %d × one input's FLOP count", name, len(batch), len(batch))
        return one.scaled(len(batch))
