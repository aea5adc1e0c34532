"""Stage 1's check that `run.batch_size` fits in the device's memory before the first pass (`measure.batch_fit`):
a batch the estimate says cannot fit is refused with the largest that does; `run.check_batch_fit=false` skips it."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from llm_perf_opt.errors import UserError
from llm_perf_opt.instruments import memory
from llm_perf_opt.measure import batch_fit
from llm_perf_opt.measure.batch_fit import ACTIVATION_MARGIN, FALLBACK_WIDTH, BatchFit
from llm_perf_opt.measure.memory_figures import kv_bytes_per_token
from llm_perf_opt.report.markdown import num_bytes
from llm_perf_opt.session.session import InferenceSession

log = logging.getLogger("llm_perf_opt.stage1")

SETTING = "run.check_batch_fit"


def estimate(
    session: InferenceSession, paths: Sequence[Path], new_tokens: int, batch_size: int, free_bytes: int
) -> BatchFit | None:
    """The estimate for `batch_size` pages over the run's inputs `paths` (the longest prompt, the largest
    activation), or None where the decoder's config does not give its KV-cache bytes per token."""
    config = session.adapter.decoder_config(session.model)
    dtype_bytes = session.dtype.itemsize
    per_token = kv_bytes_per_token(config, dtype_bytes)
    if per_token is None:
        return None
    prepared = [session.prepare(path) for path in dict.fromkeys(paths)]
    prompt = max(p.prompt_tokens for p in prepared)
    costs = [session.adapter.analytic_costs(session.model, p, new_tokens, dtype_bytes) for p in prepared]
    if costs and all(c is not None for c in costs):
        decoder, vision = batch_fit.activation_terms(c for c in costs if c is not None)
        source = (
            f"{ACTIVATION_MARGIN:g} × the analytic model's largest module activation, the decoder's per page and "
            "vision's for one page at a time"
        )
    else:
        hidden = int(getattr(config, "hidden_size", 0) or 0)
        decoder, vision = batch_fit.fallback_activation(prompt, hidden, dtype_bytes), 0.0
        source = (
            f"no analytic model: {ACTIVATION_MARGIN:g} × {FALLBACK_WIDTH} × prompt tokens × hidden size × dtype bytes "
            "per page"
        )
    return BatchFit(
        batch_size=batch_size,
        free_bytes=free_bytes,
        weights_bytes=memory.model_bytes(session.model),
        kv_bytes_per_token=per_token,
        context_tokens=prompt + new_tokens,
        decoder_activation_bytes=decoder * ACTIVATION_MARGIN,
        vision_activation_bytes=vision * ACTIVATION_MARGIN,
        activation_source=source,
    )


def refusal(fit: BatchFit, device: str, new_tokens: int) -> UserError:
    """One paragraph: the batch, the estimate part by part, what is there and the largest batch that fits."""
    b = fit.batch_size
    largest = f"the largest batch that fits is {fit.max_batch}" if fit.max_batch > 0 else "not even one page fits"
    problem = (
        f"run.batch_size={b} does not fit in {device}'s memory by the estimate made before the run: a batch of {b} "
        f"needs {num_bytes(fit.needed_bytes(b))} = weights {num_bytes(fit.weights_bytes)} (loaded) + KV cache "
        f"{b} × {num_bytes(fit.kv_bytes_per_page)} ({num_bytes(fit.kv_bytes_per_token)} per token × "
        f"({fit.context_tokens - new_tokens} prompt + {new_tokens} new tokens) of the longest page) + activations "
        f"{num_bytes(fit.activation_bytes(b))} ({fit.activation_source}), against "
        f"{num_bytes(fit.available_bytes)} (the weights + {num_bytes(fit.free_bytes)} free); {largest}"
    )
    fix = (
        f"Set run.batch_size={fit.max_batch} or less"
        if fit.max_batch > 0
        else "Free the device's memory, or run a smaller model or fewer new tokens (infer.max_new_tokens)"
    )
    return UserError(
        problem,
        f"{fix}; or {SETTING}=false to run it anyway (the estimate leans high; the run's memory pass then measures "
        "what fits)",
    )


def check(
    session: InferenceSession, paths: Sequence[Path], new_tokens: int, batch_size: int, *, enabled: bool
) -> BatchFit | None:
    """Refuse `batch_size` (> 1, on CUDA, `enabled`) when the estimate says it cannot fit; the estimate, or None
    where no check was made."""
    if not enabled or batch_size <= 1:
        return None
    free = memory.free_memory(session.device)
    if free is None:
        return None
    fit = estimate(session, paths, new_tokens, batch_size, free)
    if fit is None:
        log.info("%s: no estimate (the decoder's config does not give its KV-cache size)", SETTING)
        return None
    if not fit.fits:
        raise refusal(fit, str(session.device), new_tokens)
    log.info(
        "batch %d fits by the estimate: %s of %s; up to %d would", batch_size,
        num_bytes(fit.needed_bytes(batch_size)), num_bytes(fit.available_bytes), fit.max_batch,
    )  # fmt: skip
    return fit
