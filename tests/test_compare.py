"""`perf-compare`: real H100 / CPU Stage 1 and H100 Stage 2 run folders (trimmed) compared side by side."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llm_perf_opt.cli.compare import main
from llm_perf_opt.measure.comparison import TOP_MOVERS, ratio
from llm_perf_opt.measure.noise import noise_verdict
from llm_perf_opt.measure.throughput import run_pages
from llm_perf_opt.pipeline import compare as cmp
from llm_perf_opt.records.common import SCHEMA_MAJOR, SCHEMA_VERSION, Summary
from llm_perf_opt.records.comparison import load_comparison
from llm_perf_opt.records.folders import load, load_stage1
from llm_perf_opt.report.comparison import comparison_markdown
from llm_perf_opt.report.markdown import ratio_text

FIXTURES = Path(__file__).parent / "fixtures" / "compare"
H100_A = FIXTURES / "h100_s1final"  # no MBU (written before efficiency existed)
H100_B = FIXTURES / "h100_s1sol"
CPU_TINY = FIXTURES / "cpu_tiny"
S2_LIGHT = FIXTURES / "s2_light"
S2_DEEP = FIXTURES / "s2_deep"


def compare_md(*paths: Path) -> str:
    """compare.md of `paths`, as perf-compare renders it."""
    return comparison_markdown(cmp.compare(paths))


def ci(n: int, low: float, high: float) -> Summary:
    """A summary of `n` passes whose 95% interval is [low, high] (none below 3 passes, as summarize gives)."""
    mid = (low + high) / 2
    bounds = (low, high) if n >= 3 else (None, None)
    return Summary(n, mid, 0.0, low, mid, high, high, None, *bounds, "ms")


def table_row(markdown: str, first_cell: str) -> list[str]:
    """The cells of the first Markdown table row that starts with `first_cell`."""
    for line in markdown.splitlines():
        if line.startswith(f"|{first_cell}|"):
            return line.strip("|").split("|")
    raise AssertionError(f"no row {first_cell!r} in:\n{markdown}")


def body_rows(markdown: str) -> list[list[str]]:
    """The cells of every table row in `markdown`, header and separator rows left out."""
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    rows = [line.strip("|").split("|") for line in lines if ":---" not in line]
    return [row for row in rows if row[0] not in ("Stage", "Field", "Operator", "Kernel", "Whole run")]


def section(markdown: str, title: str) -> str:
    """The text from the header `title` to the next header of any level."""
    start = markdown.index(title)
    rest = markdown[start + len(title) :]
    ends = [i for i in (rest.find("\n## "), rest.find("\n### ")) if i >= 0]
    return rest[: min(ends)] if ends else rest


def failed_copy(tmp_path: Path, source: Path, state: str) -> Path:
    folder = tmp_path / f"{source.name}_{state}"
    shutil.copytree(source, folder)
    status = json.loads((folder / "run_status.json").read_text())
    status.update(state=state, message="CUDA out of memory" if state == "failed" else None)
    (folder / "run_status.json").write_text(json.dumps(status))
    return folder


def test_schema_major_matches_writers() -> None:
    from llm_perf_opt.measure.stage1_analysis import SCHEMA_VERSION as STAGE1_VERSION
    from llm_perf_opt.nsight.stage2_analysis import SCHEMA_VERSION as STAGE2_VERSION

    assert STAGE1_VERSION.split(".")[0] == STAGE2_VERSION.split(".")[0] == SCHEMA_MAJOR


def test_beyond_noise_uses_ci_overlap() -> None:
    base = ci(5, 10.0, 12.0)
    assert noise_verdict(ci(5, 12.5, 14.0), base) == "beyond noise"
    assert noise_verdict(ci(5, 11.5, 14.0), base) == "within noise"
    assert noise_verdict(ci(1, 20.0, 20.0), base).startswith("n/a")
    assert noise_verdict(None, base) == "n/a"
    assert ratio_text(ratio(15.0, 10.0)) == "1.50×" and ratio_text(ratio(None, 10.0)) == "n/a"
    assert ratio_text(ratio(1.0, 0.0)) == "n/a"


def test_two_h100_stage1_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sub" / "compare.md"
    main([str(H100_A), str(H100_B), "--out", str(out)])
    assert capsys.readouterr().out.splitlines()[-1] == str(out)  # the last line: the bare path, for scripts
    md = out.read_text()
    assert "Stage 1: **h100_s1final** (baseline) compared with h100_s1sol." in md
    assert "Skipped folders" not in md and "Stage 2:" not in md

    stages = section(md, "### Stage times (p50, ms)")
    assert "|Stage|h100_s1final p50|h100_s1sol p50|h100_s1sol ratio|h100_s1sol beyond noise|" in stages
    # same workload on the same GPU: p50s of both runs, their ratio, and every stage within the recorded noise
    assert table_row(stages, "prefill") == ["prefill", "98.42", "99.97", "1.02×", "within noise"]
    assert table_row(stages, "decode/step (in decode)")[1:4] == ["17.08", "18.31", "1.07×"]
    verdicts = [row[4] for row in body_rows(stages)]
    assert len(verdicts) == 9 and set(verdicts) == {"within noise"}

    efficiency = section(md, "### MFU and MBU per stage")
    assert "|Stage|h100_s1final MFU|h100_s1sol MFU|h100_s1final TFLOP/s|h100_s1sol TFLOP/s|" in efficiency
    assert table_row(efficiency, "prefill") == ["prefill", "5.04%", "5.14%", "49.8", "50.8", "n/a", "10.26%"]

    movers = section(md, "### Top operators that moved most")
    rows = body_rows(movers)
    deltas = [abs(float(r[5])) for r in rows]
    assert 0 < len(rows) <= TOP_MOVERS and deltas == sorted(deltas, reverse=True)
    assert rows[0][0] == "aten::addmm" and rows[0][5] == "-0.04"

    config, keys = section(md, "### Configuration and environment differences").split("|config.yaml key|")
    assert [row[0] for row in body_rows(config)] == ["config digest"]  # same model, device, software and settings
    assert table_row(config, "config digest")[1:] == ["2711c59415e3", "f0cbc3e27323"]
    # the digests differ because the later release wrote an analytic section into config.yaml: listed key by key
    assert {row[0].split(".")[0] for row in body_rows(keys)} == {"analytic"}
    assert table_row(keys, "analytic.tiles")[1:] == ["(absent)", "6"]


def test_h100_vs_cpu_tiny_lists_config_differences() -> None:
    md = compare_md(H100_B, CPU_TINY)
    config = section(md, "### Configuration and environment differences")
    assert table_row(config, "model")[1:] == ["deepseek_ocr2", "deepseek_ocr2_tiny"]
    assert table_row(config, "device")[1:] == ["NVIDIA H100 80GB HBM3", "AMD EPYC"]
    assert table_row(config, "dtype")[1:] == ["bfloat16", "float32"]
    assert table_row(config, "torch")[1:] == ["2.11.0+cu130", "2.13.0+cpu"]
    assert table_row(config, "transformers")[1:] == ["5.17.0", "5.23.0"]
    assert table_row(config, "max_new_tokens")[1:] == ["32", "4"]
    # a 200× smaller model on a CPU: prefill is far slower and clearly beyond noise
    assert table_row(md, "prefill")[3:5] == ["21.42×", "beyond noise"]
    # operators are ranked by each run's own device time (CUDA vs CPU)
    assert "**cpu_tiny** (by `self_cpu_ms`) vs **h100_s1sol** (by `self_device_ms`)" in md
    assert table_row(md, "aten::mm")[3:5] == ["6.35", "1,045.03"]


def test_bad_folders_skipped_rest_compared(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    failed = failed_copy(tmp_path, H100_B, "failed")
    missing = tmp_path / "does_not_exist"
    no_metrics = tmp_path / "empty"
    no_metrics.mkdir()
    out = tmp_path / "compare.md"
    main([str(failed), str(H100_A), str(missing), str(no_metrics), str(H100_B), "--out", str(out)])
    err = capsys.readouterr().err
    assert f"skipped {failed}: the run is marked failed, not complete: CUDA out of memory" in err
    assert f"skipped {missing}: the folder does not exist" in err
    assert f"skipped {no_metrics}: no metrics.json" in err

    md = out.read_text()
    skipped = section(md, "## Skipped folders")
    assert f"`{failed}`: the run is marked failed" in skipped and f"`{missing}`: the folder does not exist" in skipped
    # the failed first folder is not the baseline: the first usable one is
    assert "Stage 1: **h100_s1final** (baseline) compared with h100_s1sol." in md
    assert table_row(md, "prefill")[1:3] == ["98.42", "99.97"]


def test_other_schema_major_and_running_are_skipped(tmp_path: Path) -> None:
    newer = tmp_path / "newer"
    shutil.copytree(H100_A, newer)
    metrics = json.loads((newer / "metrics.json").read_text())
    (newer / "metrics.json").write_text(json.dumps({**metrics, "schema_version": "2.0"}))
    running = failed_copy(tmp_path, H100_B, "running")
    assert cmp.load_run(newer) == cmp.Skipped(
        newer,
        f"metrics.json has schema_version 2.0; this version of llm-perf-opt reads 1.x (it writes {SCHEMA_VERSION})",
    )
    result = cmp.load_run(running)
    assert isinstance(result, cmp.Skipped) and "marked running" in result.reason


def test_fewer_than_two_usable_exits_2(tmp_path: Path) -> None:
    interrupted = failed_copy(tmp_path, H100_A, "interrupted")
    out = tmp_path / "compare.md"
    folders = [str(H100_B), str(interrupted), str(tmp_path / "gone")]
    proc = subprocess.run(
        [sys.executable, "-m", "llm_perf_opt.cli.compare", *folders, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()
    assert "error: fewer than two usable run folders of one kind to compare" in proc.stderr
    assert f"{interrupted}: the run is marked interrupted" in proc.stderr
    assert "Pass at least two completed folders written by stage1-run" in proc.stderr


def test_one_stage1_and_one_stage2_is_not_comparable() -> None:
    with pytest.raises(cmp.UserError, match="fewer than two usable run folders of one kind"):
        cmp.compare([H100_A, S2_LIGHT])


def test_two_stage2_runs() -> None:
    md = compare_md(S2_LIGHT, S2_DEEP)
    assert "Stage 2: **s2_light** (baseline) compared with s2_deep." in md
    busy = section(md, "### GPU busy time per stage (Nsight Systems)")
    assert "|Stage|s2_light busy ms|s2_deep busy ms|s2_deep ratio|s2_light busy fraction|s2_deep busy fraction|" in busy
    assert table_row(busy, "prefill") == ["prefill", "235.11", "235.67", "1.00×", "37.6%", "38.9%", "17,738", "17,738"]
    assert table_row(busy, "decode")[4:6] == ["8.9%", "10.6%"]
    assert table_row(busy, "decode step wall ms")[1:] == ["28.04", "23.59"]

    kernels = section(md, "### Kernels that moved most")
    rows = body_rows(kernels)
    deltas = [abs(float(r[5])) for r in rows]
    assert 0 < len(rows) <= TOP_MOVERS and deltas == sorted(deltas, reverse=True)
    assert rows[0] == [
        "unrolled_elementwise_kernel [direct_copy_kernel_cuda]",
        "17,874",
        "17,874",
        "51.88",
        "52.71",
        "+0.83",
    ]
    assert table_row(section(md, "### Configuration and environment differences"), "mode")[1:] == ["light", "deep"]


def _static_copy(tmp_path: Path) -> Path:
    """The CPU tiny run as if rerun with a static KV cache and batches of 2 filled with copies (metrics.json and
    config.yaml both say so), from another dataset folder."""
    folder = tmp_path / "static"
    shutil.copytree(CPU_TINY, folder)
    metrics = json.loads((folder / "metrics.json").read_text())
    metrics["run_id"] = "static"  # another run (a plain copy is the same run)
    metrics["settings"]["runtime"] = {"kv_cache": "static", "batch_size": 2}
    metrics["settings"].update(batch_size=2, fill_batches=True)
    (folder / "metrics.json").write_text(json.dumps(metrics))
    config = yaml.safe_load((folder / "config.yaml").read_text())
    config["runtime"] = {"kv_cache": "static"}
    config["run"].update(batch_size=2, fill_batches=True)
    config["dataset"]["seed"] = 7
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    return folder


def test_every_differing_setting_is_listed(tmp_path: Path) -> None:
    """A dynamic-cache run against a static-cache one: the runtime settings and run.fill_batches are compared, and
    any other config.yaml key that differs is listed once, under its key."""
    base = tmp_path / "dynamic"
    shutil.copytree(CPU_TINY, base)
    md = compare_md(base, _static_copy(tmp_path))
    settings, keys = section(md, "### Configuration and environment differences").split("|config.yaml key|")
    assert table_row(settings, "runtime.kv_cache")[1:] == ["dynamic", "static"]
    assert table_row(settings, "run.fill_batches")[1:] == ["False", "True"]
    assert table_row(settings, "batch_size")[1:] == ["1", "2"]
    assert "runtime.compile" not in settings  # the same in both runs: not a difference
    assert [row[0] for row in body_rows(keys)] == ["dataset.seed"]  # the settings rows above are not repeated
    assert table_row(keys, "dataset.seed")[1:] == ["0", "7"]


def test_mixed_kinds_compared_within_each_kind() -> None:
    md = compare_md(H100_A, S2_LIGHT, H100_B, S2_DEEP, CPU_TINY)
    assert "Stage 1: **h100_s1final** (baseline) compared with h100_s1sol, cpu_tiny." in md
    assert "Stage 2: **s2_light** (baseline) compared with s2_deep." in md
    assert "## Stage 1: h100_s1final vs h100_s1sol vs cpu_tiny" in md and "## Stage 2: s2_light vs s2_deep" in md


def test_stage_present_in_one_run_only_shows_na(tmp_path: Path) -> None:
    fewer = tmp_path / "fewer"
    shutil.copytree(H100_B, fewer)
    metrics = json.loads((fewer / "metrics.json").read_text())
    metrics["stages"] = [s for s in metrics["stages"] if s["stage"] != "decode/step"]
    (fewer / "metrics.json").write_text(json.dumps(metrics))
    md = compare_md(H100_A, fewer)
    assert table_row(md, "decode/step (in decode)")[1:] == ["17.08", "n/a", "n/a", "n/a"]


def test_same_run_twice_is_skipped_and_same_names_get_unique_labels(tmp_path: Path) -> None:
    runs, skipped = cmp.load_runs([H100_A, H100_A])
    assert [r.label for r in runs] == ["h100_s1final"]
    assert skipped == [cmp.Skipped(H100_A, f"the same folder as {H100_A}")]
    copy = shutil.copytree(H100_A, tmp_path / "copy" / H100_A.name)  # a copy is the same run: same id and start
    runs, skipped = cmp.load_runs([H100_A, copy])
    assert len(runs) == 1 and skipped[0].reason.startswith(f"the same run as {H100_A} (run id s1final, created 2026")
    other = tmp_path / "other" / H100_A.name  # another run in a folder of the same name
    shutil.copytree(H100_A, other)
    metrics = json.loads((other / "metrics.json").read_text())
    (other / "metrics.json").write_text(json.dumps({**metrics, "created": "2026-11-23T08:00:00+00:00"}))
    runs, skipped = cmp.load_runs([H100_A, other])
    assert [r.label for r in runs] == ["h100_s1final", "h100_s1final#2"] and not skipped


# ---- --out: a folder gets compare.md and compare.json; a run folder's files are never overwritten ------------------
STAGE1_RUN = Path(__file__).parent / "fixtures" / "runs" / "cpu_tiny_v1_stage1"  # with operators.json, report.md


def _refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """perf-compare's stderr for `argv`, which must end with exit code 2."""
    with pytest.raises(SystemExit) as ended:
        main(list(argv))
    assert ended.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("name", ["operators.md", "report.md", "metrics.md", "viz/predictions.md"])
def test_out_over_a_run_folders_file_is_refused(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    shutil.copytree(STAGE1_RUN, run)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    err = _refused(capsys, str(H100_A), str(run), "--out", str(run / name))
    assert err.startswith(f"\nerror: --out {run / name} would overwrite ") and err.count("\n") == 2  # one paragraph
    assert f"part of the run folder {run}; nothing was written. Write the comparison outside run folders" in err
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    assert load(run).operators is not None  # stage1-report still reads the measured operator profile


def test_out_naming_a_folder_writes_compare_files_inside(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    existing = tmp_path / "existing"
    existing.mkdir()
    main([str(H100_A), str(H100_B), "--out", str(existing)])
    assert capsys.readouterr().out.splitlines()[-1] == str(existing / "compare.md")
    assert "Stage 1: **h100_s1final**" in (existing / "compare.md").read_text()
    assert load_comparison(existing / "compare.json").stage1 is not None
    main([str(H100_A), str(H100_B), "--out", str(existing)])  # a folder of comparisons may be rewritten
    fresh = tmp_path / "new" / "cmp"
    main([str(H100_A), str(H100_B), "--out", f"{fresh}/"])
    assert sorted(p.name for p in fresh.iterdir()) == ["compare.json", "compare.md"]


def test_out_into_a_run_folder_adds_files_without_replacing_any(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(STAGE1_RUN, run)
    main([str(H100_A), str(run), "--out", str(run)])
    assert (run / "compare.md").is_file() and load(run).operators is not None
    err = _refused(capsys, str(H100_A), str(run), "--out", str(run))  # now compare.md is part of the run folder
    assert f"would overwrite {run / 'compare.md'} and {run / 'compare.json'}, part of the run folder {run}" in err


def test_out_whose_record_would_replace_a_folder_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "x.json").mkdir()
    err = _refused(capsys, str(H100_A), str(H100_B), "--out", str(tmp_path / "x.md"))
    assert f"--out {tmp_path / 'x.md'} would write the comparison over {tmp_path / 'x.json'}, which is a folder" in err
    assert "Traceback" not in err and not (tmp_path / "x.md").exists()


def _scaled_copy(source: Path, target: Path, factor: float) -> Path:
    """A copy of the Stage 1 run `source` as another run whose every timed pass took `factor` times as long."""
    shutil.copytree(source, target)
    metrics = json.loads((target / "metrics.json").read_text())
    for record in metrics["records"]:
        for key in ("preprocess_ms", "prefill_ms", "decode_ms"):
            record[key] *= factor
    metrics["created"] = "2026-12-01T08:00:00+00:00"
    (target / "metrics.json").write_text(json.dumps(metrics))
    return target


def test_pages_per_s_is_one_compared_figure_higher_is_better(tmp_path: Path) -> None:
    """perf-compare sets each run's pages/s (its Stage1Metrics.pages figure) beside the baseline's."""
    faster = _scaled_copy(STAGE1_RUN, tmp_path / "faster", 0.5)
    comparison = cmp.compare([STAGE1_RUN, faster])
    assert comparison.stage1 is not None
    (row,) = comparison.stage1.throughput
    base, other = (run_pages(load_stage1(path).metrics) for path in (STAGE1_RUN, faster))
    assert base is not None and other is not None
    assert row.figure == "pages/s" and row.base_p50 == base.pages_per_s.p50
    assert row.others[0].p50 == other.pages_per_s.p50 and row.others[0].ratio == pytest.approx(2.0)
    md = comparison_markdown(comparison)
    cells = table_row(section(md, "### Throughput (p50)"), "pages/s")
    assert cells[1:4] == [f"{base.pages_per_s.p50:,.3f}", f"{other.pages_per_s.p50:,.3f}", "2.00×"]
    assert cells[4] == noise_verdict(other.pages_per_s, base.pages_per_s)
    assert "above 1 is more pages per second (better)" in md
    assert not cmp.compare([H100_A, H100_B]).stage1.throughput  # no timed passes recorded: no row
