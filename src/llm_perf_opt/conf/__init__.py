"""The package's Hydra configs. Importing this package (Hydra does, to read `pkg://llm_perf_opt.conf`, in every
process that composes one, a launcher's workers too) registers the typed schemas of `config_schema` in Hydra's
ConfigStore, under the names the configs' defaults lists use (`stage1_schema`, `stage2_schema`, `whatif_schema`; in
their groups `memory_schema`, ...; each model family's, `deepseek_ocr_schema`, ...)."""

from hydra.core.config_store import ConfigStore

from llm_perf_opt.config_schema import SCHEMAS, group_schemas

for _name, _nodes in SCHEMAS.items():
    ConfigStore.instance().store(name=_name, node=_nodes)
for _group, _name, _schema in group_schemas():
    ConfigStore.instance().store(group=_group, name=_name, node=_schema)
