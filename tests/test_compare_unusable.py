"""`perf-compare --fail-on` never passes what it could not judge: a failed or interrupted folder (run or what-if), a
rung one what-if folder measured and the other did not, a folder compared with itself — exit 4, "unusable". Also
where compare.md goes by default, the last line printed, and the atomic writes."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import attrs
import pytest

from helpers import exit_code
from llm_perf_opt.cli.compare import main
from llm_perf_opt.records import io
from llm_perf_opt.records.common import RunStatus
from llm_perf_opt.records.comparison import GATE_EXIT_CODES, load_comparison, load_whatif_comparison
from llm_perf_opt.records.folders import STATUS_FILE
from llm_perf_opt.records.whatif import FAILED
from whatif_fixtures import minimal, whatif_tree

FIXTURES = Path(__file__).parent / "fixtures" / "compare"
H100_A = FIXTURES / "h100_s1final"
H100_B = FIXTURES / "h100_s1sol"
RULE = "e2e_ms:+5%"
RUNGS = ("00-baseline", "01-static_cache")


def _status(folder: Path, state: str, message: str | None = None, stage: str = "whatif") -> None:
    io.save(RunStatus(stage=stage, run_id=folder.name, state=state, started="2025-01-02T09:00:00+00:00",
                      message=message), folder / STATUS_FILE)  # fmt: skip


def whatif(tmp_path: Path, name: str, state: str = "complete", *, rung_state: str | None = None) -> Path:
    """A CPU what-if folder of the tiny model (two measured rungs, one skipped), a run of its own named `name`;
    `rung_state`: the static_cache rung's state instead of measured."""
    record = attrs.evolve(minimal(), run_id=name)
    if rung_state is not None:
        rungs = tuple(
            attrs.evolve(r, state=rung_state, reason="CUDA out of memory") if r.name == "static_cache" else r
            for r in record.rungs
        )
        record = attrs.evolve(record, rungs=rungs)
    root = whatif_tree(tmp_path / name, record, rungs=RUNGS)
    for metrics in root.glob("rungs/*/metrics.json"):  # each rung its own run
        data = json.loads(metrics.read_text())
        metrics.write_text(json.dumps({**data, "run_id": f"{name}-{metrics.parent.name}"}))
    _status(root, state, "CUDA out of memory" if state == "failed" else None)
    return root


def test_exit_codes_are_distinct() -> None:
    assert GATE_EXIT_CODES == {"pass": 0, "fail": 1, "inconclusive": 3, "unusable": 4}  # 2: bad input


def test_two_complete_whatif_folders_are_gated(tmp_path: Path) -> None:
    """The contrast: two complete CPU what-if runs are judged (3 passes each, a tiny model's noise: inconclusive)."""
    base, new = whatif(tmp_path, "base"), whatif(tmp_path, "new")
    assert exit_code(main, str(base), str(new), "--out", f"{tmp_path}/out/", "--fail-on", RULE) == 3
    result = load_whatif_comparison(tmp_path / "out" / "compare.json")
    assert result.gate_result == "inconclusive" and not result.gate_problems
    assert [p.rung for p in result.pairs if p.comparison is not None] == ["baseline", "static_cache"]


@pytest.mark.parametrize("state", ["failed", "interrupted"])
def test_a_whatif_folder_that_did_not_complete_is_unusable(
    state: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, new = whatif(tmp_path, "base"), whatif(tmp_path, "new", state)
    out = tmp_path / "out"
    # with --fail-on-unjudged, a rule inconclusive on these rungs is a failure, which outranks the unusable folder
    with_unjudged = {RULE: 1, "e2e_ms:+100%,ttft_ms:+100%": 4}
    for rule, code in with_unjudged.items():
        assert exit_code(main, str(base), str(new), "--out", f"{out}/", "--fail-on", rule, "--fail-on-unjudged") == code
        capsys.readouterr()
        assert exit_code(main, str(base), str(new), "--out", f"{out}/", "--fail-on", rule) == 4
        lines = capsys.readouterr().out.splitlines()
        assert lines[-1] == f"{out}/compare.md" and "gate: unusable (exit 4)" in lines
        assert f"not usable: {new} is marked {state}, not complete" in "\n".join(lines)
    md = (out / "compare.md").read_text()
    assert "Gate over every rung: **UNUSABLE** (exit 4)." in md and "PASS" not in md.split("## Rung")[0]
    assert load_whatif_comparison(out / "compare.json").gate_problems[0].startswith(f"{new} is marked {state}")


def test_a_rung_the_new_folder_did_not_measure_is_unusable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, new = whatif(tmp_path, "base"), whatif(tmp_path, "new", rung_state=FAILED)
    assert exit_code(main, str(base), str(new), "--out", f"{tmp_path}/out/", "--fail-on", RULE) == 4
    out = capsys.readouterr().out
    assert f"not usable: rung static_cache: rung static_cache in {new} is failed, not measured: CUDA out of" in out
    # the rung both folders skipped (cuda_graphs on a CPU) is nothing to judge: not a problem
    assert "cuda_graphs" not in out


def test_a_whatif_run_that_failed_before_its_record_is_unusable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, new = whatif(tmp_path, "base"), tmp_path / "new"
    new.mkdir()
    _status(new, "failed", "the baseline failed: CUDA out of memory")
    assert exit_code(main, str(base), str(new), "--out", f"{tmp_path}/out/", "--fail-on", RULE) == 4
    err = capsys.readouterr().err
    assert f"error: {new} is marked failed, not complete: the baseline failed: CUDA out of memory; it wrote no" in err
    assert exit_code(main, str(base), str(new), "--out", f"{tmp_path}/out/") == 2  # no gate: bad input, as before


def _failed_copy(tmp_path: Path, source: Path, state: str) -> Path:
    folder = shutil.copytree(source, tmp_path / f"{source.name}_{state}")
    _status(folder, state, "CUDA out of memory" if state == "failed" else None, stage="stage1")
    return folder


@pytest.mark.parametrize("state", ["failed", "interrupted"])
def test_a_run_folder_that_did_not_complete_is_unusable(
    state: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    new = _failed_copy(tmp_path, H100_B, state)
    out = tmp_path / "c.md"
    assert exit_code(main, str(H100_A), str(new), "--out", str(out), "--fail-on", RULE) == 4
    err = capsys.readouterr().err
    assert f"{new}: the run is marked {state}, not complete" in err and "the gate has no runs to judge" in err
    assert not out.exists()
    # beside two usable runs, the gate judges those, and still cannot pass
    assert exit_code(main, str(H100_A), str(H100_B), str(new), "--out", str(out), "--fail-on", "e2e_ms:+100%") == 4
    gate = load_comparison(tmp_path / "c.json").gate
    assert gate is not None and gate.result == "unusable" and [c.verdict for c in gate.checks] == ["pass"]
    assert len(gate.problems) == 1 and gate.problems[0].startswith(f"{new}: the run is marked {state}, not complete")
    md = out.read_text()
    assert "**UNUSABLE** (exit 4) (1 pass)" in md and "Not usable, so the gate cannot pass" in md


def test_a_folder_compared_with_itself_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "c.md")
    assert exit_code(main, str(H100_A), str(H100_A), "--out", out, "--fail-on", RULE) == 4
    assert f"{H100_A}: the same folder as {H100_A}" in capsys.readouterr().err
    copy = shutil.copytree(H100_A, tmp_path / "copy")
    assert exit_code(main, str(H100_A), str(copy), "--out", out, "--fail-on", RULE) == 4
    assert f"the same run as {H100_A} (run id s1final, created 2026-11-22T12:40:04+00:00)" in capsys.readouterr().err
    assert exit_code(main, str(H100_A), str(H100_A), "--out", out) == 2  # no gate: nothing left to compare, bad input
    assert not Path(out).exists()
    base = whatif(tmp_path, "base")
    assert exit_code(main, str(base), str(base), "--out", out, "--fail-on", RULE) == 4
    err = capsys.readouterr().err
    assert f"{base} is the same folder as {base}, so comparing them compares a run with itself" in err
    again = shutil.copytree(base, tmp_path / "again")
    assert exit_code(main, str(base), str(again), "--out", out, "--fail-on", RULE) == 4
    assert "is the same what-if run as" in capsys.readouterr().err
    assert exit_code(main, str(base), str(again), "--out", out) == 2


def test_default_out_is_a_fresh_folder_under_tmp_and_the_last_line_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    main([str(H100_A), str(H100_B)])
    last = capsys.readouterr().out.splitlines()[-1]
    assert re.fullmatch(r"tmp/compare/\d{8}-\d{6}-[0-9a-f]{8}/compare\.md", last), last
    assert (tmp_path / last).is_file() and (tmp_path / last).with_suffix(".json").is_file()
    assert not (tmp_path / "compare.md").exists()
    assert exit_code(main, str(H100_A), str(H100_B), "--fail-on", "e2e_ms:+100%") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2] == "gate: pass" and lines[-1].startswith("tmp/compare/") and lines[-1] != last


def test_compare_files_are_written_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[Path] = []
    atomic = io.atomic_write_text

    def recorded(target: Path, text: str) -> None:
        written.append(Path(target))
        atomic(target, text)

    monkeypatch.setattr(io, "atomic_write_text", recorded)
    main([str(H100_A), str(H100_B), "--out", f"{tmp_path}/"])
    assert sorted(p.name for p in written) == ["compare.json", "compare.md"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compare.json", "compare.md"]  # no temporary left
