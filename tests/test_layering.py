"""The package's layering rules, checked on the source: records/ at the floor, report/ renders only, run artifacts
parsed only in records/."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "llm_perf_opt"


def _modules(folder: str) -> list[Path]:
    return sorted((PACKAGE / folder).rglob("*.py"))


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_records_import_nothing_above_them() -> None:
    allowed = ("llm_perf_opt.records", "llm_perf_opt.errors")
    for path in _modules("records"):
        own = {name for name in _imports(path) if name.startswith("llm_perf_opt")}
        assert all(name.startswith(allowed) for name in own), (path.name, own)


def test_the_vocabulary_imports_nothing_from_the_package() -> None:
    assert not {n for n in _imports(PACKAGE / "records" / "vocabulary.py") if n.startswith("llm_perf_opt")}


def test_reports_import_neither_nsight_nor_json() -> None:
    for path in _modules("report"):
        imported = _imports(path)
        assert "json" not in imported, path.name
        assert not any(name.startswith("llm_perf_opt.nsight") for name in imported), path.name


def test_run_artifacts_are_parsed_only_in_records() -> None:
    """json.load(s) appears only in records/, in readers of files the toolkit does not write (Nsight exports,
    model configs and checkpoints), and in the rung fork server's line protocol (messages between two processes)."""
    readers_of_foreign_files = {"nsight", "models", "hf_source.py", "rung_forks.py"}
    found = []
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] == "records" or readers_of_foreign_files & {*relative.parts}:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in ("load", "loads")
                and getattr(node.value, "id", "") == "json"
            ):
                found.append(str(relative))
    assert not found


def test_pipelines_import_nothing_from_the_entry_points() -> None:
    """pipeline/ (and everything below it) never imports cli/: what both need lives below them
    (`config_compose`, `override_keys`, `gpu_claim`)."""
    for path in PACKAGE.rglob("*.py"):
        if path.relative_to(PACKAGE).parts[0] == "cli":
            continue
        assert not {n for n in _imports(path) if n.startswith("llm_perf_opt.cli")}, path.relative_to(PACKAGE)


BELOW_THE_PIPELINES = ("session", "measure", "nsight", "analytic", "hardware", "records", "report", "data", "models")


def test_nothing_below_the_pipelines_imports_the_config_libraries() -> None:
    """Settings are parsed once at the edge (cli/, pipeline/, the config modules at the root) into typed records;
    the layers below them never see an omegaconf node or Hydra."""
    found = []
    for folder in BELOW_THE_PIPELINES:
        for path in _modules(folder):
            config = {n for n in _imports(path) if n.split(".")[0] in ("omegaconf", "hydra")}
            if config:
                found.append((str(path.relative_to(PACKAGE)), sorted(config)))
    assert not found
