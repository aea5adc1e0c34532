"""The package's layering rules, checked on the source: each module imports only from its own layer and those below
it (`LAYERS`, the one place the order is written), with no import cycle between two names of one layer; report/
renders only; run artifacts parsed only in records/; the config libraries only at the edge."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "llm_perf_opt"
ROOT = "llm_perf_opt"  # the package's own __init__ (`__version__`, `IMPORTED_AT`)
CONFIG_EDGE = ("conf", "config_compose", "config_data", "gpu_claim", "output_settings", "override_keys")

#: The layers, high to low (docs/architecture.md, "The layers"). Each name is a folder under src/llm_perf_opt or a
#: root-level module. A module imports from its own layer and the layers below it, never from one above; two names
#: of one layer may import each other only one way round.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("cli",),  # entry points
    ("pipeline",),  # what each command does, step by step
    CONFIG_EDGE,  # root modules that compose or read the Hydra config, for cli/ and pipeline/
    ("session", "nsight", "report"),  # run the model; run and read the profilers; render records
    ("instruments",),  # drive the model or the device (a session reached through Protocols): timing, profiler, passes
    ("analytic",),  # FLOPs and bytes from the config, priced
    ("measure",),  # the analyses: pure functions of records (no torch at module level, no instrument, no session)
    ("hardware", "data", "models"),  # datasheet peaks; inputs; model implementations
    (  # root modules every layer above may use
        "artifacts",
        "compile_options",
        "env_info",
        "heavy_imports",
        "interrupts",
        "kernel_names",
        "override_text",
        "parent_death",
        "process_end",
        "progress",
        "resources",
        "config_schema",
        "settings_schema",
        "setting_kinds",
        "time_ledger",
    ),
    ("records",),  # typed records, saved and loaded
    ("errors", ROOT),  # the floor: import nothing from the package
)
RANK = {name: rank for rank, layer in enumerate(LAYERS) for name in layer}


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


def _name(path: Path) -> str:
    """The layer name `path` belongs to: its folder under the package, or its own name at the root."""
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else ROOT if parts[0] == "__init__.py" else path.stem


def _imported_names(source: str, package: tuple[str, ...]) -> Iterator[tuple[int, str]]:
    """(line, layer name) of each import of the package in `source`, a module of `package` (its dotted parts): every
    import statement, at the top, in a function or under `if TYPE_CHECKING:`; relative ones resolved;
    `from llm_perf_opt import artifacts` names artifacts."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            module = ".".join(part for part in (base, node.module) if part)
            modules = [f"{module}.{alias.name}" for alias in node.names] if module == ROOT else [module]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if parts[0] == ROOT:
                yield node.lineno, parts[1] if len(parts) > 1 and parts[1] in RANK else ROOT


def _edges() -> dict[tuple[str, str], list[str]]:
    """(importer's name, imported name) -> where: every import from one layer name to another."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        importer = _name(path)
        package = (ROOT, *path.relative_to(PACKAGE).parent.parts)
        for line, imported in _imported_names(path.read_text(encoding="utf-8"), package):
            if imported != importer:
                edges.setdefault((importer, imported), []).append(f"{path.relative_to(PACKAGE)}:{line}")
    return edges


def test_every_folder_and_root_module_has_one_layer() -> None:
    names = {_name(path) for path in PACKAGE.rglob("*.py")}
    placed = [name for layer in LAYERS for name in layer]
    assert len(placed) == len(set(placed)), "a name is in two layers"
    assert names == set(placed), ("not placed:", sorted(names - set(placed)), "gone:", sorted(set(placed) - names))


def _shown(name: str) -> str:
    return f"{name}/" if (PACKAGE / name).is_dir() else "__init__.py" if name == ROOT else f"{name}.py"


def test_nothing_imports_from_a_higher_layer() -> None:
    upward = [
        f"{where} imports {_shown(imported)}, a layer above {_shown(importer)}"
        for (importer, imported), places in sorted(_edges().items())
        if RANK[imported] < RANK[importer]
        for where in places
    ]
    assert not upward, "\n".join(upward)


def test_no_import_cycle_within_a_layer() -> None:
    """Names of one layer import each other one way round only (as hardware/ and measure/ once did not)."""
    within: dict[str, set[str]] = {}
    for importer, imported in _edges():
        if RANK[importer] == RANK[imported]:
            within.setdefault(importer, set()).add(imported)

    def reaches(start: str, goal: str) -> bool:
        seen: set[str] = set()
        todo = [start]
        while todo:
            name = todo.pop()
            if name == goal:
                return True
            if name not in seen:
                seen.add(name)
                todo.extend(within.get(name, ()))
        return False

    cycles = sorted({tuple(sorted((a, b))) for a, targets in within.items() for b in targets if reaches(b, a)})
    assert not cycles, cycles


def test_the_walk_sees_lazy_type_checking_relative_and_package_imports() -> None:
    """Every import statement counts, whatever runs it: a lazy one in a function, one only for type checkers."""
    source = """
from typing import TYPE_CHECKING
from llm_perf_opt import IMPORTED_AT, artifacts
if TYPE_CHECKING:
    from llm_perf_opt.session.session import InferenceSession
def later():
    import llm_perf_opt.report.markdown
    from ..records import io
    from . import timing
"""
    found = {name for _, name in _imported_names(source, (ROOT, "instruments"))}
    assert found == {ROOT, "artifacts", "session", "report", "records", "instruments"}


#: Libraries that drive a device or a model: an analysis (measure/) imports none of them where its module loads.
DRIVERS = ("torch", "nvtx", "pynvml", "transformers")


def _loaded_imports(source: str) -> Iterator[tuple[int, str]]:
    """(line, module) of each import that runs when `source` is imported: at the top or in a class body, including
    under `try:`/`if`, but not inside a function or under `if TYPE_CHECKING:`."""

    def walk(body: list[ast.stmt]) -> Iterator[tuple[int, str]]:
        for node in body:
            if isinstance(node, ast.Import):
                yield from ((node.lineno, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                yield node.lineno, node.module
            elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                yield from walk(node.orelse)
            elif isinstance(node, ast.If | ast.Try | ast.With | ast.ClassDef):
                for field in ("body", "orelse", "finalbody", "handlers"):
                    for child in getattr(node, field, []):
                        yield from walk(child.body if isinstance(child, ast.ExceptHandler) else [child])

    yield from walk(ast.parse(source).body)


def _drivers_loaded(source: str) -> list[str]:
    return [f"{line}: {module}" for line, module in _loaded_imports(source) if module.split(".")[0] in DRIVERS]


def test_analyses_import_no_torch_where_they_load() -> None:
    """measure/ holds the analyses, pure functions of records: re-rendering and judging a saved folder must not
    pay for torch. A module that drives the model or the device belongs in instruments/ (a tensor's type alone is
    imported under `if TYPE_CHECKING:`, a tensor saved or loaded imports torch in its function)."""
    found = [
        f"{path.relative_to(PACKAGE)}:{where}"
        for path in _modules("measure")
        for where in _drivers_loaded(path.read_text(encoding="utf-8"))
    ]
    assert not found, found


def test_the_torch_check_sees_top_level_imports_and_skips_lazy_and_type_checking_ones() -> None:
    source = """
from typing import TYPE_CHECKING
import numpy
from torch import nn
try:
    import pynvml
except ImportError:
    pynvml = None
if TYPE_CHECKING:
    import torch
else:
    import transformers
def later():
    import torch
"""
    assert _drivers_loaded(source) == ["4: torch", "6: pynvml", "12: transformers"]


def test_analyses_import_neither_instruments_nor_session() -> None:
    """The layer order says so already; this names the rule the split of measure/ rests on, and fails on a
    wrong-way import even if `LAYERS` were reordered."""
    found = [
        f"{path.relative_to(PACKAGE)}:{line} imports {name}/"
        for path in _modules("measure")
        for line, name in _imported_names(path.read_text(encoding="utf-8"), (ROOT, "measure"))
        if name in ("instruments", "session", "pipeline", "cli")
    ]
    assert not found, found


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


#: The folders below the config edge: they never see an omegaconf node or Hydra.
BELOW_THE_CONFIG_EDGE = tuple(
    name for layer in LAYERS[RANK["config_compose"] + 1 :] for name in layer if (PACKAGE / name).is_dir()
)


def test_nothing_below_the_config_edge_imports_the_config_libraries() -> None:
    """Settings are parsed once at the edge (cli/, pipeline/, the config modules at the root) into typed records;
    the folders below them never see an omegaconf node or Hydra."""
    found = []
    for folder in BELOW_THE_CONFIG_EDGE:
        for path in _modules(folder):
            config = {n for n in _imports(path) if n.split(".")[0] in ("omegaconf", "hydra")}
            if config:
                found.append((str(path.relative_to(PACKAGE)), sorted(config)))
    assert not found


#: The nodes a command reads typed (`config_data.CommandConfig`: `config_schema.Stage1Nodes`, the model, dataset,
#: device, named workload and analytic settings; `WhatIfNodes`): pipeline/ reads them from the typed objects its
#: command built once.
TYPED_NODES = (
    *("run", "infer", "outputs", "runtime", "report", "hardware", "whatif", "whatif_run"),
    *("model", "dataset", "device", "workload_profile", "analytic"),
)
#: Where pipeline/ may still turn a config into typed nodes: a config it composes itself, not its command's.
OWN_COMPOSITIONS = {
    ("pipeline/whatif.py", "validate"),  # each rung's stage1-run overrides, checked before it runs
    ("pipeline/whatif_judge.py", "rejudge"),  # a what-if folder judged again: the config.yaml its run saved
}


def _names_a_config(node: ast.expr) -> bool:
    """Whether `node` is a composed config by its name (`cfg`, `self.cfg`, `run.cfg`, `config`, `command.composed`)."""
    return re.search(r"(^|[._])(cfg|config|composed)$", ast.unparse(node)) is not None


def _typed_key(node: ast.expr) -> bool:
    """Whether `node` is a string naming a typed node or a key in one (`"runtime"`, `"run.cv_warn"`)."""
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.split(".")[0] in TYPED_NODES


def _raw_typed_reads(source: str) -> list[str]:
    """(line: text) of each read of a typed node from a composed config in `source`: `cfg.run...`, `cfg.get("run")`,
    `cfg["runtime"]`, `"report" in cfg`, `OmegaConf.select(cfg, "outputs....")`."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        raw = (
            (isinstance(node, ast.Attribute) and node.attr in TYPED_NODES and _names_a_config(node.value))
            or (isinstance(node, ast.Subscript) and _typed_key(node.slice) and _names_a_config(node.value))
            or (
                isinstance(node, ast.Compare)
                and _typed_key(node.left)
                and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
                and any(_names_a_config(c) for c in node.comparators)
            )
            or (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("get", "select", "pop", "setdefault")
                and any(_typed_key(arg) for arg in node.args)
                and (_names_a_config(node.func.value) or any(_names_a_config(arg) for arg in node.args))
            )
        )
        if raw:
            found.append((node.lineno, ast.unparse(node)))  # type: ignore[attr-defined]
    return [f"{line}: {text}" for line, text in sorted(found)]


def test_the_raw_read_check_sees_every_form_and_spares_typed_reads() -> None:
    source = """
a = cfg.run.cv_warn
b = self.cfg.run.get("data_parallel_baseline")
c = cfg.get("runtime") or {}
d = plain(cfg.report) if "report" in cfg else {}
e = OmegaConf.select(cfg, "outputs.save_predictions")
f = run.cfg["hardware"]
g = nodes.run.cv_warn + session.runtime.batch_size + command.model.name + command.composed.device
h = self.run.cpu_affinity + overrides.get(SHARD_KEY) + cfg.pipeline.torch_profiler.get("top_k")
i = run_cfg.whatif_run.devices + cfg.get("whatif", {}).get("levers") + self.whatif.whatif_run.devices
"""
    assert [line.split(":")[0] for line in _raw_typed_reads(source)] == [
        *("2", "3", "4", "5", "5", "6", "7", "8", "10", "10")
    ]


def test_pipeline_reads_the_typed_nodes_only_from_the_object_its_command_built() -> None:
    """The nodes of `TYPED_NODES` are read typed (`config_data.CommandConfig` and `WhatIfNodes`, built once per
    command in cli/ by `config_data.command_config` and `whatif_nodes`), never from the composed config."""
    found = [
        f"{path.relative_to(PACKAGE)}:{where}"
        for path in [*_modules("pipeline"), PACKAGE / "output_settings.py"]
        for where in _raw_typed_reads(path.read_text(encoding="utf-8"))
    ]
    assert not found, "\n".join(found)


def _typed_nodes_calls(path: Path, builder: str = "stage1_nodes") -> list[str]:
    """The functions of `path` that call `builder` (`stage1_nodes`, `whatif_nodes`; `<module>` at its top level)."""
    callers = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else where
            if isinstance(child, ast.Call) and ast.unparse(child.func).split(".")[-1] == builder:
                callers.append(where)
            visit(child, inner)

    visit(ast.parse(path.read_text(encoding="utf-8")), "<module>")
    return callers


@pytest.mark.parametrize(
    ("builder", "commands"),
    [
        ("command_config", {"stage1": 1, "stage2": 1, "whatif": 2, "analytic": 1}),  # whatif: its check too
        ("stage1_nodes", {}),  # only inside command_config, and where pipeline/ composes a config of its own
        ("whatif_nodes", {"whatif": 2}),  # whatif: its check
    ],
)
def test_each_command_builds_its_typed_nodes_once_in_cli(builder: str, commands: dict[str, int]) -> None:
    calls = {
        (str(path.relative_to(PACKAGE)), caller): True
        for path in PACKAGE.rglob("*.py")
        if path.name != "config_data.py"
        for caller in _typed_nodes_calls(path, builder)
    }
    outside_cli = {key for key in calls if not key[0].startswith("cli/")} - OWN_COMPOSITIONS
    assert not outside_cli, sorted(outside_cli)
    per_command = {command: len(_typed_nodes_calls(PACKAGE / "cli" / f"{command}.py", builder)) for command in commands}
    assert per_command == commands
