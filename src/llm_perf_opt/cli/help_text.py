"""Each command's `--help`: what it does, its most used overrides, its own config groups with their choices (read
from the package's conf folders, so they never go stale), its guide, and where the full config is.

The Hydra commands print it through `hydra.help.template: ${llo_help:${hydra.help.app_name}}` (conf/stage1.yaml,
analytic.yaml; stage2.yaml and whatif.yaml set their own app_name), the argparse ones as description and epilog.
Hydra's own `$APP_CONFIG_GROUPS` is not used: it lists every group of the shared conf folder, `whatif` for
`stage1-run` too, whereas :func:`config_groups` follows the command's own defaults list.
"""

from __future__ import annotations

import argparse
import textwrap
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable

import yaml

WIDTH = 100  # the paragraph's line length
GUIDES = "docs/guide"  # the guides' folder in the project's repository


@dataclass(frozen=True)
class CommandHelp:
    """What one command's `--help` says besides what the config and the parser hold."""

    summary: str  # one paragraph: what the command does and writes
    guide: str  # its guide, a file of GUIDES
    config_name: str | None = None  # its Hydra config (conf/<name>.yaml); None: an argparse command
    section: str = ""  # a section of its config, the example of `--cfg job --package`
    examples: tuple[tuple[str, str], ...] = ()  # its most used command lines (arguments, what they do)


COMMANDS: dict[str, CommandHelp] = {
    "stage1-run": CommandHelp(
        summary="profile a vision-language model's inference (DeepSeek-OCR by default) stage by stage: times "
        "preprocessing, each vision sub-stage, prefill and decode over timed passes, counts their FLOPs and bytes "
        "against the device's peaks (MFU, MBU), then runs the torch profiler, a memory and an energy pass. Writes "
        "a run folder, tmp/stage1/<run id>/, and prints the path of its report.md last: where the time goes and "
        "what to try. Runs on a CPU (small defaults: one page, 8 new tokens) or a GPU, with random weights unless "
        "model.path names a checkpoint.",
        guide="stage1.md",
        config_name="stage1",
        section="run",
        examples=(
            ("model=deepseek_ocr_tiny", "a tiny model of the same classes: seconds, any CPU"),
            ("workload=ocr1-a4-page", "a named workload: page, tiles, decode length, model"),
            ("device=cuda:1 model.dtype=float16", "device and compute dtype"),
            ("dataset.root=DIR dataset.max_images=20", "your own pages (default: the bundled samples)"),
            ("run.repeats=10 infer.max_new_tokens=64", "timed passes, tokens generated per pass"),
            ("runtime.kv_cache=static runtime.compile=decode", "static KV cache and a compiled decode step"),
            ("hydra.run.dir=DIR", "the run folder"),
            ("-m run.batch_size=1,2,4", "a sweep: one run per value, and a summary"),
        ),
    ),
    "stage2-profile": CommandHelp(
        summary="run the stage1-run workload under Nsight Systems and Nsight Compute: GPU time per stage, how busy "
        "the GPU is, the top kernels and their roofline, optionally every kernel's DRAM bytes. Every stage1-run "
        "override is forwarded to the profiled workload. Writes tmp/stage2/<run id>/ (report.md, then kernels.md). "
        "Needs an NVIDIA GPU, nsys and ncu; stage2-report rebuilds the reports anywhere.",
        guide="stage2.md",
        config_name="stage2",
        section="stage2",
        examples=(
            ("model=deepseek_ocr_tiny", "a quick check of the tool chain"),
            ("stage2.mode=deep", "top 20 kernels, full roofline, every kernel's DRAM bytes"),
            ("pipeline.ncu.bytes_pass=true", "light mode plus every kernel's DRAM bytes"),
            ("infer.max_new_tokens=16", "any stage1-run override sets the workload"),
            ("report.stage1_dir=DIR", "name kernels by module from a Stage 1 folder"),
            ("stage2.rerender=DIR", "rebuild an existing folder's reports (as stage2-report)"),
        ),
    ),
    "perf-whatif": CommandHelp(
        summary="try optimisation levers (static cache, CUDA graphs, compiled decode, MoE and attention backends, "
        "batches, fewer tiles) on the stage1-run workload, each rung a stage1-run in its own process: ranks them "
        "with intervals, checks their outputs against the baseline, stacks the ones that helped into a ladder and "
        "writes tmp/whatif/<run id>/whatif.md. Every stage1-run key sets the workload of every rung; whatif=<preset> "
        "picks the levers.",
        guide="whatif.md",
        config_name="whatif",
        section="whatif_run",
        examples=(
            ("whatif=decode workload=ocr1-a4-page", "the decode levers on a named workload"),
            ("whatif=advised whatif.from_run=tmp/stage1/20261128-101500-3fa9c2e1", "a stage1 run's advice, measured"),
            ("model=deepseek_ocr_tiny whatif_run.ladder=false", "a quick look: each lever alone"),
            ("whatif_run.exclude=[attn_eager]", "leave levers of the preset out"),
            ("whatif_run.devices=[cuda:0,cuda:1]", "one rung per GPU at a time"),
            ("whatif_run.rung_timeout_s=900", "seconds one rung may take"),
            ("--config-dir ./my_levers whatif=mine", "your own preset: ./my_levers/whatif/mine.yaml"),
        ),
    ),
    "analytic-report": CommandHelp(
        summary="price a workload from the model config alone (no weights, no GPU, seconds): FLOPs, weight, "
        "activation and KV-cache bytes per stage and per module, the lower-bound time of each stage on each GPU of "
        "the hardware table, and the prefill cost per tile count or mode. Writes "
        "tmp/analytic/<run id>/static_analysis/analytic_model/report.md.",
        guide="analytic.md",
        config_name="analytic",
        section="analytic",
        examples=(
            ("model=deepseek_ocr2 analytic.tiles=6", "DeepSeek-OCR-2 with 6 tiles of 768 px"),
            ("model.mode=base", "v1's mode: tiny|small|base|large|gundam (default)"),
            ("analytic.new_tokens=256", "tokens generated"),
            ("analytic.gpus=[h100_sxm,l4]", "the GPUs to price on (hardware table names)"),
            ("workload=ocr2-receipt", "a named workload, as stage1-run measures it"),
        ),
    ),
    "stage1-report": CommandHelp(
        summary="rebuild a stage1-run folder's Markdown reports and plots from its records: no model, no GPU, any "
        "machine. With --whatif, 'What to try' cites the levers a perf-whatif run measured.",
        guide="stage1.md",
        examples=(("tmp/stage1/<run id>", "rebuild the folder's report.md and plots"),),
    ),
    "stage2-report": CommandHelp(
        summary="rebuild a stage2-profile folder's Markdown and JSON from its Nsight exports: no GPU, no Nsight, any "
        "machine (e.g. after copying the folder to a laptop).",
        guide="stage2.md",
        examples=(
            ("tmp/stage2/<run id>", "rebuild the folder's report.md, kernels.md and JSON"),
            ("FOLDER --stage1 STAGE1_FOLDER", "name its kernels by module from a Stage 1 run"),
        ),
    ),
    "perf-compare": CommandHelp(
        summary="compare stage1-run or stage2-profile folders side by side in Markdown (and the same figures as JSON "
        "next to it), the first folder as the baseline: per-stage medians, whether each difference exceeds noise, "
        "and the settings that differ. Two perf-whatif folders are compared rung by rung. With --fail-on, a "
        "regression gate: exit 0 pass, 1 a figure grew beyond its threshold and beyond noise, 2 bad input, "
        "3 inconclusive (too noisy to tell: time more passes), 4 a folder is failed, interrupted or the same run. "
        "Writes under tmp/compare/ unless --out says where; the last line printed is the path of compare.md.",
        guide="compare-and-sweeps.md",
        examples=(
            ("RUN_A RUN_B --out cmp/", "cmp/compare.md and cmp/compare.json"),
            ("RUN_A RUN_B --fail-on decode_ms_per_token:+5%", "exit 1 when decode got 5% slower, 3 can't tell"),
        ),
    ),
}


@dataclass(frozen=True)
class ConfigGroup:
    """A config group a command composes, with its choices (the group folder's configs) and its default."""

    name: str
    default: str | None  # None: no config of the group unless chosen (`workload: null`)
    choices: tuple[str, ...]


def guide_path(command: str) -> str:
    """The command's guide, relative to the project's root."""
    return f"{GUIDES}/{COMMANDS[command].guide}"


def config_groups(config_name: str, conf: Traversable | None = None) -> list[ConfigGroup]:
    """The groups `config_name`'s defaults list composes (following the configs it includes, such as `stage1`), in
    that order, with the choices found in `conf` (default: the package's conf folder)."""
    conf = conf or files("llm_perf_opt") / "conf"
    defaults: dict[str, str | None] = {}
    _collect_defaults(conf, config_name, defaults)
    return [ConfigGroup(group, default, _choices(conf, group)) for group, default in defaults.items()]


def _collect_defaults(conf: Traversable, config_name: str, into: dict[str, str | None]) -> None:
    config = yaml.safe_load((conf / f"{config_name}.yaml").read_text(encoding="utf-8")) or {}
    for entry in config.get("defaults", []):
        if isinstance(entry, str):
            if (conf / f"{entry}.yaml").is_file():  # not _self_, nor a schema of Hydra's ConfigStore (stage1_schema)
                _collect_defaults(conf, entry, into)  # another primary config, e.g. stage2's `stage1`
            continue
        for key, option in entry.items():
            group = key.removeprefix("override ").removeprefix("optional ").split("@")[0].strip("/")
            if not group.startswith("hydra/"):
                into[group] = option


def _choices(conf: Traversable, group: str) -> tuple[str, ...]:
    folder = conf.joinpath(*group.split("/"))
    return tuple(sorted(item.name.removesuffix(".yaml") for item in folder.iterdir() if item.name.endswith(".yaml")))


def _wrap(text: str, indent: str = "") -> str:
    return textwrap.fill(text, WIDTH, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False)


def _table(rows: list[tuple[str, str]], indent: str = "  ") -> list[str]:
    width = max(len(left) for left, _ in rows)
    return [f"{indent}{left.ljust(width)}  {right}".rstrip() for left, right in rows]


def _group_rows(config_name: str) -> list[tuple[str, str]]:
    """One row per group with a choice to make (a group of one config is a section of `--cfg job`), its default
    marked `*` (`null*`: none of the group's configs unless one is chosen)."""
    rows = []
    for group in config_groups(config_name):
        if len(group.choices) > 1:
            default = "null" if group.default is None else group.default
            choices = [f"{choice}*" if choice == default else choice for choice in group.choices]
            rows.append((group.name, "|".join(choices if default in group.choices else [f"{default}*", *choices])))
    return rows


def hydra_help(command: str) -> str:
    """The `--help` of a Hydra command (the `llo_help` resolver behind `hydra.help.template`)."""
    about = COMMANDS[command]
    if about.config_name is None:
        raise ValueError(f"{command} is not a Hydra command")
    lines = [
        _wrap(f"{command}: {about.summary}"),
        "",
        f"Usage: {command} [key=value ...] [group=choice ...]",
        "",
        "Most used overrides:",
        *_table(list(about.examples)),
        "",
        "Config groups (group=choice; * the default):",
        *(f"  {group}={choices}" for group, choices in _group_rows(about.config_name)),
        "",
        "Every key of the config can be overridden (key=value); to see them with their values:",
        *_table(
            [
                (f"{command} --cfg job", "the whole config, after any overrides given with it"),
                (f"{command} --cfg job --package {about.section}", "one section of it"),
                (f"{command} --hydra-help", "Hydra's own flags and help"),
            ]
        ),
        "",
        f"Guides (in the project's repository): {guide_path(command)}, {GUIDES}/configuration.md",
    ]
    return "\n".join(lines).replace("$", "$$")  # Hydra substitutes $NAME in the template: keep a $ a $


def command_parser(command: str) -> argparse.ArgumentParser:
    """An argparse command's parser, with its description and epilog (examples and its guide) preformatted."""
    about = COMMANDS[command]
    examples = _table([(f"{command} {args}", what) for args, what in about.examples])
    epilog = "\n".join(["examples:", *examples, "", f"guide: {guide_path(command)} (in the project's repository)"])
    description = _wrap(about.summary[0].upper() + about.summary[1:])
    formatter = argparse.RawDescriptionHelpFormatter
    return argparse.ArgumentParser(prog=command, description=description, epilog=epilog, formatter_class=formatter)


def register_resolver() -> None:
    """`${llo_help:<command>}`: the command's `--help` text (idempotent)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("llo_help"):
        OmegaConf.register_new_resolver("llo_help", hydra_help)
