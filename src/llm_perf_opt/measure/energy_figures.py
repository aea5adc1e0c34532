"""Energy figures from the energy pass: J per pass, W and FLOP/J per stage, J per page and per decode token.

Each figure is the loop's own: its joules over its repetitions. A loop runs at whatever pace the host sets (an eager
decode step is host-bound), so where a stage's loop ran more than `SPEED_NOTE_AT` away from the stage's median time
over the timed passes, the stage's note says so: a host-paced step's energy is mostly idle power × its time, and it
moves with the host's pace while its mean power stays steady.
"""

from __future__ import annotations

from collections.abc import Mapping

from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.memory import EnergyPass, EnergyReport, StageEnergy

SPEED_NOTE_AT = 0.10  # a loop this far from the timed median is noted


def energy_report(
    measured: EnergyPass, flops: Mapping[str, float], timed_s: Mapping[str, float], method: str
) -> EnergyReport:
    """The energy pass's figures. `flops` and `timed_s` (median seconds per pass over the timed passes) are keyed by
    stage (prefill, decode) for the pass's input; `timed_s` only annotates."""
    idle_w = measured.idle.watts
    whole_j, whole_s = measured.whole.per_iteration(idle_w)
    pass_flops = _both(flops.get(vocab.PREFILL), flops.get(vocab.DECODE))
    timed_pass = _both(timed_s.get(vocab.PREFILL), timed_s.get(vocab.DECODE))
    stages = [_stage("pass", whole_j, whole_s, timed_pass, idle_w, pass_flops)]
    per_token = above = None
    if measured.prefill is not None:
        pre_j, pre_s = measured.prefill.per_iteration(idle_w)
        stages.insert(
            0, _stage(vocab.PREFILL, pre_j, pre_s, timed_s.get(vocab.PREFILL), idle_w, flops.get(vocab.PREFILL))
        )
        dec_j, dec_s = whole_j - pre_j, whole_s - pre_s
        if dec_j <= 0 or dec_s <= 0:
            stages.insert(1, _not_available(dec_j, dec_s, flops.get(vocab.DECODE)))
        else:
            decode = _stage(
                vocab.DECODE, dec_j, dec_s, timed_s.get(vocab.DECODE), idle_w, flops.get(vocab.DECODE),
                how="whole pass − prefill",
            )  # fmt: skip
            stages.insert(1, decode)
            tokens = (measured.new_tokens - 1) * measured.pages
            if tokens > 0 and decode.above_idle_joules is not None:
                per_token, above = dec_j / tokens, decode.above_idle_joules / tokens
    return EnergyReport(
        available=True,
        measured=measured,
        idle_watts=idle_w,
        stages=tuple(stages),
        joules_per_page=whole_j / measured.pages,
        joules_per_decode_token=per_token,
        joules_per_decode_token_above_idle=above,
        tokens_per_joule=measured.new_tokens * measured.pages / whole_j if whole_j > 0 else None,
        method=method,
    )


def _stage(
    stage: str,
    joules: float,
    seconds: float,
    timed: float | None,
    idle_w: float,
    stage_flops: float | None,
    *,
    how: str = "",
) -> StageEnergy:
    """One stage's energy per pass from its loop's joules and seconds per repetition; its note says `how` it was
    derived and whether the loop ran off the timed pace."""
    notes = [how] if how else []
    if timed is not None and timed > 0 and abs(seconds / timed - 1) > SPEED_NOTE_AT:
        notes.append(
            f"its loop ran at {seconds * 1e3:,.1f} ms per pass ({seconds / timed - 1:+.0%} of the timed median)"
        )
    note = "; ".join(notes)
    return StageEnergy(
        stage=stage,
        joules=joules,
        seconds=seconds,
        watts=joules / seconds if seconds > 0 else None,
        above_idle_joules=joules - idle_w * seconds,
        flops=stage_flops,
        flop_per_joule=stage_flops / joules if stage_flops is not None and joules > 0 else None,
        note=note,
    )


def _not_available(joules: float, seconds: float, flops: float | None) -> StageEnergy:
    return StageEnergy(
        stage=vocab.DECODE,
        joules=None,
        seconds=None,
        watts=None,
        above_idle_joules=None,
        flops=flops,
        flop_per_joule=None,
        note=f"not available: whole pass − prefill = {joules:,.3f} J over {seconds:,.3f} s (within noise)",
    )


def _both(prefill: float | None, decode: float | None) -> float | None:
    """Prefill + decode (FLOPs, or seconds) per pass, None when either is unknown."""
    return None if prefill is None or decode is None else prefill + decode
