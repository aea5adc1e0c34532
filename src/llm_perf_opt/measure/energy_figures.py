"""Energy figures from the energy pass: J per pass, W and FLOP/J per stage, J per page and per decode token.

Each figure is a loop's own joules over its repetitions (J per decode token from the decode steps looped alone, no
difference of two loops). A loop runs at the host's pace (an eager decode step is host-bound: its energy is mostly
idle power × its time, moving with that pace while its mean power stays steady), so a stage's note says where its
loop ran more than `SPEED_NOTE_AT` off the timed median."""

from __future__ import annotations

from collections.abc import Mapping

from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.memory import EnergyPass, EnergyReport, StageEnergy

METHOD = (
    "NVML total energy counter (nvmlDeviceGetTotalEnergyConsumption, mJ); each loop opens and closes on an update "
    "of the counter (the wait after the loop's last device synchronisation taken off at idle power); idle power "
    "from the counter while the GPU idles (the run's CPU-only post-processing of the profiled pass, else a sleep)"
)  # how the energy pass (`instruments.energy`) measures
SPEED_NOTE_AT = 0.10  # a loop this far from the timed median is noted


def energy_report(
    measured: EnergyPass, flops: Mapping[str, float], timed_s: Mapping[str, float], method: str
) -> EnergyReport:
    """The energy pass's figures; `flops` and `timed_s` (median s per pass over the timed passes, which only
    annotates) by stage for the pass's input. A stage is its own loop's figure, else the whole-pass loop less the other
    stage's; the pass is the whole-pass loop, else the sum of the two."""
    idle_w = measured.idle.watts
    windows = {vocab.PREFILL: measured.prefill, vocab.DECODE: measured.decode, "pass": measured.whole}
    own = {stage: window.per_iteration(idle_w) for stage, window in windows.items() if window is not None}
    how = {stage: "" for stage in own}
    whole = own.get("pass")
    for stage, other in ((vocab.PREFILL, vocab.DECODE), (vocab.DECODE, vocab.PREFILL)):
        if stage not in own and whole is not None and other in own:
            own[stage] = (whole[0] - own[other][0], whole[1] - own[other][1])
            how[stage] = f"whole pass − {other}"
    if whole is None:
        parts = [own[s] for s in (vocab.PREFILL, vocab.DECODE) if s in own]
        whole = (sum(j for j, _ in parts), sum(t for _, t in parts))
        how["pass"] = " + ".join(f"{s} loop" for s in (vocab.PREFILL, vocab.DECODE) if s in own)
    own["pass"] = whole
    stage_flops = {**flops, "pass": _both(flops.get(vocab.PREFILL), flops.get(vocab.DECODE))}
    stage_timed = {**timed_s, "pass": _both(timed_s.get(vocab.PREFILL), timed_s.get(vocab.DECODE))}
    stages = [
        _stage(stage, how[stage], *own[stage], stage_timed.get(stage), idle_w, stage_flops.get(stage))
        for stage in (vocab.PREFILL, vocab.DECODE, "pass")
        if stage in own
    ]
    per_token = above = None
    decode = next((s for s in stages if s.stage == vocab.DECODE), None)
    tokens = (measured.new_tokens - 1) * measured.pages
    if decode is not None and decode.joules is not None and decode.above_idle_joules is not None and tokens > 0:
        per_token, above = decode.joules / tokens, decode.above_idle_joules / tokens
    whole_j = whole[0]
    return EnergyReport(
        available=True,
        measured=measured,
        idle_watts=idle_w,
        stages=tuple(stages),
        joules_per_page=whole_j / measured.pages if whole_j > 0 else None,
        joules_per_decode_token=per_token,
        joules_per_decode_token_above_idle=above,
        tokens_per_joule=measured.new_tokens * measured.pages / whole_j if whole_j > 0 else None,
        method=method,
    )


def _stage(
    stage: str, how: str, joules: float, seconds: float, timed: float | None, idle_w: float, flops: float | None
) -> StageEnergy:
    """One stage's energy per pass from its loop's joules and seconds per repetition; its note says `how` it was
    derived and whether the loop ran off the timed pace. Not available where either is not positive (noise)."""
    if joules <= 0 or seconds <= 0:
        return StageEnergy(
            stage=stage,
            joules=None,
            seconds=None,
            watts=None,
            above_idle_joules=None,
            flops=flops,
            flop_per_joule=None,
            note=f"not available: {how} = {joules:,.3f} J over {seconds:,.3f} s (within noise)",
        )
    notes = [how] if how else []
    if timed is not None and timed > 0 and abs(seconds / timed - 1) > SPEED_NOTE_AT:
        notes.append(
            f"its loop ran at {seconds * 1e3:,.1f} ms per pass ({seconds / timed - 1:+.0%} of the timed median)"
        )
    return StageEnergy(
        stage=stage,
        joules=joules,
        seconds=seconds,
        watts=joules / seconds,
        above_idle_joules=joules - idle_w * seconds,
        flops=flops,
        flop_per_joule=flops / joules if flops is not None else None,
        note="; ".join(notes),
    )


def _both(prefill: float | None, decode: float | None) -> float | None:
    """Prefill + decode (FLOPs, or seconds) per pass, None when either is unknown."""
    return None if prefill is None or decode is None else prefill + decode
