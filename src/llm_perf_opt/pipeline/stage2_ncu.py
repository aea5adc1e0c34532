"""Stage 2's Nsight Compute passes: each analysed stage's hottest kernels (from the nsys trace) in one ncu process,
then the bytes pass over every kernel of the workload's profiler window."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import attrs

from llm_perf_opt.artifacts import ArtifactsManager
from llm_perf_opt.nsight import commands
from llm_perf_opt.nsight.ncu_windows import BytesWindow, decode_bytes_window, prefill_bytes_window
from llm_perf_opt.nsight.nsys_trace import NsysTrace
from llm_perf_opt.nsight.tools import Tool
from llm_perf_opt.pipeline.stage2_settings import Stage2Settings
from llm_perf_opt.pipeline.stage2_tools import ToolRuns
from llm_perf_opt.pipeline.stage2_workload import workload_argv
from llm_perf_opt.records import vocabulary as vocab
from llm_perf_opt.records.folders import NCU_TARGETS_FILE as TARGETS_FILE
from llm_perf_opt.records.stage2 import NcuBytesPass, NcuRound, NcuStageTarget, NcuTargets

log = logging.getLogger("llm_perf_opt.stage2")

NSYS_SQLITE = "nsys/report.sqlite"


@attrs.define
class NcuPasses:
    """Nsight Compute over one Stage 2 folder's workload, its targets read from the folder's nsys export."""

    settings: Stage2Settings
    tools: ToolRuns
    art: ArtifactsManager
    user_overrides: Sequence[str]
    model_cache: Path | None

    def run(self, ncu: Tool) -> None:
        """Nsight Compute in one process per measure, each over the workload's CUDA profiler window (its first
        prefill and middle decode step): the targeted kernels of every analysed stage, then the bytes pass."""
        targets = self.targets()
        self.art.write_json(TARGETS_FILE, targets)
        targets = self.targets_pass(ncu, targets)
        self.art.write_json(TARGETS_FILE, targets)
        if self.settings.ncu.bytes_pass:
            targets = attrs.evolve(targets, bytes_passes=self.bytes_pass(ncu, self.settings.mode.stages))
            self.art.write_json(TARGETS_FILE, targets)

    def targets(self) -> NcuTargets:
        """Each analysed stage's top kernels by nsys GPU time, with their calls and the stage's instances."""
        mode = self.settings.mode
        stages: dict[str, NcuStageTarget] = {}
        with NsysTrace(self.art.run_dir / NSYS_SQLITE) as trace:
            instances = {st.stage: st.instances for st in trace.stage_times()}
            for stage in mode.stages:
                kernels = trace.top_kernels(mode.top_kernels, stage=stage)
                calls: dict[str, int] = {}
                for k in trace.stage_kernels(stage):  # by short name, every instantiation summed
                    calls[k.name] = calls.get(k.name, 0) + k.calls
                unit = vocab.DECODE_STEP if stage == vocab.DECODE else stage  # one decode step, or one prefill
                stages[stage] = NcuStageTarget(
                    kernels=tuple(dict.fromkeys(k.name for k in kernels)),
                    calls=calls,
                    instances=instances.get(unit, 1) or 1,
                )
        return NcuTargets(mode=self.settings.mode_name, stages=stages)

    def targets_pass(self, ncu: Tool, targets: NcuTargets) -> NcuTargets:
        """One ncu process over the targeted kernels of every stage: `launches_per_kernel` launches of each launch
        configuration inside the profiler window (so a rare kernel is never crowded out by a frequent one), its
        rows told apart by stage through their NVTX ranges; `targets` with the round of each stage."""
        names = list(dict.fromkeys(n for target in targets.stages.values() for n in target.kernels))
        if not names:
            return targets
        mode, options = self.settings.mode, self.settings.ncu
        per_kernel = mode.launches_per_kernel
        folder, regex = "ncu/targets", commands.kernel_regex_for(names)
        argv = commands.ncu_argv(
            ncu.path,
            self.art.path(f"{folder}/report"),
            self._workload("ncu-targets"),
            kernel_regex=regex,
            launch_skip=0,
            launch_count=per_kernel,
            filter_mode="per-launch-config",
            nvtx=True,
            profile_from_start=False,
            sections=list(mode.sections),
            metrics=list(options.metrics),
            clock_control=options.clock_control,
            target_processes=options.target_processes,
        )
        note = self._profile(ncu, "ncu_targets", folder, argv, "Nsight Compute (targeted kernels)")
        one_round = NcuRound(
            folder=folder,
            kernels=(),
            launch_skip=0,
            launch_count=per_kernel,
            regex=regex,
            note=note or None,
            profiler_window=True,
        )
        stages = {
            stage: attrs.evolve(target, rounds=(attrs.evolve(one_round, kernels=target.kernels),))
            for stage, target in targets.stages.items()
        }
        return attrs.evolve(targets, stages=stages)

    def bytes_pass(self, ncu: Tool, stages: Sequence[str]) -> tuple[NcuBytesPass, ...]:
        """The bytes pass: one ncu process over every kernel of the profiler window (the ncu workload's prefill,
        vision sub-stages included, and its middle decode step), duration and DRAM bytes only; one record per
        stage, each pointing at the shared export. A failed or empty pass is recorded with its reason and the capture
        goes on (the other figures stand)."""
        options = self.settings.ncu
        folder, workload = "ncu/bytes", "workload/ncu-bytes"
        argv = commands.ncu_bytes_argv(
            ncu.path,
            self.art.path(f"{folder}/report"),
            self._workload("ncu-bytes"),
            clock_control=options.clock_control,
            target_processes=options.target_processes,
            cache_control=options.bytes_cache_control,
        )
        note = self._profile(ncu, "ncu_bytes", folder, argv, "Nsight Compute bytes pass", check=False)
        if note:
            log.warning("the bytes pass gave nothing: %s", note)
        passes = []
        for stage in stages:
            window = self.bytes_window(stage)
            empty = f"the nsys trace has no kernel in {window.instance}" if window.expected < 1 else None
            passes.append(
                NcuBytesPass(
                    stage=stage,
                    instance=window.instance,
                    folder=folder,
                    workload=workload,
                    launch_skip=0,
                    launch_count=0,
                    expected_kernels=window.expected,
                    cache_control=options.bytes_cache_control,
                    note=empty or note or None,
                    profiler_window=True,
                )
            )
        return tuple(passes)

    def bytes_window(self, stage: str) -> BytesWindow:
        """The launches the bytes pass over `stage` profiles, from the nsys trace's kernels per instance."""
        with NsysTrace(self.art.run_dir / NSYS_SQLITE) as trace:
            if stage != vocab.DECODE:
                return prefill_bytes_window(stage, trace.instance_kernels(stage), self.settings.runtime.batch_size)
            steps = trace.instance_kernels(vocab.DECODE_STEP)
        return decode_bytes_window(steps, self.settings.ncu_workload.max_new_tokens)

    def _profile(self, ncu: Tool, key: str, folder: str, argv: list[str], what: str, *, check: bool = True) -> str:
        """Run ncu (`argv`, writing `<folder>/report.ncu-rep`) and export its raw page to `<folder>/raw.csv`; "" when
        the export is there, else why not: no report (the filters matched nothing), or, with `check` off, how ncu
        failed (with it on, a failure raises a UserError)."""
        run = self.tools.timed(key, argv, f"{folder}/profile.log", self.settings.ncu.timeout_s, what, check=check)
        if run.timed_out or run.returncode != 0:
            how = "timed out" if run.timed_out else f"exited with code {run.returncode}"
            return f"ncu {how} (see {folder}/profile.log)"
        rep = self.art.path(f"{folder}/report.ncu-rep")
        if not rep.is_file():
            return "ncu profiled no kernel (the regex or NVTX filter matched nothing)"
        raw = commands.ncu_import_raw_csv_argv(ncu.path, rep)
        self.tools.export(raw, f"{folder}/raw.csv", f"ncu --import ({what})")
        return ""

    def _workload(self, name: str) -> list[str]:
        """The Stage 1 command Nsight Compute runs: one timed pass of one forward, its profiler window open."""
        return workload_argv(
            self.settings, self.user_overrides, self.art.run_dir, name=name, ncu=True, model_cache=self.model_cache
        )
