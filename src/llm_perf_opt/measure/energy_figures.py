"""Energy figures from the energy pass: each stage's mean power from its loop, at the timed passes' speed.

The loops measure power well (windows of seconds on a ~100 ms counter) but run at whatever speed the host paces
them: an eager decode step is host-bound, and its loop can run 10-20% slower or faster than the timed passes. Energy
per stage is therefore the loop's mean power × the stage's median time over the timed passes (CUDA events), so J per
decode token describes the speed the report quotes and repeats as well as power and the timed median do; the
loop's own joules stay in the record (`EnergyPass`). Without timed passes of the input, the loop's own time is used.
"""

from __future__ import annotations

from collections.abc import Mapping

from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.memory import EnergyPass, EnergyReport, StageEnergy

SPEED_NOTE_AT = 0.10  # a loop this far from the timed speed is noted


def energy_report(
    measured: EnergyPass, flops: Mapping[str, float], timed_s: Mapping[str, float], method: str
) -> EnergyReport:
    """J per pass, W and FLOP/J per stage, J per page and per decode token, tokens per J. `flops` and `timed_s`
    (median seconds per pass of the timed passes) are keyed by stage (prefill, decode) for the pass's input."""
    idle_w = measured.idle.watts
    whole_j, whole_s = measured.whole.per_iteration(idle_w)
    stages: list[StageEnergy] = []
    if measured.prefill is not None:
        pre_j, pre_s = measured.prefill.per_iteration(idle_w)
        dec_j, dec_s = whole_j - pre_j, whole_s - pre_s
        stages.append(
            _stage(vocab.PREFILL, pre_j / pre_s, pre_s, timed_s.get(vocab.PREFILL), idle_w, flops.get(vocab.PREFILL))
        )
        if dec_j <= 0 or dec_s <= 0:
            stages.append(_not_available(dec_j, dec_s, flops.get(vocab.DECODE)))
        else:
            stages.append(
                _stage(vocab.DECODE, dec_j / dec_s, dec_s, timed_s.get(vocab.DECODE), idle_w, flops.get(vocab.DECODE))
            )
    if len(stages) == 2 and all(s.joules is not None for s in stages):
        whole = _sum(stages, flops)
    else:
        timed = _both(timed_s.get(vocab.PREFILL), timed_s.get(vocab.DECODE))
        whole = _stage("pass", whole_j / whole_s, whole_s, timed, idle_w, _pass_flops(flops))
    stages.append(whole)
    decode = next((s for s in stages if s.stage == vocab.DECODE), None)
    tokens = (measured.new_tokens - 1) * measured.pages
    per_token = above = None
    if decode is not None and decode.joules is not None and decode.above_idle_joules is not None and tokens > 0:
        per_token, above = decode.joules / tokens, decode.above_idle_joules / tokens
    assert whole.joules is not None
    return EnergyReport(
        available=True,
        measured=measured,
        idle_watts=idle_w,
        stages=tuple(stages),
        joules_per_page=whole.joules / measured.pages,
        joules_per_decode_token=per_token,
        joules_per_decode_token_above_idle=above,
        tokens_per_joule=measured.new_tokens * measured.pages / whole.joules if whole.joules > 0 else None,
        method=method,
    )


def _stage(
    stage: str, watts: float, loop_s: float, timed: float | None, idle_w: float, stage_flops: float | None
) -> StageEnergy:
    """A stage at `watts` (its loop's mean) over its timed median `timed` (else the loop's own `loop_s`)."""
    seconds = loop_s if timed is None else timed
    joules = watts * seconds
    note = "at the loop's own time (no timed passes)" if timed is None else ""
    if timed is not None and abs(loop_s / timed - 1) > SPEED_NOTE_AT:
        note = f"its loop ran at {loop_s * 1e3:,.1f} ms per pass ({loop_s / timed - 1:+.0%} of the timed median)"
    return StageEnergy(
        stage=stage,
        joules=joules,
        seconds=seconds,
        watts=watts,
        above_idle_joules=joules - idle_w * seconds,
        flops=stage_flops,
        flop_per_joule=stage_flops / joules if stage_flops is not None and joules > 0 else None,
        note=note,
    )


def _sum(parts: list[StageEnergy], flops: Mapping[str, float]) -> StageEnergy:
    """The whole pass as prefill + decode."""
    joules = sum(p.joules or 0.0 for p in parts)
    seconds = sum(p.seconds or 0.0 for p in parts)
    pass_flops = _pass_flops(flops)
    return StageEnergy(
        stage="pass",
        joules=joules,
        seconds=seconds,
        watts=joules / seconds if seconds > 0 else None,
        above_idle_joules=sum(p.above_idle_joules or 0.0 for p in parts),
        flops=pass_flops,
        flop_per_joule=pass_flops / joules if pass_flops is not None and joules > 0 else None,
        note="prefill + decode",
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
    return None if prefill is None or decode is None else prefill + decode


def _pass_flops(flops: Mapping[str, float]) -> float | None:
    """Prefill FLOPs + decode FLOPs per pass (both counted at the run's max_new_tokens, which the energy pass runs),
    None when either is unknown."""
    return _both(flops.get(vocab.PREFILL), flops.get(vocab.DECODE))
