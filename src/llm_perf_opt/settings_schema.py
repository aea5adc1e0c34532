"""Every setting's range, in one table, checked once when a command's config is composed, before any process or
model starts.

:data:`SCHEMA` maps a dotted key to its kind (`setting_kinds`); :func:`check_settings` checks each key the composed
config holds and raises a :class:`UserError` naming the first bad one. The commands' own nodes (run, infer, outputs,
runtime, report, hardware, whatif, whatif_run) declare each field's kind beside its type and default in `config_schema`,
and SCHEMA takes them from there (`typed_kinds`), as it does those of the typed config groups (model, dataset, analytic,
pipeline/torch_profiler, pipeline/memory, pipeline/energy, pipeline/nsys, pipeline/ncu) and of stage2-profile's `stage2`
node; the keys of the model's family tables (`model.preprocess`), `device` and Hydra's output folders have theirs here.
`override_keys` checks a command line's values of typed keys before composing, so a bad one is this paragraph, never the
schema's traceback. The readers (the typed settings records of each stage) use the same checks (`errors.require_*`), so
a value is read one way everywhere. Torch-free: `cli/common.launch` runs it before Hydra starts, and each command again
on its composed config (so a sweep's job refuses its own bad value into its failed folder). A check that needs more than
the value (the model's positions) is a cross check at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Final

from llm_perf_opt.config_schema import typed_kinds
from llm_perf_opt.errors import UserError, require_whole
from llm_perf_opt.setting_kinds import DeviceName, Flag, Kind, OutputFolder, Whole

if TYPE_CHECKING:
    from omegaconf import DictConfig

#: Every checked setting of every command: dotted key -> kind. A command's config holds some of them; the others
#: are not checked for it. Open maps (what-if levers, inductor options) are checked by their readers.
SCHEMA: Final[Mapping[str, Kind]] = {
    # the model's family tables (free-form mappings in its schema)
    "model.preprocess.min_tiles": Whole(1),
    "model.preprocess.max_tiles": Whole(1),
    "model.preprocess.chat_template": Flag(),
    "model.preprocess.max_prompt_tokens": Whole(1, nullable=True),
    **typed_kinds(),  # the commands' own nodes: each field's kind from config_schema
    # where a command runs (its session checks that the device exists) and writes (hydra's own keys: composed with
    # return_hydra_config)
    "device": DeviceName(),
    "hydra.run.dir": OutputFolder(),
    "hydra.sweep.dir": OutputFolder(),
}

Select = Callable[[str], object]  # a key's value in the composed config (MISSING when it has none)
MISSING: Final = object()


def check_settings(select: Select) -> None:
    """Each SCHEMA key the config holds (`select`: its value, or MISSING), then the checks across keys: a bad
    value is a UserError naming the key and its fix."""
    for key, kind in SCHEMA.items():
        value = select(key)
        if value is not MISSING:
            kind.check(key, value)
    _check_decode_length(select)


def _check_decode_length(select: Select) -> None:
    """infer.max_new_tokens within the positions the model's decoder takes (when its config says)."""
    positions = select("model.architecture.text_config.max_position_embeddings")
    tokens = select("infer.max_new_tokens")
    if positions is MISSING or tokens in (MISSING, None) or not isinstance(positions, int):
        return
    if require_whole("infer.max_new_tokens", tokens, 1) > positions:
        raise UserError(
            f"infer.max_new_tokens={tokens} is more than the model takes: its decoder has {positions:,} positions "
            "(max_position_embeddings), prompt included",
            f"Set infer.max_new_tokens below {positions:,}",
        )


def check_config(cfg: DictConfig) -> None:
    """`check_settings` over a composed config (a DictConfig; an interpolation that cannot be resolved here, such
    as Hydra's own `${now:...}` outside a run, is left to the command)."""
    from omegaconf import Container, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    def select(key: str) -> object:
        try:
            value = OmegaConf.select(cfg, key, default=MISSING)
        except OmegaConfBaseException:
            return MISSING
        return OmegaConf.to_container(value, resolve=True) if isinstance(value, Container) else value

    check_settings(select)
