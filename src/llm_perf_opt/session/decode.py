"""The explicit prefill/decode loop: greedy, fixed length (EOS ignored), the first token from prefill.

One loop serves every runtime (dynamic or static KV cache, eager or compiled steps, one input or a batch). One input
with an eager prefill runs the model's own forward on the prepared inputs; otherwise each input is embedded apart
(vision included) and left-padded into one batch. No host synchronisation inside a decode step: without padding no
attention mask is passed (transformers then inspects nothing); with padding a ready 4-D mask, which transformers uses
as is. Tokens stay on the device until the pass ends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import attrs
import torch
from torch import nn

from llm_perf_opt.errors import UserError
from llm_perf_opt.instruments.measured_session import DecodeNotRepeatable
from llm_perf_opt.instruments.routing import RoutingRecorder
from llm_perf_opt.instruments.timing import StageRecorder
from llm_perf_opt.models.cache_argument import CACHE_FIELD, forward_cache_argument, output_cache
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.stage1 import TopTwoLogits
from llm_perf_opt.session.adapters.base import PreparedInputs
from llm_perf_opt.session.compiled import CompiledStep
from llm_perf_opt.session.kv_cache import KvCaches, rewind, rewind_blocker
from llm_perf_opt.session.runtime import RuntimeSettings

#: Attention implementations that take the loop's ready 4-D mask (padded batches).
MASKED_ATTENTION = ("sdpa", "eager")
AroundStep = Callable[[int], AbstractContextManager[Any]]
#: Embeds input i of a batch (vision included): (index, prepared) -> (1, tokens, hidden).
EmbedInput = Callable[[int, PreparedInputs], torch.Tensor]


@attrs.frozen
class LoopOutput:
    """What one pass of the loop produced."""

    tokens: tuple[tuple[int, ...], ...]  # per input: the generated ids
    prefill_logits: torch.Tensor | None  # (batch, vocab) float32 on the CPU: last prompt position; when asked
    top2: tuple[TopTwoLogits, ...] | None = None  # per input, when asked (`keep_top2`)


class _TopTwoKept:
    """The top two logits of every forward of a pass, kept on the device until the pass ends."""

    def __init__(self) -> None:
        self.values: list[torch.Tensor] = []  # per forward: (batch, 2) float32
        self.ids: list[torch.Tensor] = []  # per forward: (batch, 2)

    def keep(self, logits: torch.Tensor) -> None:
        values, ids = logits.float().topk(2, dim=-1)
        self.values.append(values)
        self.ids.append(ids)

    def per_input(self, tokens: Sequence[Sequence[int]]) -> tuple[TopTwoLogits, ...]:
        """Each input's `tokens` with the top two logits behind each of them."""
        values = torch.stack(self.values, dim=1).tolist()  # (batch, forwards, 2)
        ids = torch.stack(self.ids, dim=1).tolist()
        return tuple(
            TopTwoLogits(
                tokens=tuple(row_tokens),
                ids=tuple((int(a), int(b)) for a, b in row_ids),
                logits=tuple((float(a), float(b)) for a, b in row_values),
            )
            for row_tokens, row_ids, row_values in zip(tokens, ids, values, strict=True)
        )


@attrs.frozen
class _Batch:
    """Prefill inputs of a batch and what the decode steps need for its padding."""

    prefill: dict[str, Any]
    length: int  # prompt positions (padded)
    real_lengths: torch.Tensor | None = None  # (batch,) prompt lengths, when padded
    key_valid: torch.Tensor | None = None  # (batch, length) True where a prompt position is a real token, when padded


def _padded(embeds: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad (1, L_i, H) embeddings into (B, L, H) with zeros; and the (B, L) validity mask."""
    length = max(e.shape[1] for e in embeds)
    hidden = embeds[0].shape[-1]
    out = embeds[0].new_zeros((len(embeds), length, hidden))
    valid = torch.zeros((len(embeds), length), dtype=torch.bool, device=embeds[0].device)
    for i, e in enumerate(embeds):
        out[i, length - e.shape[1] :] = e[0]
        valid[i, length - e.shape[1] :] = True
    return out, valid


class DecodeLoop:
    """Runs prefill and decode steps of one model under one :class:`RuntimeSettings`."""

    def __init__(
        self,
        model: nn.Module,
        runtime: RuntimeSettings,
        caches: KvCaches,
        *,
        attn_implementation: str | None,
        routing: RoutingRecorder | None = None,
    ) -> None:
        self.model = model
        self.runtime = runtime
        self.caches = caches
        self.attn_implementation = attn_implementation or "sdpa"
        self.routing = routing
        # The model's own name for its KV cache argument (transformers renamed it in 5.24; remote code keeps its own).
        self.cache_argument = forward_cache_argument(model.forward) or CACHE_FIELD
        self.decode_step: Callable[..., torch.Tensor] = self._decode
        self.prefill_step: Callable[..., tuple[torch.Tensor, Any]] = self._prefill
        self.compiled: list[CompiledStep] = []
        self._top2: _TopTwoKept | None = None  # while a pass keeps them (`run(keep_top2=True)`, eager loops only)
        # Called with the pass's KV cache when it is made (None: the prefill makes it) and again after the prefill
        # (the memory pass measures the cache's tensors through it).
        self.cache_observer: Callable[[Any], None] | None = None
        # Called after a pass's decode section with a function that runs the section again over the same prompt
        # (the energy pass loops the decode steps alone through it).
        self.decode_repeater: Callable[[Callable[[], None]], None] | None = None
        if runtime.compiles_decode:
            self.decode_step = self._compiled("decode", self._decode)
        if runtime.compiles_prefill:
            self.prefill_step = self._compiled("prefill", self._prefill)

    def _compiled(self, name: str, step: Callable[..., Any]) -> CompiledStep:
        runtime = self.runtime
        compiled = CompiledStep(name, step, runtime.compile_mode, runtime.compile, runtime.compile_options)
        self.compiled.append(compiled)
        return compiled

    # ---- the step functions (what torch.compile traces) ---------------------------------------------------
    def _prefill(self, inputs: dict[str, Any], cache: Any) -> tuple[torch.Tensor, Any]:
        out = self.model(**inputs, **{self.cache_argument: cache}, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1], output_cache(out)

    def _decode(
        self,
        input_ids: torch.Tensor,
        cache: Any,
        position_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        given = {"position_ids": position_ids, "attention_mask": attention_mask}
        extra = {name: value for name, value in given.items() if value is not None}
        out = self.model(input_ids=input_ids, use_cache=True, logits_to_keep=1, **extra, **{self.cache_argument: cache})
        return self._greedy(out.logits[:, -1])

    def _greedy(self, logits: torch.Tensor) -> torch.Tensor:
        """The next token of each row of (batch, vocab) `logits`; their top two kept while a pass asks for them."""
        if self._top2 is not None:
            self._top2.keep(logits)
        return logits.argmax(-1)

    # ---- a pass ---------------------------------------------------------------------------------------------
    def run(
        self,
        batch: Sequence[PreparedInputs],
        max_new_tokens: int,
        recorder: StageRecorder,
        *,
        embed: EmbedInput | None,
        around_step: AroundStep | None = None,
        keep_logits: bool = False,
        keep_top2: bool = False,
    ) -> LoopOutput:
        """Greedy decoding of exactly `max_new_tokens` tokens per input. `embed` embeds one input (needed for a batch
        or a compiled prefill); `around_step(i)` wraps forward i (0 = prefill, i >= 1 = decode step i); `keep_logits`:
        the prefill's logits in the output; `keep_top2`: the top two logits behind every token (eager loops only)."""
        if keep_top2 and self.compiled:
            raise ValueError("keep_top2 needs an eager loop: a compiled step returns its token alone")
        self._top2 = _TopTwoKept() if keep_top2 else None
        try:
            return self._run(batch, max_new_tokens, recorder, embed, around_step, keep_logits)
        finally:
            self._top2 = None

    def _run(
        self,
        batch: Sequence[PreparedInputs],
        max_new_tokens: int,
        recorder: StageRecorder,
        embed: EmbedInput | None,
        around_step: AroundStep | None,
        keep_logits: bool,
    ) -> LoopOutput:
        around = around_step or (lambda _step: nullcontext())
        size = len(batch)
        routing = self.routing if self.runtime.record_routing else None
        with recorder.span(vocab.PREFILL), around(0):
            plan = self._plan(batch, embed)
            kv = self.caches.for_batch(size, plan.length, max_new_tokens)
            if self.cache_observer is not None:
                self.cache_observer(kv.cache)
            shape = (size, plan.length, kv.static_length or plan.length)
            if plan.key_valid is not None:
                plan.prefill["attention_mask"] = self._prefill_mask(plan.key_valid, shape[2])
            if isinstance(self.prefill_step, CompiledStep):
                self.caches.allocate(kv, size, self._dtype(), plan.prefill["inputs_embeds"].device)
                logits, cache = self.prefill_step(shape, plan.prefill, kv.cache)
                logits = logits.clone()  # a CUDA-graph output is overwritten by the next replay
            else:
                logits, cache = self.prefill_step(plan.prefill, kv.cache)
            if self.cache_observer is not None:
                self.cache_observer(cache)
            first = self._greedy(logits)
        kept = logits.to(torch.float32, copy=True) if keep_logits else None  # to the host after the pass
        # Buffers as wide as the caches are sized for (`KvCaches.sized_for`): a shorter pass then hands the compiled
        # steps views with the timed passes' strides, which their guards check.
        width = max(max_new_tokens, self.caches.sized_new_tokens)
        tokens = torch.empty((size, width), dtype=torch.long, device=first.device)
        tokens[:, 0] = first
        if max_new_tokens > 1:
            steps = _StepInputs.build(plan, kv.static_length, width, self.attn_implementation, self._dtype())

            def decode_section() -> None:
                if routing is not None:
                    routing.recording = True
                try:
                    for step in range(1, max_new_tokens):
                        with recorder.span(vocab.DECODE_STEP), around(step):
                            args = (tokens[:, step - 1 : step], cache, *steps.at(step))
                            if isinstance(self.decode_step, CompiledStep):
                                shape = (size, 1, kv.static_length or plan.length + step)
                                next_token = self.decode_step(shape, *args)
                            else:
                                next_token = self.decode_step(*args)
                            tokens[:, step] = next_token  # a copy: a CUDA-graph output is overwritten next replay
                            if routing is not None:
                                routing.end_step()
                finally:
                    if routing is not None:
                        routing.recording = False

            with recorder.span(vocab.DECODE):
                decode_section()
            if self.decode_repeater is not None:
                self._repeat_decode(cache, plan.length, decode_section, routing)
        ids = tokens[:, :max_new_tokens].tolist()  # the one host synchronisation of the pass
        generated = tuple(tuple(int(t) for t in row) for row in ids)
        return LoopOutput(
            tokens=generated,
            prefill_logits=None if kept is None else kept.cpu(),
            top2=None if self._top2 is None else self._top2.per_input(generated),
        )

    def _repeat_decode(
        self, cache: Any, prompt_length: int, section: Callable[[], None], routing: RoutingRecorder | None
    ) -> None:
        """Hand `decode_repeater` the pass's decode section to run again over the same prompt (the cache rewound
        first; DecodeNotRepeatable when it cannot be). The repeats record routing as the pass does (compiled guards
        see the same state), then the recorder forgets it: a repeated pass leaves no routing record."""
        assert self.decode_repeater is not None
        blocker = rewind_blocker(cache)
        if blocker is not None:
            raise DecodeNotRepeatable(blocker)

        def again() -> None:
            rewind(cache, prompt_length)
            section()
            if routing is not None:
                routing.begin_pass()

        self.decode_repeater(again)

    def _dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def _plan(self, batch: Sequence[PreparedInputs], embed: EmbedInput | None) -> _Batch:
        if len(batch) == 1 and not self.runtime.compiles_prefill:
            inputs = {k: v for k, v in batch[0].model_inputs.items() if k != "attention_mask"}
            return _Batch(prefill=inputs, length=batch[0].prompt_tokens)
        assert embed is not None, "a batch or a compiled prefill needs input embeddings"
        embeds = [embed(i, prepared) for i, prepared in enumerate(batch)]
        inputs_embeds, valid = _padded(embeds)
        length = inputs_embeds.shape[1]
        if all(e.shape[1] == length for e in embeds):
            return _Batch(prefill={"inputs_embeds": inputs_embeds}, length=length)
        if self.attn_implementation not in MASKED_ATTENTION:
            raise UserError(
                f"run.batch_size={len(batch)}: these inputs have different prompt lengths, so the batch is left-padded "
                f"and needs a ready 4-D attention mask, which attn_implementation={self.attn_implementation} does "
                "not take",
                "Set model.attn_implementation=sdpa (or eager), or run.batch_size=1",
            )
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
        real = torch.tensor([e.shape[1] for e in embeds], device=inputs_embeds.device)
        return _Batch({"inputs_embeds": inputs_embeds, "position_ids": positions}, length, real, valid)

    def _prefill_mask(self, valid: torch.Tensor, kv_length: int) -> torch.Tensor:
        """The prefill's 4-D mask over `kv_length` key positions (a static cache's whole length): causal, no padding
        keys; padding rows attend to themselves only (never an empty row)."""
        size, length = valid.shape
        keys = torch.cat([valid, valid.new_zeros((size, kv_length - length))], dim=1)
        causal = torch.ones((length, kv_length), dtype=torch.bool, device=valid.device).tril()
        allowed = causal[None] & keys[:, None, :]
        allowed |= torch.eye(length, kv_length, dtype=torch.bool, device=valid.device)[None] & ~valid[:, :, None]
        return _as_mask(allowed[:, None], self.attn_implementation, self._dtype())


@attrs.frozen
class _StepInputs:
    """Per decode step: position ids and a 4-D attention mask (padded batches), built before the first step."""

    positions: torch.Tensor | None  # (batch, steps)
    masks: torch.Tensor | None  # static cache: (steps, batch, 1, 1, cache); dynamic: (batch, 1, 1, prompt + steps)
    static: bool

    @classmethod
    def build(
        cls, plan: _Batch, static_length: int | None, max_new_tokens: int, attn_implementation: str, dtype: torch.dtype
    ) -> _StepInputs:
        if plan.key_valid is None or plan.real_lengths is None:
            return cls(positions=None, masks=None, static=False)
        valid = plan.key_valid
        size, device = valid.shape[0], valid.device
        steps = torch.arange(max_new_tokens - 1, device=device)
        positions = plan.real_lengths[:, None] + steps[None, :]
        generated = torch.ones((size, max_new_tokens - 1), dtype=torch.bool, device=device)
        keys = torch.cat([valid, generated], dim=1)  # (batch, prompt + steps)
        if static_length is not None:
            keys = torch.cat([keys, keys.new_zeros((size, static_length - keys.shape[1]))], dim=1)
            written = plan.length + 1 + steps  # positions written once step i's token is in the cache
            seen = torch.arange(static_length, device=device)[None, :] < written[:, None]  # (steps, cache)
            masks = (keys[None, :, :] & seen[:, None, :])[:, :, None, None, :]
        else:
            masks = keys[:, None, None, :]
        return cls(
            positions=positions, masks=_as_mask(masks, attn_implementation, dtype), static=static_length is not None
        )

    def at(self, step: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(position_ids, attention_mask) of decode step `step` (>= 1): views, no new tensors, no copies."""
        if self.positions is None or self.masks is None:
            return None, None
        positions = self.positions[:, step - 1 : step]
        if self.static:
            return positions, self.masks[step - 1]
        prompt_and_new = self.masks.shape[-1] - self.positions.shape[1] + step
        return positions, self.masks[..., :prompt_and_new]


def _as_mask(allowed: torch.Tensor, attn_implementation: str, dtype: torch.dtype) -> torch.Tensor:
    """A boolean "may attend" mask as the attention implementation takes it: boolean for sdpa (and the other
    kernels transformers hands 4-D masks to), additive (0 / most negative) for eager attention."""
    if attn_implementation == "eager":
        zero = torch.zeros((), dtype=dtype, device=allowed.device)
        return torch.where(allowed, zero, torch.finfo(dtype).min)
    return allowed
