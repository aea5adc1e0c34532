"""Stage 1's batch figures (`run.batch_size` > 1): the "Batches" section of report.md and the aggregate-throughput
lines of the report and the stakeholder summary, rendered from `Stage1Metrics.batches` and `.batch_summary`."""

from __future__ import annotations

import statistics
from collections import Counter

from llm_perf_opt.records.common import Summary
from llm_perf_opt.records.stage1 import BatchRecord, Stage1Metrics
from llm_perf_opt.report.markdown import Doc, ms, num_bytes
from llm_perf_opt.report.pages import interval_text


def batched(m: Stage1Metrics) -> bool:
    """True for a run of several inputs per forward with batch figures."""
    return m.settings.batch_size > 1 and m.batch_summary is not None


def sizes_run(m: Stage1Metrics) -> list[int]:
    """The sizes of the batches the timed passes ran, largest first ([1] for a run without batch records)."""
    return sorted({b.size for b in m.batches}, reverse=True) or [1]


def batch_run(m: Stage1Metrics) -> int:
    """The batch size the run's figures are for: run.batch_size when a batch that full ran, else the largest batch
    that ran (every input fit in one smaller batch)."""
    sizes = sizes_run(m)
    return m.settings.batch_size if m.settings.batch_size in sizes else sizes[0]


def batch_size_text(m: Stage1Metrics) -> str:
    """The batch size that ran, e.g. "4", "4 (the last batch 1)", "1 (run.batch_size=2, 1 input)"."""
    configured, sizes, ran = m.settings.batch_size, sizes_run(m), batch_run(m)
    if ran != configured:
        inputs = len(m.images)
        return f"{ran} (run.batch_size={configured}, {inputs} input{'s' if inputs != 1 else ''})"
    smaller = [s for s in sizes if s < ran]
    return f"{ran}" + (f" (the last batch {smaller[-1]})" if smaller else "")


def runtime_text(m: Stage1Metrics) -> str:
    """How the decoder ran, with the batch that ran (the recorded label names run.batch_size)."""
    return m.settings.runtime.described(f"batch {batch_size_text(m)}")


def _p50(s: Summary | None, digits: int, unit: str) -> str:
    """p50 of a per-pass figure with its 95% interval (none from fewer than 3 passes)."""
    if s is None:
        return "n/a"
    return f"{s.p50:,.{digits}f} {unit} (p50{interval_text(s, digits)}, n = {s.n} batch passes)"


def aggregate_line(m: Stage1Metrics) -> str | None:
    """One sentence on the batch's aggregate decode throughput, or None at batch 1."""
    b = m.batch_summary
    if b is None or not batched(m) or b.aggregate_decode_tokens_per_s is None:
        return None
    return (
        f"Aggregate decode: {b.aggregate_decode_tokens_per_s.p50:,.1f} tokens/s over batches of {batch_run(m)} "
        f"(every input's decode tokens over the batch's decode time; p50 over {b.passes} batch passes)"
    )


def efficiency_note(m: Stage1Metrics) -> str:
    """How the MFU and roofline tables count a batched run ('' at batch 1)."""
    if not batched(m):
        return ""
    return (
        f" With run.batch_size={m.settings.batch_size} a pass is a batch pass: its FLOPs are counted on the batch "
        "(left padding included) and its bytes priced for the batch, over the batch's time."
    )


def inputs_text(images: tuple[str, ...]) -> str:
    """A batch's inputs, each named once with its count where it repeats: `page_portrait.png ×64`."""
    return ", ".join(f"{image} ×{n}" if n > 1 else image for image, n in Counter(images).items())


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _batch_rows(m: Stage1Metrics) -> list[dict[str, str]]:
    """One row per batch: medians over its timed passes."""
    by_batch: dict[int, list[BatchRecord]] = {}
    for rec in m.batches:
        by_batch.setdefault(rec.batch, []).append(rec)
    rows = []
    for index, recs in by_batch.items():
        first = recs[0]
        steps = [statistics.fmean(r.decode_step_ms) for r in recs if r.decode_step_ms]
        rates = [r.aggregate_decode_tokens_per_s for r in recs if r.aggregate_decode_tokens_per_s is not None]
        experts = [r.experts_hit_per_step for r in recs if r.experts_hit_per_step is not None]
        memory = [r.peak_memory_bytes for r in recs if r.peak_memory_bytes is not None]
        rows.append(
            {
                "batch": str(index),
                "inputs": inputs_text(first.images),
                "size": str(first.size) + (" (short)" if first.size < m.settings.batch_size else ""),
                "padded prompt tokens": str(first.padded_prompt_tokens),
                "passes": str(len(recs)),
                "prefill (ms)": ms(_median([r.prefill_ms for r in recs])),
                "decode step (ms)": ms(_median(steps), 2),
                "aggregate decode tokens/s": ms(_median(rates)),
                "pages/s": ms(_median([r.pages_per_s for r in recs]), 3),
                "peak GPU memory": num_bytes(max(memory)) if memory else "n/a (CPU)",
                "experts per step and layer": ms(_median(experts)) if experts else "n/a",
            }
        )
    return rows


def batches_section(doc: Doc, m: Stage1Metrics) -> None:
    """The "Batches" section (nothing at batch 1)."""
    b = m.batch_summary
    if b is None or not batched(m):
        return
    doc.h2("Batches")
    doc.para(
        f"run.batch_size={b.batch_size}: {b.batches} batch(es) per round over the inputs. Each input is preprocessed "
        "and runs its vision on its own; the decoder prefills and decodes the batch together, left-padded to its "
        "longest prompt. Every input of a batch gets its first token when the batch's prefill ends and its last "
        "when the batch's last decode step ends, so the per-input TTFT and decode times above are the batch's."
    )
    only_full = b.passes < len(m.batches)  # a short last batch beside full ones is left out of the summary
    scope = "the full batches" if only_full else "every batch"
    doc.bullets(
        [
            f"Decode step latency: {_p50(b.decode_step_ms, 2, 'ms')}",
            f"Aggregate decode throughput: {_p50(b.aggregate_decode_tokens_per_s, 1, 'tokens/s')}",
            f"Peak GPU memory: {num_bytes(b.peak_memory_bytes) if b.peak_memory_bytes else 'n/a (CPU)'} "
            "(the largest over every batch pass)",
            f"These figures summarise {scope} ({b.passes} timed pass(es))"
            + (
                f"; the last batch holds {b.short_last_batch} input(s), fewer than {b.batch_size}, and is listed "
                "apart below."
                if only_full
                else "."
            ),
            *([f"Decode bytes count the routed experts as {b.decode_experts}."] if b.decode_experts else []),
        ]
    )
    doc.keyed_table(_batch_rows(m))
    doc.para("Medians over each batch's timed passes; decode step: a pass's mean step time.")
