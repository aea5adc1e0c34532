"""The shipped examples (examples/) are what today's code renders from their records: each one, copied and rendered
again by scripts/rerender_examples.py, is byte for byte the folder that ships (PNG plots by their presence).
Their links resolve: tests/test_docs_links.py checks every Markdown file under examples/ with the docs."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import ModuleType

import pytest

from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "rerender_examples.py"


EXAMPLES = sorted(p for p in (ROOT / "examples").iterdir() if p.is_dir())


@pytest.fixture(scope="module")
def rerender() -> ModuleType:
    """scripts/rerender_examples.py, imported (it imports the pipelines)."""
    return load_script(SCRIPT)


def test_every_example_is_rendered_by_the_script(rerender: ModuleType) -> None:
    assert rerender.examples() == EXAMPLES
    assert {p.name for p in EXAMPLES} == {
        "stage2-h100-tiny",
        "whatif-h100-all",
        "whatif-h100-decode",
        "whatif-h100-first-token",
        "whatif-h200-throughput",
    }


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_the_example_is_what_todays_code_renders(tmp_path: Path, example: Path, rerender: ModuleType) -> None:
    copy = shutil.copytree(example, tmp_path / example.name)
    rerender.rerender(copy)
    differences = rerender.differences(example, copy)
    assert not differences, (
        f"examples/{example.name} is not what the toolkit renders today ("
        + "; ".join(differences[:10])
        + f"): run `{rerender.COMMAND} {example.name}` and commit the result"
    )


def test_a_rung_folder_without_its_records_is_refused(tmp_path: Path, rerender: ModuleType) -> None:
    copy = shutil.copytree(ROOT / "examples" / "whatif-h100-first-token", tmp_path / "ft")
    (copy / "rungs" / "00-baseline").mkdir(parents=True)
    (copy / "rungs" / "00-baseline" / "run_status.json").write_text("{}\n")  # a status, no metrics
    with pytest.raises(SystemExit, match=r"no metrics\.json"):
        rerender.rerender(copy)


def test_the_comparison_sees_every_kind_of_difference(tmp_path: Path, rerender: ModuleType) -> None:
    shipped, rendered = tmp_path / "a", tmp_path / "b"
    for folder, text in ((shipped, "x"), (rendered, "y")):
        (folder / "plots").mkdir(parents=True)
        (folder / "report.md").write_text(text)
        (folder / "plots" / "p.png").write_bytes(text.encode())  # bytes of a plot are not compared
    (shipped / "old.md").write_text("")
    (rendered / "new.md").write_text("")
    assert rerender.differences(shipped, rendered) == [
        "old.md: shipped, not rendered",
        "new.md: rendered, not shipped",
        "report.md: differs",
    ]


def test_the_throughput_examples_record_is_what_todays_judging_gives(tmp_path: Path) -> None:
    """examples/whatif-h200-throughput ships its rung folders but no config: judged again (`whatif_judge
    --keep-outputs`, its rungs' logits are not kept; the ladder off, as the record says it ran), it gives the record
    that ships, its batch-64 rungs' vision judged per page; without --keep-outputs the near-ties the record holds are
    lost."""
    from llm_perf_opt.pipeline.whatif_judge import main
    from llm_perf_opt.records.folders import load_whatif

    example = ROOT / "examples" / "whatif-h200-throughput"
    copy = shutil.copytree(example, tmp_path / example.name)
    assert not (copy / "config.yaml").exists()
    main([str(copy), "--keep-outputs"])
    shipped = load_whatif(example)
    assert load_whatif(copy) == shipped
    best = shipped.best_rung
    assert best is not None and (vision := best.judgement("vision_ms")) is not None
    assert (vision.label, vision.verdict) == ("vision per page", "better")
    main([str(copy)])
    assert best.outputs is not None and best.outputs.near_tie is not None
    rejudged = load_whatif(copy).rung(best.name)
    assert rejudged is not None and rejudged.outputs is not None and rejudged.outputs.near_tie is None


def test_judging_a_record_that_does_not_say_whether_the_ladder_ran_leaves_that_unsaid(tmp_path: Path) -> None:
    """Without a config.yaml and with a record older than `ladder`, the judge plans with the default and writes no
    `ladder`: a guess is not recorded as what the run did."""
    import json

    from llm_perf_opt.pipeline.whatif_judge import main
    from llm_perf_opt.records.folders import load_whatif

    copy = shutil.copytree(ROOT / "examples" / "whatif-h200-throughput", tmp_path / "older")
    record = json.loads((copy / "whatif.json").read_text())
    del record["ladder"]
    (copy / "whatif.json").write_text(json.dumps(record))
    main([str(copy), "--keep-outputs"])
    assert load_whatif(copy).ladder is None
