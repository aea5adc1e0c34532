"""The commands' own nodes typed in one place (config_schema: stage1-run's, perf-whatif's): the composed config holds
the schema's defaults and the YAML none of them; a key the schema lacks or a value of the wrong type is refused when
the config is composed, and before that, on the command line, with one paragraph; every typed field declares its range
(or is free-form), which SCHEMA takes."""

from __future__ import annotations

import dataclasses
import typing
from importlib.resources import files
from pathlib import Path

import pytest
import yaml
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import group_node, stage1_nodes, whatif_nodes
from llm_perf_opt.config_schema import (
    GROUP_SCHEMAS,
    MODEL_SCHEMAS,
    SCHEMAS,
    Stage1Nodes,
    Stage2ReportSchema,
    Stage2Schema,
    WhatIfNodes,
    WhatIfSchema,
    typed_key,
    typed_kinds,
)
from llm_perf_opt.errors import UserError
from llm_perf_opt.override_keys import check_override_keys
from llm_perf_opt.settings_schema import SCHEMA

NODES = tuple(SCHEMAS["stage1_schema"])
WHATIF_NODES = tuple(SCHEMAS["whatif_schema"])
# Fields whose value is free text or a word checked by its reader (run.cpu_affinity: pin; hardware.peaks:
# check_peaks_setting; run.data_parallel_baseline: a folder or a number; whatif.objective: judging_settings;
# whatif.from_run: advised_plan; whatif.levers: read_levers), so they declare no kind.
FREE = {"run.cpu_affinity", "run.data_parallel_baseline", "report.whatif_dir", "hardware.peaks"}
FREE |= {"whatif.from_run", "whatif.name", "whatif.objective", "whatif.levers"}
# Nsight's own words and paths, passed to nsys and ncu as they are; a Stage 2 mode's name or a folder to rebuild.
FREE |= {f"pipeline.nsys.{key}" for key in ("binary", "sample", "cpuctxsw", "cuda_graph_trace", "capture_range")}
FREE |= {"pipeline.nsys.gpu_metrics_devices", "pipeline.ncu.binary", "stage2.mode", "stage2.rerender"}
# Paths read by the dataset; the analytic page's grids and GPU keys, checked by AnalyticSettings against the model and
# the hardware table.
FREE |= {"dataset.root", "dataset.subset_filelist", "analytic.dtype", "analytic.reference_gpu"}
FREE |= {"analytic.crop_grid", "analytic.tile_sweep", "analytic.grid_sweep"}
# The model's names, paths and backends (read by its adapter and transformers), and its family's own tables.
FREE |= {f"model.{key}" for key in ("name", "adapter", "path", "dtype", "mode", "modes", "preprocess", "architecture")}
FREE |= {f"model.{key}" for key in ("attn_implementation", "experts_implementation", "name_or_path", "config")}
FREE |= {"model.tokenizer", "model.vision_stage_modules", "model.prompt.text"}


def leaves(node: object, prefix: str = "") -> dict[str, object]:
    """The dotted leaf keys of a dataclass or mapping, with their values."""
    items = dataclasses.asdict(node) if dataclasses.is_dataclass(node) else node  # type: ignore[arg-type]
    out: dict[str, object] = {}
    for name, value in items.items():  # type: ignore[union-attr]
        if isinstance(value, dict) and value:
            out.update(leaves(value, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = value
    return out


@pytest.mark.parametrize("config", ["stage1", "stage2", "whatif"])
def test_the_composed_config_holds_the_schemas_defaults(config: str) -> None:
    cfg = compose_config(config)
    defaults = dataclasses.asdict(Stage1Nodes())
    if config == "stage2":
        defaults["report"] = dataclasses.asdict(Stage2ReportSchema())
    assert {node: OmegaConf.to_container(cfg[node], resolve=True) for node in NODES} == defaults
    expected = Stage1Nodes(report=Stage2ReportSchema()) if config == "stage2" else Stage1Nodes()
    assert stage1_nodes(cfg) == expected  # read back typed, as the readers get them
    if config == "whatif":  # perf-whatif's own nodes: the schema's defaults but what the default preset selects
        levers = OmegaConf.to_container(cfg.whatif.levers)
        want = WhatIfNodes(whatif=WhatIfSchema(name="decode", objective="page_latency", levers=levers))
        assert {node: OmegaConf.to_container(cfg[node]) for node in WHATIF_NODES} == dataclasses.asdict(want)
        assert whatif_nodes(cfg) == want  # read back typed, as perf-whatif's pipeline gets them


def test_the_defaults_live_in_the_schema_only() -> None:
    shipped = yaml.safe_load((files("llm_perf_opt") / "conf" / "stage1.yaml").read_text(encoding="utf-8"))
    assert not set(shipped) & set(NODES)
    assert shipped["defaults"][0] == "stage1_schema"  # first: every yaml of the command composes onto it
    whatif = yaml.safe_load((files("llm_perf_opt") / "conf" / "whatif.yaml").read_text(encoding="utf-8"))
    assert not set(whatif) & set(WHATIF_NODES) and whatif["defaults"][:2] == ["stage1", "whatif_schema"]
    stage2 = yaml.safe_load((files("llm_perf_opt") / "conf" / "stage2.yaml").read_text(encoding="utf-8"))
    assert "stage2" not in stage2 and stage2["defaults"][:2] == ["stage1", "stage2_schema"]
    composed = group_node(compose_config("stage2"), "stage2", Stage2Schema)
    assert OmegaConf.to_container(OmegaConf.structured(composed)) == dataclasses.asdict(Stage2Schema())


def test_a_preset_sets_only_what_it_selects() -> None:
    """No preset repeats a default of the schema (`memory_budget_gib: null`, `from_run: null`)."""
    defaults = dataclasses.asdict(WhatIfSchema())
    for preset in (files("llm_perf_opt") / "conf" / "whatif").iterdir():
        keys = yaml.safe_load(preset.read_text(encoding="utf-8"))
        assert {k for k, v in keys.items() if k in defaults and v == defaults[k]} == set(), preset.name


def test_every_typed_field_declares_its_range_and_schema_holds_it() -> None:
    typed = set(leaves(Stage1Nodes())) | set(leaves(WhatIfNodes()))
    typed |= set(leaves(Stage2Schema(), "stage2."))  # stage2-profile's own node
    for model in MODEL_SCHEMAS.values():  # each model family's
        typed |= set(leaves(model(), "model."))
    for group, (_, schema) in GROUP_SCHEMAS.items():  # the typed config groups' keys
        typed |= set(leaves(schema(), f"{group.replace('/', '.')}."))
    kinds = typed_kinds()
    assert set(kinds) == {key for key in typed - FREE if not key.endswith(".sampling")}  # all but the free-form
    assert {key: SCHEMA.get(key) for key in kinds} == kinds  # SCHEMA takes each field's own kind
    stale = {key for key in SCHEMA if key.split(".")[0] in (*NODES, *WHATIF_NODES)} - typed
    assert not stale  # a hand-written SCHEMA key of these nodes that the schema does not have


def _annotation(key: str) -> object:
    """The resolved type of a typed field (`run.device_defaults.cuda.repeats`: DeviceCounts' `int`)."""
    groups = {group.replace("/", "."): schema for group, (_, schema) in GROUP_SCHEMAS.items()}
    if key.startswith("model."):  # the first family's schema that has it
        groups["model"] = next(m for m in MODEL_SCHEMAS.values() if key.split(".")[1] in m.__dataclass_fields__)
    group = next((g for g in groups if key.startswith(f"{g}.")), None)
    node, *path = [group, *key[len(group) + 1 :].split(".")] if group else key.split(".")
    here: typing.Any = {**SCHEMAS["stage1_schema"], **SCHEMAS["whatif_schema"], **SCHEMAS["stage2_schema"], **groups}
    here, default = here[node], None
    for name in path:
        if isinstance(default, dict):  # a map of typed nodes (stage2.modes): the default entry's type
            here, default = type(default[name]), None
            continue
        hint = typing.get_type_hints(here)[name]
        default = next(f for f in dataclasses.fields(here) if f.name == name).default_factory  # type: ignore[misc]
        default = default() if callable(default) else None
        here = next((arg for arg in typing.get_args(hint) if dataclasses.is_dataclass(arg)), hint)
    return hint


def test_a_range_takes_null_exactly_where_its_field_is_optional() -> None:
    """A kind that takes null on a field OmegaConf refuses it for (or the other way round) would let null through
    to the schema's traceback, or refuse a default."""
    nullable = {key: kind.nullable for key, kind in typed_kinds().items() if hasattr(kind, "nullable")}
    for key, takes_null in nullable.items():
        hint = _annotation(key)
        if hint is not typing.Any:  # a word or a number, null included (run.device_defaults.*.max_images)
            assert takes_null == (type(None) in typing.get_args(hint)), key
    assert nullable["run.repeats"] and not nullable["run.batch_size"]


@pytest.mark.parametrize("override", ["run.nonexistent=1", "runtime.kv_cachez=static", "run.batch_size=abc"])
def test_the_schema_refuses_unknown_keys_and_wrong_types_while_composing(override: str) -> None:
    with pytest.raises(ConfigCompositionException):
        compose_config("stage1", override)
    with pytest.raises(UserError, match=override.split("=")[0].replace(".", r"\.")):  # the command's paragraph
        check_override_keys("stage1", [override], command="stage1-run")


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("whatif_run.fork_rungs=often", r"whatif_run\.fork_rungs=often is not true or false"),
        ("whatif_run.near_tie_tolerance=often", r"whatif_run\.near_tie_tolerance=often is out of range"),
        ("whatif.memory_budget_gib=lots", r"whatif\.memory_budget_gib=lots is out of range"),
        ("whatif_run.ladderz=false", r"whatif_run\.ladderz is not a setting of perf-whatif"),
        ("+whatif.objectiv=pages_per_s", r"whatif\.objectiv is not a setting of perf-whatif"),
    ],
)
def test_the_whatif_nodes_refuse_bad_values_in_one_paragraph(override: str, says: str) -> None:
    with pytest.raises(UserError, match=says):
        check_override_keys("whatif", [override], command="perf-whatif")


def test_a_config_file_setting_an_unknown_key_or_a_wrong_type_is_one_paragraph(tmp_path: Path) -> None:
    (tmp_path / "workload").mkdir()
    (tmp_path / "workload" / "typo.yaml").write_text("# @package _global_\nrun:\n  repets: 3\n")
    (tmp_path / "workload" / "word.yaml").write_text("# @package _global_\ninfer:\n  max_new_tokens: many\n")
    own = ("--config-dir", str(tmp_path))
    with pytest.raises(UserError, match=r"run\.repets is not a setting of stage1-run"):
        check_override_keys("stage1", [*own, "workload=typo"], command="stage1-run")
    with pytest.raises(UserError, match=r"a config file sets infer\.max_new_tokens to a value of the wrong type"):
        check_override_keys("stage1", [*own, "workload=word"], command="stage1-run")


def test_every_value_of_a_sweep_over_a_typed_key_is_checked_before_composing() -> None:
    with pytest.raises(UserError, match=r"run\.batch_size=abc is not a whole number"):
        check_override_keys("stage1", ["-m", "run.batch_size=1,abc"], command="stage1-run")
    check_override_keys("stage1", ["-m", "run.batch_size=1,2", "run.repeats=${oc.env:NO_SUCH_VAR,2}"], command="x")


def test_plain_mappings_take_the_schemas_defaults() -> None:
    nodes = stage1_nodes({"runtime": {"kv_cache": "static"}, "run": {"batch_size": 4}})
    assert (nodes.runtime.kv_cache, nodes.run.batch_size) == ("static", 4)
    assert nodes.runtime.compile_mode == Stage1Nodes().runtime.compile_mode and nodes.report.render
    saved = whatif_nodes({"whatif": {}, "whatif_run": {"ladder": False}})  # a saved config.yaml, judged again
    assert not saved.whatif_run.ladder and saved.whatif_run.near_tie_tolerance == 0.01 and saved.whatif.levers == {}


def test_a_typed_setting_cannot_be_deleted_and_says_so() -> None:
    assert typed_key("run.cv_warn") and typed_key("run.device_defaults.cuda.repeats") and typed_key("report.stage1_dir")
    assert typed_key("pipeline.torch_profiler.modules")  # a typed config group's
    assert typed_key("pipeline.nsys.trace") and typed_key("stage2.modes.deep.top_kernels")
    assert not typed_key("model.preprocess.chat_template") and not typed_key("run.nope") and not typed_key("model")
    with pytest.raises(UserError, match=r"~run\.cv_warn would delete a typed setting") as caught:
        check_override_keys("stage1", ["~run.cv_warn"], command="stage1-run")
    assert "Set it instead (run.cv_warn=<value>" in str(caught.value)
    with pytest.raises(UserError, match=r"~run would delete a typed setting"):
        check_override_keys("stage1", ["~run"], command="stage1-run")  # the whole node, not only a field
    check_override_keys("stage1", ["~model.preprocess.chat_template"], command="stage1-run")  # an untyped group's key


@pytest.mark.parametrize(("group", "schema"), list(GROUP_SCHEMAS.items()))
def test_a_typed_group_keeps_its_defaults_in_its_schema(group: str, schema: tuple[str, type]) -> None:
    """Every typed group (dataset; analytic; pipeline/torch_profiler, memory, energy, nsys, ncu): each choice names the
    schema first and sets only what differs from it, the default choice nothing; the composed node is the schema's
    defaults, an override is typed, and a config saved without the node reads back as the defaults."""
    name, cls = schema
    folder = files("llm_perf_opt") / "conf" / group
    choices = {f.name.removesuffix(".yaml"): f for f in folder.iterdir() if f.name.endswith(".yaml")}
    chosen = {"dataset": "samples"}.get(group, "default")  # conf/stage1.yaml's default choice
    defaults = dataclasses.asdict(cls())
    for choice, path in choices.items():
        shipped = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert shipped.pop("defaults") == [name, "_self_"], choice
        assert set(shipped) <= set(defaults) and all(shipped[k] != defaults[k] for k in shipped), choice
        assert not shipped or choice != chosen
    key = group.replace("/", ".")
    field = next(f for f in reversed(dataclasses.fields(cls)) if f.type in ("int", "float"))  # a count or seconds
    cfg = compose_config("stage2", f"{key}.{field.name}=7")  # stage2 holds every typed group
    read = group_node(cfg, key, cls)
    default = group_node(compose_config("stage2"), key, cls)
    assert (
        getattr(read, field.name) == 7
        and dataclasses.replace(read, **{field.name: getattr(default, field.name)}) == default
    )
    assert group_node({}, key, cls) == OmegaConf.to_object(OmegaConf.structured(cls))  # a config saved without it
    shipped_default = OmegaConf.to_container(OmegaConf.select(compose_config("stage2"), key))
    assert shipped_default == dataclasses.asdict(cls())


def test_each_model_config_names_its_familys_schema_and_refuses_another_familys_keys() -> None:
    """conf/model/: a family's config names its schema first (a variant names the config it varies) and sets only
    what differs from the schema's defaults; a key of another family is refused while composing."""
    folder = files("llm_perf_opt") / "conf" / "model"
    choices = {f.name.removesuffix(".yaml"): f for f in folder.iterdir() if f.name.endswith(".yaml")}
    families = set()
    for choice, path in choices.items():
        shipped = yaml.safe_load(path.read_text(encoding="utf-8"))
        first, *rest = shipped.pop("defaults")
        assert rest == ["_self_"] and (first in MODEL_SCHEMAS or first in choices), choice
        schema = MODEL_SCHEMAS.get(first) or MODEL_SCHEMAS[yaml.safe_load(choices[first].read_text())["defaults"][0]]
        defaults = dataclasses.asdict(schema())
        assert set(shipped) <= set(defaults) and all(shipped[k] != defaults[k] for k in shipped), choice
        families.add(schema)
        assert OmegaConf.get_type(compose_config("stage1", f"model={choice}").model) is schema
    assert families == set(MODEL_SCHEMAS.values())
    for override in (
        "model=deepseek_ocr model.config=x",
        "model=hf model.path=x",
        "model=deepseek_ocr2 model.mode=tiny",
    ):
        with pytest.raises(ConfigCompositionException):
            compose_config("stage1", *override.split())
